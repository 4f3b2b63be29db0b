"""Regenerates the committed stubs in src/agent_harness_client/v1/ from proto/ (grpcio-tools).

    python clients/python/generate.py [OUT_DIR]   # default: the package's own v1/ directory

protoc names modules after the .proto paths (`agent_harness.v1`); the stubs live inside this
package instead, so their imports of each other are rewritten to `agent_harness_client.v1`.
`scripts/test clients` runs this into a temporary directory and diffs it with the committed copy.
"""

import pathlib
import re
import sys
import tempfile

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROTO = ROOT / "proto"
PACKAGE_V1 = pathlib.Path(__file__).resolve().parent / "src" / "agent_harness_client" / "v1"


def main() -> None:
    out = pathlib.Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else PACKAGE_V1
    out.mkdir(parents=True, exist_ok=True)
    protos = sorted(str(p.relative_to(PROTO)) for p in (PROTO / "agent_harness" / "v1").glob("*.proto"))
    with tempfile.TemporaryDirectory() as work:
        include = pathlib.Path(protoc.__file__).parent / "_proto"
        code = protoc.main(
            ["protoc", f"-I{PROTO}", f"-I{include}", f"--python_out={work}", f"--pyi_out={work}",
             f"--grpc_python_out={work}", *protos]
        )
        if code != 0:
            sys.exit(f"protoc failed with {code}")
        for generated in sorted((pathlib.Path(work) / "agent_harness" / "v1").iterdir()):
            text = generated.read_text()
            text = re.sub(r"\bfrom agent_harness\.v1 import\b", "from agent_harness_client.v1 import", text)
            (out / generated.name).write_text(text)
    init = out / "__init__.py"
    init.write_text('"""Generated from proto/agent_harness/v1 by generate.py: do not edit."""\n')


if __name__ == "__main__":
    main()
