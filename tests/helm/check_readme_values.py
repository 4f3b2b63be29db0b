"""The chart README's values table lists every key of values.yaml, and nothing else.

    check_readme_values.py VALUES.yaml README.md

Keys whose value is one Kubernetes-shaped object (resources, security contexts, probe
timings) or a free map (profiles) are listed whole, not key by key.
"""

import re
import sys

import yaml

LISTED_WHOLE = {
    "profiles",
    "resources",
    "podSecurityContext",
    "containerSecurityContext",
    "probes.startup",
    "probes.liveness",
    "probes.readiness",
    "bridge.profiles",
    "bridge.resources",
    "metrics.grafanaDashboard.labels",
}


def keys(values, prefix=""):
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value and path not in LISTED_WHOLE:
            yield from keys(value, path)
        else:
            yield path


def main():
    values_path, readme_path = sys.argv[1:3]
    with open(values_path) as f:
        want = set(keys(yaml.safe_load(f)))
    with open(readme_path) as f:
        listed = set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", f.read(), re.M))
    missing, unknown = sorted(want - listed), sorted(listed - want)
    if missing or unknown:
        sys.exit(f"README values table: missing {missing}, not in values.yaml {unknown}")
    print(f"    the chart README's values table lists all {len(want)} keys of values.yaml")


if __name__ == "__main__":
    main()
