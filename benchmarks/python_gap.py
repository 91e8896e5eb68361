"""Why one Python starts a DDP worker seconds slower than another with the same torch.

    python3 benchmarks/python_gap.py lean DIR REQ...      # a venv of REQ's closure (symlinks)
    python3 benchmarks/python_gap.py lean --copy DIR REQ...  # sources copied, the rest linked
    python3 benchmarks/python_gap.py measure [--runs N] [--label L=PYTHON[:ENV=V,...]]...

``lean`` builds, from the running interpreter's site-packages, a venv holding only the
distributions REQ needs (their requirements' closure, markers evaluated), each linked, not copied:
the same files and versions as the big environment, in a small one, like the cluster venv the
``gpu_env`` role provisions. ``measure`` starts each interpreter RUNS times and prints, per phase
of a DDP worker's start-up (the interpreter, ``import torch``, the CUDA context, ``import
torch._dynamo``, one DDP step of a one-rank gloo group), the median and the range; then the
bytecode facts (is ``PYTHONDONTWRITEBYTECODE`` set, how many of torch's modules have a cached
.pyc) and, from ``-X importtime``, the top-level packages whose import takes longest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

WORKER = r"""
import json, os, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
cuda = torch.cuda.is_available()
if cuda:
    torch.cuda.set_device(0)
    torch.cuda.synchronize()
t2 = time.perf_counter()
import torch._dynamo
t3 = time.perf_counter()
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
model = DistributedDataParallel(torch.nn.Linear(256, 256).to(dev))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model(torch.ones(8, 256, device=dev)).sum().backward()
opt.step()
if cuda:
    torch.cuda.synchronize()
dist.destroy_process_group()
t4 = time.perf_counter()
print("GAP " + json.dumps({"import torch": t1 - t0, "CUDA context": t2 - t1,
      "import torch._dynamo": t3 - t2, "DDP step": t4 - t3}))
"""

FACTS = r"""
import importlib.metadata as md, importlib.util, json, os, sys
spec = importlib.util.find_spec("torch")
root = os.path.dirname(spec.origin)
tag = sys.implementation.cache_tag
py = cached = 0
for folder, _dirs, files in os.walk(root):
    for f in files:
        if f.endswith(".py"):
            py += 1
            pyc = os.path.join(folder, "__pycache__", f"{f[:-3]}.{tag}.pyc")
            if sys.pycache_prefix:
                pyc = os.path.join(sys.pycache_prefix, folder.lstrip("/"), f"{f[:-3]}.{tag}.pyc")
            cached += os.path.exists(pyc)
