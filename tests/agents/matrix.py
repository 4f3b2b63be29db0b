#!/usr/bin/env python3
"""The compatibility matrix of the agents stage, from the outcomes tests/agents wrote.

    matrix.py RESULTS_DIR COMMIT OUT.md [DOC.md]

Reads every `<agent>@<version>.<scenario>.json` in RESULTS_DIR (one JSON object each: agent,
package, version, scenario, result, detail, sandboxed), writes the matrix as Markdown to OUT.md and prints
it; with DOC.md, also replaces the part of DOC.md between its `<!-- agents-matrix:begin -->` and
`<!-- agents-matrix:end -->` lines. Exits 1 when a result file is unreadable or a cell failed.
"""

import datetime
import json
import pathlib
import sys

# The scenarios in the order of the matrix's columns, with their headings.
SCENARIOS = [
    ("preset_command", "the preset's own command (npx, offline)"),
    ("modes", "asks before editing (preset) / not (profile override)"),
    ("permission_turn", "permission held, answered"),
    ("permission_rule", "permission by rule"),
    ("stop_then_next_prompt", "stop, then next prompt"),
    ("model_error_401", "model API 401, then next prompt"),
    ("model_error_429", "model API 429, then next prompt"),
    ("model_error_500", "model API 500, then next prompt"),
    ("model_500_default_retries", "model API 500 with the agent's own retries: how long, how many requests"),
    ("without_a_key", "no API key"),
    ("model_switch", "model switch"),
    ("kill_9_then_reopen", "kill -9, reopen"),
    ("fork", "fork"),
    ("model_proxy", "through the model proxy: key swapped, usage from the wire = the fake's, in GetUsage"),
    ("drained_right_after_a_turn", "harness drained right after a turn (×10)"),
    ("killed_right_after_a_turn", "harness killed -9 right after a turn (×10)"),
    ("owner_killed_shared_home", "two replicas, owner killed (shared HOME)"),
    ("owner_killed_home_per_replica", "two replicas, owner killed (a HOME per replica)"),
    ("acp_client_permission", "driven by acpx through `agent-harness acp`, permission"),
]

BEGIN = "<!-- agents-matrix:begin -->"
END = "<!-- agents-matrix:end -->"


# Scenarios run only for some agents, and why the others' cells are empty.
ONLY_FOR = {
    "drained_right_after_a_turn": "run for claude-0.23.1, whose session files are written lazily",
    "killed_right_after_a_turn": "run for claude-0.23.1, whose session files are written lazily",
    "owner_killed_shared_home": "run for claude-0.23.1",
    "owner_killed_home_per_replica": "run for claude-0.23.1",
    "acp_client_permission": "run for the newest claude-agent-acp",
}


def cell(scenario, outcome):
    if outcome is None:
        why = ONLY_FOR.get(scenario)
        return f"not run ({why})" if why else "not run"
    detail = outcome.get("detail", "").replace("|", "\\|").replace("\n", " ")
    result = outcome["result"]
    if result == "pass":
        return f"pass ({detail})" if detail else "pass"
    if result == "known-defect":
        return f"**fail** (known agent defect: {detail})"
    if result == "not-supported":
        return f"not supported by the agent ({detail})" if detail else "not supported by the agent"
    return f"**FAIL** ({detail})"


def main():
    results_dir, commit, out = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])
    doc = pathlib.Path(sys.argv[4]) if len(sys.argv) > 4 else None
    rows = {}
    for path in sorted(results_dir.glob("*.json")):
        outcome = json.loads(path.read_text())
        key = (outcome["agent"], outcome["package"], outcome["version"])
        rows.setdefault(key, {})[outcome["scenario"]] = outcome
    if not rows:
        print(f"no results in {results_dir}", file=sys.stderr)
        return 1
    date = datetime.date.today().isoformat()
    lines = [
        f"Run on {date}, harness commit `{commit}`, inside a network namespace with only loopback.",
        "",
        "| agent | version | sandboxed | " + " | ".join(title for _, title in SCENARIOS) + " |",
        "|---|---|---|" + "---|" * len(SCENARIOS),
    ]
    failed = False
    for (agent, package, version), outcomes in sorted(rows.items()):
        cells = []
        for scenario, _ in SCENARIOS:
            outcome = outcomes.get(scenario)
            failed |= outcome is not None and outcome["result"] == "fail"
            cells.append(cell(scenario, outcome))
        boxed = {o.get("sandboxed", False) for o in outcomes.values()}
        sandboxed = {frozenset([True]): "yes, every scenario", frozenset([False]): "no"}.get(
            frozenset(boxed), "in some scenarios"
        )
        lines.append(
            f"| {agent} (`{package}`) | {version} | {sandboxed} | " + " | ".join(cells) + " |"
        )
    table = "\n".join(lines) + "\n"
    out.write_text(table)
    print(table)
    if doc is not None and doc.is_file():
        text = doc.read_text()
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            _, tail = rest.split(END, 1)
            doc.write_text(f"{head}{BEGIN}\n{table}{END}{tail}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
