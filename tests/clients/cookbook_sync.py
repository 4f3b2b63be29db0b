"""Pastes each file of docs/cookbook/ into docs/cookbook.md again, in the block after its
`<!-- the file PATH, verbatim -->` marker. The clients stage fails when the page and the files
differ; run this after editing a recipe:  python3 tests/clients/cookbook_sync.py"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "cookbook.md"
BLOCK = re.compile(r"(<!-- the file (\S+), verbatim -->\n```[a-z]*\n)(.*?)(```)", re.S)

PAGE.write_text(BLOCK.sub(lambda m: m.group(1) + (ROOT / m.group(2)).read_text() + m.group(4), PAGE.read_text()))
