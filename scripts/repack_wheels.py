#!/usr/bin/env python3
"""Turn the distributions installed in a Python environment back into wheels (a wheelhouse).

    python3 scripts/repack_wheels.py OUT_DIR [--only NAME ...] [--python-path SITE ...]

For air-gapped machines that already hold a working stack (torch, CuPy, mpi4py built against the
local MPI …) but no wheel files: the wheelhouse lets `gpu_env` install the same versions into the
cluster virtual environment with `--no-index --find-links OUT_DIR`. Each wheel is made from the
distribution's RECORD (the files pip installed) and its WHEEL tags, stored uncompressed so that
multi-GB packages repack in seconds. Files RECORD places outside site-packages (console scripts)
are left out; pip writes new entry-point scripts from entry_points.txt on install.
Exit 0 when every selected distribution was repacked, 1 when some could not be, 2 on bad input.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib.metadata as metadata
import io
import re
import sys
import zipfile
from pathlib import Path


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def wheel_tag(dist: metadata.Distribution) -> str:
    """The compressed tag set of the distribution's WHEEL file, e.g. py2.py3-none-any for the tags
    py2-none-any and py3-none-any (py3-none-any when it has none)."""
    text = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]
    parts: list[list[str]] = [[], [], []]
    for tag in tags:
        for seen, part in zip(parts, tag.split("-", 2), strict=False):
            if part not in seen:
                seen.append(part)
    return "-".join(".".join(p) for p in parts) if tags else "py3-none-any"


def repack(dist: metadata.Distribution, out_dir: Path) -> Path:
    """Write one wheel for dist into out_dir and return its path."""
    name = dist.metadata["Name"]
    version = dist.version
    files = dist.files
    if not name or files is None:
        raise ValueError(f"{name or dist}: no RECORD, cannot tell which files belong to it")
    base = Path(str(dist.locate_file("")))
    stem = f"{re.sub(r'[-.]+', '_', name)}-{version}-{wheel_tag(dist)}"
    target = out_dir / f"{stem}.whl"
    record_rows: list[tuple[str, str, str]] = []
    record_name = ""
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_STORED) as wheel:
        for item in files:
            rel = item.as_posix()
            if rel.startswith("..") or rel.startswith("/") or "__pycache__" in rel:
                continue
            # Only the distribution's own top-level .dist-info is metadata; packages vendor
            # others' .dist-info folders inside their own tree (setuptools/_vendor/…).
            top, _, leaf = rel.partition("/")
            if top.endswith(".dist-info") and "/" not in leaf:
                if leaf == "RECORD":
                    record_name = rel
                    continue
                if leaf in ("INSTALLER", "REQUESTED", "direct_url.json"):
                    continue
            path = base / rel
            if not path.is_file():
                continue
            data = path.read_bytes()
            wheel.writestr(rel, data)
            record_rows.append((rel, _record_hash(data), str(len(data))))
        if not record_name:
            raise ValueError(f"{name} {version}: RECORD lists no .dist-info/RECORD")
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerows([*record_rows, (record_name, "", "")])
        wheel.writestr(record_name, buffer.getvalue())
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--only", nargs="*", default=[], help="distribution names (default: all)")
    parser.add_argument(
        "--python-path", nargs="*", default=None, help="site-packages folders (default: sys.path)"
    )
    args = parser.parse_args(argv)
    dists = {
        _normalize(d.metadata["Name"]): d
        for d in metadata.distributions(path=args.python_path or sys.path)
        if d.metadata["Name"]
    }
    wanted = [_normalize(n) for n in args.only] or sorted(dists)
    missing = [n for n in wanted if n not in dists]
    if missing:
        print(f"repack_wheels: not installed here: {', '.join(missing)}", file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    for key in wanted:
        try:
            made = repack(dists[key], args.out_dir)
        except (OSError, ValueError) as exc:
            failed += 1
            print(f"repack_wheels: {key}: {exc}", file=sys.stderr)
            continue
        print(f"{made.name} {made.stat().st_size // 1024} KiB")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
