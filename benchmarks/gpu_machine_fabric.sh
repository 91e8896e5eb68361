#!/usr/bin/env bash
# The fabric reader and the fabric-aware checks on a real GPU node (issue 21 item 7): the
# floor's fabric reader (gpuenv.floor.fabric.read, with NVML's NVLink counts and the spec
# table's link count, as the checks hand them in) timed over RUNS reads, its findings printed;
# then `gpuenv check --profile quick --json` whose `system` (NVLink rule) and `fabric` results
# are printed. No false alarm on healthy hardware is the expectation: the script exits 1 when
# the check's verdict is not OK or the reader's time per read is not under a second.
#
#   OUT=/tmp/fabric-out RUNS=20 bash benchmarks/gpu_machine_fabric.sh
#
# gpuenv comes from its wheel (benchmarks/stage_gpuenv.sh); the node's python3 carries pynvml.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/fabric-out}
RUNS=${RUNS:-20}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# shellcheck source=benchmarks/stage_gpuenv.sh
. "$(dirname "$0")/stage_gpuenv.sh"
export PYTHONPATH=$GPUENV_LIB
rc=0
python3 - "$RUNS" >"$OUT/reader.txt" 2>&1 <<'EOF' || rc=1
import json, statistics, subprocess, sys, time

import pynvml

from gpuenv.checks.thresholds import load_specs
from gpuenv.floor import fabric


def run(argv, timeout_s):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        return 127, ""
    except subprocess.TimeoutExpired:
        return 124, ""
    return p.returncode, p.stdout


t0 = time.perf_counter()
nvlink, names = {}, {}
try:
    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
except pynvml.NVMLError as e:
    print(f"NVML: {e} (no NVLink counts handed to the reader)")
    count = 0
for i in range(count):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    bus = pynvml.nvmlDeviceGetPciInfo(h).busId
    bus = bus.decode() if isinstance(bus, bytes) else bus
    names[bus] = pynvml.nvmlDeviceGetName(h)
    active = total = 0
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            state = pynvml.nvmlDeviceGetNvLinkState(h, link)
        except pynvml.NVMLError as e:
            print(f"GPU{i} link {link}: NVML says {e}")
            break
        total += 1
        active += int(state == pynvml.NVML_FEATURE_ENABLED)
    nvlink[bus] = (active, total)
nvml_s = time.perf_counter() - t0
model_links = {pid: row["nvlink_links"] for row in load_specs()["models"]
               if row.get("nvlink_links") for pid in row.get("pci_ids") or []}
times = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    f = fabric.read("/", run, nvlink=nvlink, model_links=model_links)
    times.append(time.perf_counter() - t)
print("NVML names:", names, f"(NVML NVLink reads {nvml_s * 1000:.1f} ms)")
print("NVML NVLink (active, total) by bus id:", nvlink)
print(json.dumps(f.as_dict(), indent=1, default=str)[:6000])
derived = fabric.derive(f)
print("derived NCCL settings:", derived.as_dict() if hasattr(derived, "as_dict") else derived)
med = statistics.median(times)
print(f"RESULT fabric.read: min {min(times) * 1000:.2f} ms, median {med * 1000:.2f} ms,"
      f" max {max(times) * 1000:.2f} ms over {len(times)} reads; {len(f.gpus)} GPU(s),"
      f" {len(f.ports)} RDMA port(s), {len(f.nvswitches)} NVSwitch(es)")
sys.exit(0 if med < 1.0 else 1)
EOF
cat "$OUT/reader.txt"
t0=$(date +%s%N)
(cd "$GPUENV_LIB" && python3 -m gpuenv check --profile quick --json "$OUT/check.json") \
  >"$OUT/check.txt" 2>&1
crc=$?
t1=$(date +%s%N)
tail -25 "$OUT/check.txt"
echo "RESULT gpuenv check --profile quick: exit $crc in $(( (t1 - t0) / 1000000 )) ms"
python3 - "$OUT/check.json" <<'EOF' || rc=1
import json, sys
report = json.load(open(sys.argv[1]))
results = report.get("results") or []
for r in results:
    if r.get("check") in ("system", "fabric", "nccl"):
        print(f"RESULT {r.get('check')}: {r.get('status')} - {r.get('reason')}")
verdict = report.get("verdict") or {}
print("RESULT verdict:", verdict if isinstance(verdict, str) else json.dumps(verdict)[:400])
EOF
[ "$crc" -eq 0 ] || rc=1
exit "$rc"
