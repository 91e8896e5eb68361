"""Which libnccl torch and CuPy load, and its version: ``python -m gpuenv.doctor.nccl_probe``.

gpuenv.doctor.nccl (class 9) runs it in the node's Python. Each framework is imported in a
process of its own (``python -m gpuenv.doctor.nccl_probe torch``): in one process the second
would reuse the libnccl.so.2 the first loaded (the loader shares a soname), hiding a
difference. Without an argument it prints one JSON object, a framework's answer under its name:
``{"version", "paths"}`` (the NCCL version it reports, the libnccl files mapped into it) or
``{"error"}``. With a framework's name, that framework's answer alone.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from gpuenv import proc

MODULE = "gpuenv.doctor.nccl_probe"
FRAMEWORKS = ("torch", "cupy")
# One framework's import and NCCL query (torch takes seconds to import; a broken CUDA can hang).
FRAMEWORK_DEADLINE_S = 25.0
_ERROR_CHARS = 200


def _error(what: str, why: object) -> dict[str, Any]:
    return {"error": f"{what}: {str(why)[:_ERROR_CHARS]}"}


def mapped_nccl() -> list[str]:
    """The libnccl files mapped into this process."""
    with open("/proc/self/maps", encoding="utf-8") as fh:
        return sorted({line.split()[-1] for line in fh if "libnccl" in line and "/" in line})


def loaded(framework: str) -> dict[str, Any]:
    """Import ``framework`` in this process: the NCCL version it reports and the files mapped."""
    try:
        if framework == "torch":
            import torch

            v = torch.cuda.nccl.version()
            version = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        else:
            from cupy.cuda import nccl

            n = nccl.get_version()
            version = f"{n // 10000}.{n // 100 % 100}.{n % 100}"
        return {"version": version, "paths": mapped_nccl()}
    except Exception as exc:  # a framework missing or broken is its answer, not the probe's end
        return _error(type(exc).__name__, exc)


def each_alone(
    frameworks: tuple[str, ...] = FRAMEWORKS, deadline_s: float = FRAMEWORK_DEADLINE_S
) -> dict[str, Any]:
    """Every framework's answer, each from a process of its own under a deadline."""
    out: dict[str, Any] = {}
    for framework in frameworks:
        try:
            done = proc.capture([sys.executable, "-m", MODULE, framework], deadline_s)
        except OSError as exc:
            out[framework] = _error(type(exc).__name__, exc)
            continue
        if done.returncode is None:
            out[framework] = _error("TimeoutExpired", f"no answer within {deadline_s:g} s")
            continue
        lines = done.stdout.strip().splitlines()
        try:
            out[framework] = json.loads(lines[-1])
        except (IndexError, ValueError):
            tail = " ".join(done.stderr.strip().splitlines()[-2:])
            out[framework] = _error(
                "NoAnswer", f"{proc.describe_exit(done.returncode)}, no JSON printed: {tail}"
            )
    return out


def main(argv: list[str]) -> int:
    answer = loaded(argv[0]) if argv else each_alone()
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
