#!/usr/bin/env bash
# The main job on the embedded default: a 3-node local lab, site.yml on it (whose last stage
# validates the cluster), and the outcome. Re-running reuses the lab and the caches.
#   GPUENV_DEMO_NODES=3 GPUENV_DEMO_DISTRO=trixie scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=${GPUENV_DEMO_NODES:-3}
distro=${GPUENV_DEMO_DISTRO:-bookworm}

scripts/host-prereqs.sh
scripts/venv.sh
# shellcheck disable=SC1091
. .venv/bin/activate
export ANSIBLE_CONFIG="$PWD/ansible.cfg"

echo "demo: bringing up a ${nodes}-node ${distro} lab"
gpuenv lab up --nodes "$nodes" --distro "$distro"
gpuenv lab status

echo "demo: ansible-playbook site.yml -i inventory/lab/hosts.yml"
t0=$SECONDS
if ansible-playbook site.yml -i inventory/lab/hosts.yml; then
  echo "demo: OK: site.yml converged and validated the ${nodes}-node lab in $((SECONDS - t0))s"
  echo "demo: try: gpuenv lab ssh node1   |   tear down: gpuenv lab down"
else
  rc=$?
  echo "demo: FAILED: site.yml exited $rc after $((SECONDS - t0))s (the recap above names the host and task)" >&2
  exit "$rc"
fi
