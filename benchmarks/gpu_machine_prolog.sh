#!/usr/bin/env bash
# The Slurm prolog's check on the GPU machine (docs/slurm.md): the command the role's
# /usr/local/sbin/gpuenv-slurm-prolog runs, timed RUNS times (default 20) with a fresh healthy
# verdict in the cache (the usual case: no scan) and RUNS times with no cache (a full scan), with
# the median, p95 and worst of each. The prolog never calls slurmctld; to prove it, `scontrol` on
# PATH is a script that fails loudly. Run from the repository root with the machine's python3;
# gpuenv comes from its wheel (benchmarks/stage_gpuenv.sh).
#
#   bash benchmarks/gpu_machine_prolog.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/gpuenv-out}
RUNS=${RUNS:-20}
mkdir -p "$OUT"
# shellcheck source=benchmarks/stage_gpuenv.sh
. "$(dirname "$0")/stage_gpuenv.sh"
export PYTHONPATH=$GPUENV_LIB
fake=$(mktemp -d)
printf '#!/bin/sh\necho "prolog called scontrol $*" >&2\ntouch %s/called\nexit 1\n' "$fake" \
  >"$fake/scontrol"
chmod +x "$fake/scontrol"
export PATH=$fake:$PATH
cache=$(mktemp -d)/verdict.json
prolog() {
  timeout -k 5 60 python3 -m gpuenv health --prolog --node "$(hostname -s)" --fail-on drain \
    --cache "$cache" --cache-s "$1"
}
stats() {  # stats LABEL FILE: median, p95 (nearest rank) and worst of the times in FILE
  sort -n "$2" | awk -v label="$1" '{t[NR]=$1} END {
    p95 = int(NR * 0.95 + 0.999); if (p95 > NR) p95 = NR
    printf "%-34s n=%d median %.3f s  p95 %.3f s  worst %.3f s\n", label, NR,
      t[int((NR + 1) / 2)], t[p95], t[NR]}' | tee -a "$OUT/prolog.txt"
}
run_n() {  # run_n LABEL CACHE_S SETUP: RUNS timed prolog runs, each after SETUP
  local label=$1 cache_s=$2 setup=$3 i rc t0 t1 times
  times=$(mktemp)
  for i in $(seq "$RUNS"); do
    eval "$setup"
    t0=$(date +%s%N)
    prolog "$cache_s" >>"$OUT/prolog.log" 2>&1
    rc=$?
    t1=$(date +%s%N)
    echo "$label run $i rc=$rc $(( (t1 - t0) / 1000000 )) ms" >>"$OUT/prolog.log"
    [ "$rc" = 0 ] || echo "$label run $i: exit $rc (see prolog.log)" | tee -a "$OUT/prolog.txt"
    echo "$(( (t1 - t0) / 1000000 ))e-3" >>"$times"
  done
  stats "$label" "$times"
}
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$OUT/prolog.txt"
prolog 300 >"$OUT/prolog.log" 2>&1   # the first scan: writes the verdict, warms the page cache
echo "first scan: exit $?" | tee -a "$OUT/prolog.txt"
run_n "cached healthy verdict (no scan)" 300 ":"
run_n "no verdict cached (a full scan)" 300 'rm -f "$cache"'
if [ -e "$fake/called" ]; then
  echo "FAIL: the prolog called scontrol" | tee -a "$OUT/prolog.txt"
else
  echo "scontrol never called" | tee -a "$OUT/prolog.txt"
fi
