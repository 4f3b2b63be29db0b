"""A minimal PEP 517 build backend for this one package: it zips src/agent_harness_client into a
wheel with the metadata of pyproject.toml. It exists so that installing needs no build tool from
the network (setuptools, hatchling, …): `pip install ./clients/python` works offline."""

import base64
import hashlib
import io
import os
import pathlib
import tarfile
import zipfile

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    tomllib = None

HERE = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = "agent_harness_client"


def _project():
    text = (HERE / "pyproject.toml").read_text()
    if tomllib is not None:
        return tomllib.loads(text)["project"]
    # A fallback for old Pythons: the few keys this file uses, read line by line.
    project, deps, in_deps = {}, [], False
    for line in text.splitlines():
        line = line.strip()
        if in_deps:
            if line == "]":
                in_deps = False
            elif line:
                deps.append(line.strip('",'))
        elif line.startswith("dependencies = ["):
            in_deps = True
        elif " = " in line and line.split(" = ")[0] in ("name", "version", "description", "requires-python"):
            key, value = line.split(" = ", 1)
            project[key] = value.strip('"')
    project["dependencies"] = deps
    return project


def _metadata():
    p = _project()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {p['name']}",
        f"Version: {p['version']}",
        f"Summary: {p.get('description', '')}",
        f"Requires-Python: {p.get('requires-python', '>=3.9')}",
    ]
    lines += [f"Requires-Dist: {dep}" for dep in p.get("dependencies", [])]
    readme = HERE / "README.md"
    if readme.exists():
        lines += ["Description-Content-Type: text/markdown", "", readme.read_text()]
    return "\n".join(lines) + "\n"


def _dist_info():
    p = _project()
    return f"{p['name'].replace('-', '_')}-{p['version']}"


def _record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def _files():
    root = HERE / "src"
    for path in sorted((root / PACKAGE).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            yield path.relative_to(root).as_posix(), path.read_bytes()


def _write_wheel(directory, files):
    name = _dist_info()
    wheel = f"{name}-py3-none-any.whl"
    info = f"{name}.dist-info"
    entries = list(files)
    entries.append((f"{info}/METADATA", _metadata().encode()))
    entries.append(
        (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: agent-harness-client/_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    )
    record = "".join(f"{path},{_record_hash(data)}\n" for path, data in entries) + f"{info}/RECORD,,\n"
    entries.append((f"{info}/RECORD", record.encode()))
    with zipfile.ZipFile(os.path.join(directory, wheel), "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in entries:
            archive.writestr(zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, _files())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # An editable install: a .pth file pointing at src/.
    return _write_wheel(wheel_directory, [(f"{PACKAGE}.pth", f"{HERE / 'src'}\n".encode())])


def build_sdist(sdist_directory, config_settings=None):
    name = _dist_info()
    sdist = f"{name}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, sdist), "w:gz") as archive:
        for path in ["pyproject.toml", "README.md", "_build/backend.py"]:
            archive.add(HERE / path, arcname=f"{name}/{path}")
        for path, _ in _files():
            archive.add(HERE / "src" / path, arcname=f"{name}/src/{path}")
        info = tarfile.TarInfo(f"{name}/PKG-INFO")
        data = _metadata().encode()
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return sdist