print(json.dumps({
    "python": sys.version.split()[0], "prefix": sys.prefix,
    "distributions": len({d.metadata["Name"] for d in md.distributions()}),
    "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE"),
    "dont_write_bytecode": sys.flags.dont_write_bytecode,
    "pycache_prefix": sys.pycache_prefix,
    "torch": root, "torch writable": os.access(root, os.W_OK),
    "torch .py files": py, "with a cached .pyc": cached,
}))
"""


def closure(requirements: list[str]) -> list[str]:
    """The distributions ``requirements`` need in this interpreter, markers evaluated."""
    import importlib.metadata as md

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found: dict[str, md.Distribution] = {}
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in found:
            continue
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            print(f"lean: {req.name} is not installed here; left out", file=sys.stderr)
            continue
        found[name] = dist
        for text in dist.requires or []:
            sub = Requirement(text)
            if sub.marker is None or sub.marker.evaluate({"extra": ""}):
                todo.append(sub)
    return sorted(found)


def _copy_py_link_rest(src: str, dst: str) -> None:
    """copytree's copy function for ``lean --copy``: Python sources are copied, so that their
    bytecode is written beside the copy; everything else (the shared libraries) is linked."""
    if src.endswith(".py"):
        shutil.copy2(src, dst)
    else:
        os.symlink(src, dst)


def lean(target: Path, requirements: list[str], copy: bool = False) -> None:
    import importlib.metadata as md

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    here = Path(sysconfig.get_paths()["purelib"])
    ask = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    there = Path(
        subprocess.run(
            [str(target / "bin" / "python"), "-c", ask], check=True, capture_output=True, text=True
        ).stdout.strip()
    )
    linked = 0
    for name in closure(requirements):
        dist = md.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in sorted(tops):
            src, dst = here / top, there / top
            if src.exists() and not dst.exists() and top != "__pycache__":
                if copy and src.is_dir():
                    shutil.copytree(src, dst, symlinks=True, copy_function=_copy_py_link_rest,
                                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
                else:
                    dst.symlink_to(src)
                linked += 1
    names = closure(requirements)
    print(f"lean: {target}: {len(names)} distributions, {linked} links: {' '.join(names)}")


def run_one(
    python: str, env: dict[str, str], code: str, *flags: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, *flags, "-c", code], capture_output=True, text=True, env=env,
                          timeout=600, check=False)  # fmt: skip


def import_top(python: str, env: dict[str, str], top: int = 12) -> list[tuple[str, float]]:
    """Self time of ``import torch, torch._dynamo`` by top-level package, longest first."""
    done = run_one(python, env, "import torch, torch._dynamo", "-X", "importtime")
    totals: dict[str, float] = {}
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _cumulative, name = line[len("import time:") :].split("|", 2)
        name = name.strip()
        top_name = name.split(".")[0]
        totals[top_name] = totals.get(top_name, 0.0) + int(self_us) / 1e6
    return sorted(totals.items(), key=lambda kv: -kv[1])[:top]


def measure(labels: list[str], runs: int) -> None:
    for spec in labels:
        label, _, rest = spec.partition("=")
        python, _, extra = rest.partition(":")
        env = dict(os.environ)
        for pair in filter(None, extra.split(",")):
            key, _, value = pair.partition("=")
            env[key] = value
        facts = run_one(python, env, FACTS)
        print(f"\n== {label}: {python} {extra}")
        print(f"   facts: {facts.stdout.strip() or facts.stderr.strip()[-400:]}")
        phases: dict[str, list[float]] = {}
        walls = []
        for _ in range(runs):
            t = time.perf_counter()
            done = run_one(python, env, WORKER)
            walls.append(time.perf_counter() - t)
            line = next((x for x in done.stdout.splitlines() if x.startswith("GAP ")), None)
            if line is None:
                print(f"   run failed: rc {done.returncode}: {done.stderr.strip()[-600:]}")
                continue
            for key, value in json.loads(line[4:]).items():
                phases.setdefault(key, []).append(value)
        inner = [sum(v) for v in zip(*phases.values(), strict=True)] if phases else []
        startup = [w - i for w, i in zip(walls, inner, strict=False)]
        for key, values in [("interpreter and exit", startup), *phases.items(), ("wall", walls)]:
            if values:
                spread = f"range {min(values):.2f}-{max(values):.2f} s  (n={len(values)})"
                print(f"   {key:22s} median {statistics.median(values):6.2f} s  {spread}")
        top = import_top(python, env)
        print("   -X importtime, self time by top-level package (one run): "
              + ", ".join(f"{name} {sec:.2f}" for name, sec in top))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p_lean = sub.add_parser("lean")
    p_lean.add_argument("dir", type=Path)
    p_lean.add_argument("requirements", nargs="+")
    p_lean.add_argument(
        "--copy", action="store_true", help="copy the sources (their bytecode lands in DIR)"
    )
    p_measure = sub.add_parser("measure")
    p_measure.add_argument("--runs", type=int, default=3)
    p_measure.add_argument("--label", action="append", required=True,
                           help="NAME=PYTHON[:VAR=VALUE,...] (repeat)")  # fmt: skip
    args = parser.parse_args()
    if args.what == "lean":
        lean(args.dir, args.requirements, args.copy)
    else:
        measure(args.label, args.runs)


if __name__ == "__main__":
    main()
