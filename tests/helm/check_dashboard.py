"""The chart's Grafana dashboard parses, and every metric its queries name is one the server
exports: a name the code registers (a string literal `agent_harness_…` in src/), or such a name
with the `_bucket`, `_sum` or `_count` suffix of a histogram.

    check_dashboard.py DASHBOARD.json SRC_DIR [METRICS_TEXT]

With METRICS_TEXT (a scrape of a real server's /metrics), every name found there counts as
exported too, and a name the dashboard uses must appear in the code or there.
"""

import json
import pathlib
import re
import sys

NAME = re.compile(r"\bagent_harness_[a-z0-9_]+\b")
SUFFIXES = ("_bucket", "_sum", "_count")


def exported_by_code(src):
    names = set()
    for path in pathlib.Path(src).rglob("*.rs"):
        names.update(re.findall(r'"(agent_harness_[a-z0-9_]+)"', path.read_text()))
    return names


def targets(panels):
    for panel in panels:
        yield from panel.get("targets", [])
        yield from targets(panel.get("panels", []))


def main():
    dashboard_path, src = sys.argv[1:3]
    with open(dashboard_path) as f:
        dashboard = json.load(f)
    exported = exported_by_code(src)
    if len(sys.argv) > 3:
        with open(sys.argv[3]) as f:
            exported.update(NAME.findall(f.read()))
    used = {}
    for target in targets(dashboard.get("panels", [])):
        for name in NAME.findall(target.get("expr", "")):
            used.setdefault(name, []).append(target.get("refId"))
    if not used:
        sys.exit(f"{dashboard_path}: no query names an agent_harness_ metric")
    unknown = []
    for name in sorted(used):
        base = next((name[: -len(s)] for s in SUFFIXES if name.endswith(s)), None)
        if name not in exported and base not in exported:
            unknown.append(name)
    if unknown:
        sys.exit(f"{dashboard_path}: metrics the server does not export: {', '.join(unknown)}")
    print(f"{len(used)} metric names, all exported")


if __name__ == "__main__":
    main()
