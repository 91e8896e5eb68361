#!/usr/bin/env bash
# `gpuenv check --profile quick` against its floor on the GPU machine: the smallest DDP job a user
# could launch the same way (benchmarks/ddp_floor_job.py under torchrun, 2 ranks as the check runs
# them on this machine's GPUs), from a provisioned-like venv and from the machine's own Python,
# RUNS times each in turn (default 5), after one untimed warm-up of each.
#
#   bash benchmarks/gpu_machine_floor.sh      # from the repository root, with the machine's python3
#
# The venv (/tmp/gpuenv-venv) holds the closure of torch, CuPy, numpy, mpi4py, nvidia-ml-py,
# rich, PyYAML and Jinja2 from the machine's site-packages, their Python sources copied (the
# shared libraries linked) and compiled, and gpuenv installed from this checkout's wheel: like
# the cluster venv the gpu_env role provisions, where pip writes every module's bytecode.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/gpuenv-out}
RUNS=${RUNS:-5}
REPO=$PWD
mkdir -p "$OUT"
# shellcheck source=benchmarks/stage_gpuenv.sh disable=SC1091
. "$REPO/benchmarks/stage_gpuenv.sh"
# Out of the staged folder: `python -m` puts the working folder first on sys.path, and the venv
# must import its own gpuenv.
cd "$(mktemp -d)" || exit 2
machine=$(command -v python3)
venv=/tmp/gpuenv-venv
rm -rf "$venv"
t0=$(date +%s)
"$machine" "$REPO/benchmarks/python_gap.py" lean --copy "$venv" torch cupy-cuda13x numpy mpi4py \
  nvidia-ml-py rich pyyaml jinja2 packaging 2>&1 | tail -1 | tee "$OUT/floor.txt"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$machine" -m pip install -q --disable-pip-version-check --no-deps --no-index --target "$site" \
  "$REPO"/.whl/gpuenv-*.whl
PYTHONDONTWRITEBYTECODE='' "$venv/bin/python" -m compileall -q -j 0 "$site" >/dev/null 2>&1
echo "venv built and compiled in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/floor.txt"
gpus=$(nvidia-smi -L | wc -l)
nproc=$(( gpus >= 2 ? gpus : 2 ))
job="$REPO/benchmarks/ddp_floor_job.py"

timed() {  # LABEL PYTHONPATH-or-empty COMMAND...: one timed run, one line
  local label=$1 path=$2 t0 t1 rc
  shift 2
  t0=$(date +%s%N)
  PYTHONPATH=$path "$@" >"$OUT/$label.log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  printf '%-14s rc=%s wall=%.2fs  %s\n' "$label" "$rc" "$(( (t1 - t0) / 1000000 ))e-3" \
    "$(tail -1 "$OUT/$label.log")" | tee -a "$OUT/floor.txt"
}
floor() {  # PYTHON
  "$1" -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node "$nproc" \
    --max-restarts 0 "$job"
}
# Warm-up: the machine's Python fills gpuenv's bytecode cache; nothing else is timed here.
timed warm-machine "$GPUENV_LIB" "$machine" -m gpuenv check --profile quick
timed warm-venv "" "$venv/bin/python" -m gpuenv check --profile quick
for i in $(seq "$RUNS"); do
  timed "floor-venv-$i" "" floor "$venv/bin/python"
  timed "check-venv-$i" "" "$venv/bin/python" -m gpuenv check --profile quick --json "$OUT/check-venv-$i.json"
  timed "floor-mach-$i" "" floor "$machine"
  timed "check-mach-$i" "$GPUENV_LIB" "$machine" -m gpuenv check --profile quick --json "$OUT/check-mach-$i.json"
done
"$machine" - "$OUT" <<'PY' 2>&1 | tee -a "$OUT/floor.txt"
import glob, json, re, statistics, sys
out = sys.argv[1]
text = open(f"{out}/floor.txt").read()
for what in ("floor-venv", "check-venv", "floor-mach", "check-mach"):
    walls = [float(w) for w in re.findall(rf"^{what}-\d+\s+rc=0 wall=([\d.]+)s", text, re.M)]
    if walls:
        print(f"{what}: {len(walls)} runs with rc 0, min {min(walls):.2f} / median"
              f" {statistics.median(walls):.2f} / max {max(walls):.2f} s")
for path in sorted(glob.glob(f"{out}/check-*.json")):
    report = json.load(open(path))
    took = {r["check"]: round(r.get("duration_s") or 0, 2) for r in report["results"]}
    ddp = next((r for r in report["results"] if r["check"] == "ddp"), {})
    print(path.rsplit("/", 1)[1], report["verdict"]["ok"], took, "ddp timeline:",
          ddp.get("details", {}).get("timeline_s"))
PY
