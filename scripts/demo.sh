#!/usr/bin/env bash
# The main job on the embedded default: a 3-node local lab, site.yml on it (whose last stage
# validates the cluster), and the outcome. Re-running reuses the lab and the caches.
#   GPUENV_DEMO_NODES=3 GPUENV_DEMO_DISTRO=trixie scripts/demo.sh
#   GPUENV_MIRROR=tuna scripts/demo.sh     (a mirror preset: official, tuna, ustc, aliyun)
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=${GPUENV_DEMO_NODES:-3}
distro=${GPUENV_DEMO_DISTRO:-bookworm}
# The mirror preset (the sources floor's table): checked before anything runs; pip on this
# machine takes its index from it, and `gpuenv lab up` reads GPUENV_MIRROR itself (debootstrap,
# then the roles' apt and pip through gpuenv_sources_preset in the lab's inventory).
if [ -n "${GPUENV_MIRROR:-}" ]; then
  pip_index=$(python3 scripts/mirror.py "$GPUENV_MIRROR" pip) || exit 2
  if [ "$GPUENV_MIRROR" != official ]; then
    export PIP_INDEX_URL="$pip_index"
    echo "demo: mirror preset $GPUENV_MIRROR (pip index $PIP_INDEX_URL)"
  fi
fi

scripts/host-prereqs.sh
scripts/venv.sh
# shellcheck disable=SC1091
. .venv/bin/activate
export ANSIBLE_CONFIG="$PWD/ansible.cfg"

case "$distro" in
  bookworm) pins=inventory/pins/debian-12.yml ;;
  trixie) pins=inventory/pins/debian-13.yml ;;
  *) echo "demo: GPUENV_DEMO_DISTRO must be bookworm or trixie, not '$distro'" >&2; exit 2 ;;
esac
extra=(-e "@$pins")
if [ "$distro" = bookworm ]; then
  # Debian 12 nodes run Python 3.11, for which the CPU build of torch lies on this machine:
  # the lab's wheelhouse serves it, so DDP (gloo) runs across the lab nodes. The rest of the
  # cluster venv (gpu_env_packages) too: fetched once here, not by each node.
  mkdir -p .cache/lab/wheels
  python -m pip download -q -c constraints.txt -d .cache/lab/wheels torch numpy mpi4py \
    >.cache/lab/wheels.log 2>&1 ||
    { cat .cache/lab/wheels.log >&2; echo "demo: could not fetch torch for the lab wheelhouse" >&2; exit 1; }
  extra+=(-e gpu_env_install_torch=true -e gpu_env_torch_package=torch==2.13.0)
fi

running=$(docker ps --filter label=gpuenv.lab=gpuenv --format '{{.Names}}' | wc -l)
if [ -f inventory/lab/hosts.yml ] && [ "$running" -eq "$nodes" ]; then
  echo "demo: reusing the running ${nodes}-node lab (take it down with: gpuenv lab down)"
else
  [ "$running" -eq 0 ] || gpuenv lab down
  echo "demo: bringing up a ${nodes}-node ${distro} lab"
  gpuenv lab up --nodes "$nodes" --distro "$distro"
fi
gpuenv lab status

echo "demo: ansible-playbook site.yml -i inventory/lab/hosts.yml ${extra[*]}"
t0=$SECONDS
if ansible-playbook site.yml -i inventory/lab/hosts.yml "${extra[@]}"; then
  echo "demo: site.yml converged and validated the ${nodes}-node lab in $((SECONDS - t0))s"
  echo "demo: try: gpuenv lab ssh node1   |   tear down: gpuenv lab down"
  # The verdict of the validate stage, from its report: the lab's nodes have no GPU, and the
  # last line says so.
  python - <<'PY'
import json
v = json.load(open("reports/validate/cluster.json"))["verdict"]
gpu = "GPUs verified" if v["gpu_verified"] else "no GPU verified"
print(f"demo: OK: profile {v['profile']} ({v['node_kind']}-only nodes), required"
      f" {', '.join(v['required'])} passed; {gpu}")
PY
else
  rc=$?
  echo "demo: FAILED: site.yml exited $rc after $((SECONDS - t0))s (the recap above names the host and task)" >&2
  exit "$rc"
fi
