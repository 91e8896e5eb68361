"""The user docs name only files that exist in this repository."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(
    [
        *ROOT.glob("README*.md"),
        *ROOT.glob("docs/**/*.md"),
        ROOT / "CONTRIBUTING.md",
        ROOT / "galaxy.yml",
    ]
)
# A repository path the docs name: tests/..., molecule/..., gpuenv/... ending in a file name.
PATH_RE = re.compile(r"(?<![\w./-])((?:tests|molecule|gpuenv|plugins|roles|scripts)/[\w./-]+\.\w+)")


def test_every_test_and_source_path_named_in_the_docs_exists():
    missing = [
        f"{doc.relative_to(ROOT)}: {path}"
        for doc in DOCS
        for path in PATH_RE.findall(doc.read_text())
        if "*" not in path
        and not any((base / path.rstrip(".")).exists() for base in (ROOT, doc.parent))
    ]
    assert not missing, missing


def test_the_docs_point_at_nothing_outside_the_repository():
    outside = [
        f"{doc.relative_to(ROOT)}: {needle}"
        for doc in DOCS
        for needle in ("../shared", "/work/")
        if needle in doc.read_text()
    ]
    assert not outside, outside
