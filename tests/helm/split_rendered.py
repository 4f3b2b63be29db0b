"""Splits `helm template` output into the objects kubernetes-validate has schemas for and the
ServiceMonitors (a CRD, validated separately). Any other kind that is not built into Kubernetes
would be an unvalidated object, so it is an error.

    split_rendered.py RENDERED.yaml CORE.yaml SERVICEMONITORS.json
"""

import json
import sys

import yaml

CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
CORE_GROUPS = {"v1", "apps/v1", "networking.k8s.io/v1", "policy/v1", "autoscaling/v2"}


def main():
    rendered, core_path, monitors_path = sys.argv[1:4]
    with open(rendered) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    core, monitors = [], []
    for doc in docs:
        key = (doc.get("apiVersion"), doc.get("kind"))
        if key in CRD_KINDS:
            monitors.append(doc)
        elif key[0] in CORE_GROUPS:
            core.append(doc)
        else:
            sys.exit(f"{key[0]} {key[1]} has no schema here: add a validator for it")
    with open(core_path, "w") as f:
        yaml.safe_dump_all(core, f, sort_keys=False)
    with open(monitors_path, "w") as f:
        json.dump(monitors, f)
    print(f"{len(core)} {len(monitors)}")


if __name__ == "__main__":
    main()
