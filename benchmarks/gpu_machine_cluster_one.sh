#!/usr/bin/env bash
# `gpuenv cluster --profile quick` on the GPU machine as a one-node cluster, RUNS times (default
# 3): the probe, then the health scan and the node's GPU checks at the same time (the pipeline's
# TOGETHER step), judged by the one-node rules (the multi-node stages excused).
#
#   python3 -m pip download -q --no-deps -d .whl/ans ansible-core==2.19.14 resolvelib \
#       cryptography cffi pycparser --python-version 3.12 --only-binary :all:   # on the controller
#   python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl .             # on the controller
#   bash benchmarks/gpu_machine_cluster_one.sh       # on the GPU machine, from the repository root
#
# The GPU machine has no Ansible; gpuenv cluster reads the inventory with ansible-inventory, so
# ansible-core comes as wheels (.whl/ans) and goes into a temporary folder.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/gpuenv-out}
RUNS=${RUNS:-3}
REPO=$PWD
mkdir -p "$OUT"
# shellcheck source=benchmarks/stage_gpuenv.sh disable=SC1091
. "$REPO/benchmarks/stage_gpuenv.sh"
ans=$(mktemp -d)
python3 -m pip install -q --disable-pip-version-check --no-index --no-deps --target "$ans" \
  "$REPO"/.whl/ans/*.whl || exit 2
export PYTHONPATH=$GPUENV_LIB:$ans PATH=$ans/bin:$PATH
cd "$(mktemp -d)" || exit 2
cat > inv.yml <<'YML'
all:
  vars:
    ansible_connection: local
    gpuenv_cluster_python: python3
  hosts:
    gpu0:
      gpuenv_cluster_env: {NCCL_NVLS_ENABLE: "0", TORCH_SYMM_MEM_DISABLE_MULTICAST: "1", NVSHMEM_DISABLE_NVLS: "1"}
YML
for i in $(seq "$RUNS"); do
  t0=$(date +%s%N)
  python3 -m gpuenv cluster -i inv.yml --profile quick --no-progress --json "$OUT/cluster-$i.json" \
    >"$OUT/cluster-$i.log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  printf 'one-node cluster, run %s: rc=%s wall=%.2fs\n' "$i" "$rc" "$(( (t1 - t0) / 1000000 ))e-3"
  grep -E "^(PASS|FAIL|ERROR|SKIP)|^verdict|PASS, .* in [0-9.]+s" "$OUT/cluster-$i.log" | cut -c1-240
done
