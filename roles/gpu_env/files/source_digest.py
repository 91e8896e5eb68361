"""Print the digest of a gpuenv checkout and the name of the wheel it builds, as JSON; given a
wheel file instead (the one the collection carries), its own digest and name.

Runs on the controller. The digest covers what goes into the wheel, so the wheel is built and
shipped again exactly when the checkout changed.
"""

import ast
import hashlib
import json
import sys
from pathlib import Path

import tomllib


def version(root: Path) -> str:
    """The package version: pyproject's, else (dynamic) the __version__ of gpuenv/__init__.py."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    if "version" in project:
        return project["version"]
    tree = ast.parse((root / "gpuenv" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise SystemExit(f"{root}: no version in pyproject.toml nor __version__ in gpuenv/__init__.py")


def main(root: Path) -> None:
    if root.is_file():
        digest = hashlib.sha256(root.read_bytes()).hexdigest()[:16]
        print(json.dumps({"digest": digest, "wheel": root.name}))
        return
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    project = pyproject["project"]
    # The package's folders: gpuenv/ and those pyproject maps into it (the node floor,
    # plugins/module_utils as gpuenv.floor), read from the rule itself, not a copy of it.
    mapped = pyproject.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    folders = ["gpuenv", *sorted(set(mapped.values()))]
    files = [root / "pyproject.toml", root / "README.md", root / "LICENSE"]
    for folder in folders:
        files += sorted(
            p
            for p in (root / folder).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        )
    digest = hashlib.sha256()
    for path in files:
        if path.is_file():
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    name = project["name"].replace("-", "_")
    wheel = f"{name}-{version(root)}-py3-none-any.whl"
    print(json.dumps({"digest": digest.hexdigest()[:16], "wheel": wheel}))


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
