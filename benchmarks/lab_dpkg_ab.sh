#!/usr/bin/env bash
# The lab node image's dpkg settings (/etc/dpkg/dpkg.cfg.d/gpuenv-lab: force-unsafe-io, no
# /usr/share/doc, man, info) against plain dpkg, on one lab node, same packages, same hour.
#
#   gpuenv lab up --nodes 1 --distro bookworm --name ab
#   benchmarks/lab_dpkg_ab.sh ab-node1 libboost1.74-dev            # many small files
#   benchmarks/lab_dpkg_ab.sh ab-node1 nvidia-smi libcuda1 libcublas11 libcublaslt11  # needs non-free
#   gpuenv lab down --name ab
#
# The .debs are downloaded first (not timed); then installs alternate plain, lab, lab, plain,
# plain, lab (each pair in both orders, so a load that drifts during the run favours neither), each
# followed by `apt-get purge --autoremove`. Prints one line a run: setting, seconds, load average.
# For packages from non-free, write the node's sources entry first (what the roles write).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 NODE PACKAGE..." >&2
  exit 2
fi
node=$1
shift
docker exec -i "$node" bash -s -- "$@" <<'EOF'
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
cfg=/etc/dpkg/dpkg.cfg.d/gpuenv-lab
[ -f "$cfg" ] || { echo "no $cfg on this node: not a lab node image" >&2; exit 1; }
apt-get update -qq
apt-get install -qq -y --download-only --no-install-recommends "$@" >/dev/null
trap 'if [ -f /root/gpuenv-lab.aside ]; then mv /root/gpuenv-lab.aside "$cfg"; fi' EXIT
for mode in plain lab lab plain plain lab; do
  if [ "$mode" = plain ]; then mv "$cfg" /root/gpuenv-lab.aside; fi
  t0=$(date +%s%N)
  apt-get install -qq -y --no-install-recommends "$@" >/dev/null 2>&1
  t1=$(date +%s%N)
  echo "$mode $(( (t1 - t0) / 1000000 )) ms load $(cut -d' ' -f1 /proc/loadavg)"
  apt-get purge -qq -y --autoremove "$@" >/dev/null 2>&1
  if [ "$mode" = plain ]; then mv /root/gpuenv-lab.aside "$cfg"; fi
done
EOF
