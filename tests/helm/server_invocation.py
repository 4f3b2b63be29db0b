"""From a rendered StatefulSet, the command line to run the same server here, on loopback.

    server_invocation.py RENDERED.yaml DIR

Writes DIR/config.toml (the config the pod would read, from its ConfigMap or Secret) and
DIR/probe-services (the health services the probes ask, one a line), and prints the
container's `serve` arguments one a line, with --config pointing at DIR/config.toml, the
metrics address on loopback, and --listen and --data-dir left out (the caller sets them).
Prints nothing and exits 3 when the config needs files or Secrets that exist only in the
cluster (tokens, TLS, the database URL).
"""

import base64
import sys

import yaml


def main():
    rendered, out = sys.argv[1:3]
    with open(rendered) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    (config,) = [d for d in docs if d["metadata"]["name"].endswith("-config")]
    text = config["data"]["config.toml"]
    if config["kind"] == "Secret":
        text = base64.b64decode(text).decode()
    if any(line.split("=")[0].strip() in ("tokens_file", "tls_cert") for line in text.splitlines()):
        sys.exit(3)
    with open(f"{out}/config.toml", "w") as f:
        f.write(text)
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    if any(e["name"] == "AGENT_HARNESS_DATABASE_URL" for e in container.get("env", [])):
        sys.exit(3)
    with open(f"{out}/probe-services", "w") as f:
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            f.write(container[probe]["grpc"]["service"] + "\n")
    args = container["args"]
    assert args[0] == "serve", args
    for arg in args[1:]:
        name = arg.split("=", 1)[0]
        if name in ("--listen", "--data-dir"):
            continue
        if name == "--config":
            arg = f"--config={out}/config.toml"
        elif name == "--metrics-listen":
            arg = "--metrics-listen=127.0.0.1:0"
        print(arg)


if __name__ == "__main__":
    main()
