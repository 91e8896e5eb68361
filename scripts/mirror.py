#!/usr/bin/env python3
"""Print one URL of a mirror preset, for shell scripts that run before the venv exists.

    scripts/mirror.py PRESET pip|debian

The presets are the sources floor's table (plugins/module_utils/sources.py), loaded by its path
with the standard library only. An unknown preset exits 2 naming it and the valid ones.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

FLOOR = Path(__file__).resolve().parents[1] / "plugins" / "module_utils" / "sources.py"
WHAT = {"pip": ("pypi", "index_url"), "debian": ("debian", "mirror")}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in WHAT:
        print("usage: scripts/mirror.py PRESET pip|debian", file=sys.stderr)
        return 2
    spec = importlib.util.spec_from_file_location("gpuenv_sources_floor", FLOOR)
    assert spec is not None and spec.loader is not None
    sources = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = sources  # dataclasses look their module up while the class is made
    spec.loader.exec_module(sources)
    name = argv[0]
    if name not in sources.PRESETS:
        print(
            f"GPUENV_MIRROR={name!r} is not a known mirror preset;"
            f" valid: {', '.join(sorted(sources.PRESETS))}",
            file=sys.stderr,
        )
        return 2
    section, key = WHAT[argv[1]]
    print(sources.PRESETS[name][section][key])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
