#!/usr/bin/env bash
# Training traffic against a bulk flow, with and without the net_qos role (docs/benchmarks.md):
# a torch gloo all-reduce between two lab nodes (as the cluster user) alone and then beside an
# iperf3 bulk flow from node1 to node2 (as root), first with a plain HTB root at the same total rate
# (one class for everything: the "without net_qos" case) and then with the net_qos role applied.
# Docker's veths run at tens of Gbit/s and CPU-bound here, so both cases shape node egress to
# the same modest total rate: the link is then the bottleneck, as a real NIC is.
#
#   gpuenv lab up --name qos --nodes 2 --distro bookworm --net-admin
#   benchmarks/net_qos.sh            # GPUENV_QOS_RATE_MBIT=200 GPUENV_QOS_MIB=16 GPUENV_QOS_ITERS=20
#
# Needs torch's CPU wheel for Python 3.11 under .cache/lab/qos-wheels (pip download -c
# constraints.txt -d .cache/lab/qos-wheels torch). Exit 1 when the all-reduce with net_qos keeps
# less than 80 % of its solo busbw.
set -euo pipefail
cd "$(dirname "$0")/.."
lab=${GPUENV_QOS_LAB:-qos}
rate=${GPUENV_QOS_RATE_MBIT:-200}
mib=${GPUENV_QOS_MIB:-16}
iters=${GPUENV_QOS_ITERS:-20}
inv=inventory/lab-$lab/hosts.yml
n1=$lab-node1 n2=$lab-node2
wheels=.cache/lab/qos-wheels
# shellcheck disable=SC1091
[ -n "${VIRTUAL_ENV:-}" ] || . .venv/bin/activate
export ANSIBLE_CONFIG="$PWD/ansible.cfg"
[ -f "$inv" ] || { echo "net_qos: no lab $lab (gpuenv lab up --name $lab --nodes 2 --distro bookworm --net-admin)" >&2; exit 2; }
ls "$wheels"/torch-*.whl >/dev/null 2>&1 || { echo "net_qos: no torch wheel in $wheels" >&2; exit 2; }
addr() { docker inspect -f "{{(index .NetworkSettings.Networks \"$lab-net\").IPAddress}}" "$1"; }
ip1=$(addr "$n1") ip2=$(addr "$n2")

echo "net_qos: setting up $n1 ($ip1) and $n2 ($ip2)"
for n in "$n1" "$n2"; do
  docker exec "$n" sh -c 'id gpuenv >/dev/null 2>&1 || useradd -m -u 1001 gpuenv'
  docker exec "$n" sh -c 'command -v iperf3 >/dev/null && python3 -c "import torch" 2>/dev/null' || {
    docker exec -e DEBIAN_FRONTEND=noninteractive "$n" sh -c \
      'apt-get -qq update && apt-get -qq install -y iperf3 python3-pip >/dev/null'
    docker cp "$wheels" "$n:/opt/qos-wheels"
    docker exec "$n" python3 -m pip install -q --break-system-packages --no-index \
      --find-links /opt/qos-wheels torch
  }
  docker cp benchmarks/net_qos/allreduce_gloo.py "$n:/opt/allreduce_gloo.py"
done
docker exec "$n2" sh -c 'pgrep -x iperf3 >/dev/null || iperf3 -s -D'

allreduce() {
  docker exec -u gpuenv -e GLOO_SOCKET_IFNAME=eth0 "$n2" \
    timeout 300 python3 -W ignore /opt/allreduce_gloo.py 1 2 "$ip1" --mib "$mib" --iters "$iters" &
  local peer=$!
  docker exec -u gpuenv -e GLOO_SOCKET_IFNAME=eth0 "$n1" \
    timeout 300 python3 -W ignore /opt/allreduce_gloo.py 0 2 "$ip1" --mib "$mib" --iters "$iters" |
    python3 -c 'import json,sys; print(round(json.load(sys.stdin)["busbw_mb_s"], 1))'
  wait "$peer"
}
# Prints the all-reduce's busbw beside the bulk flow; the bulk flow's Mbit/s goes to $bulk_file.
bulk_file=.cache/lab/net_qos-bulk.txt
contended() {
  docker exec "$n1" sh -c "iperf3 -c $ip2 -t 300 -P 4 -J >/tmp/iperf3.json 2>&1 & echo \$! >/tmp/iperf3.pid"
  sleep 3
  allreduce
  docker exec "$n1" sh -c 'kill -INT "$(cat /tmp/iperf3.pid)" 2>/dev/null; sleep 2'
  # The bulk flow's mean over the seconds it ran (it starts 3 s before the all-reduce).
  docker exec "$n1" python3 -c 'import json; d = json.load(open("/tmp/iperf3.json"))
rates = [i["sum"]["bits_per_second"] for i in d["intervals"]]
print(round(sum(rates) / len(rates) / 1e6))' >"$bulk_file" 2>/dev/null || echo "?" >"$bulk_file"
}
plain() {
  for n in "$n1" "$n2"; do
    docker exec "$n" sh -c "tc qdisc replace dev eth0 root handle 1: htb default 20 &&
      tc class add dev eth0 parent 1: classid 1:1 htb quantum 60000 rate ${rate}mbit ceil ${rate}mbit &&
      tc class add dev eth0 parent 1:1 classid 1:20 htb quantum 60000 rate ${rate}mbit ceil ${rate}mbit"
  done
}
unshape() {
  for n in "$n1" "$n2"; do docker exec "$n" sh -c 'tc qdisc del dev eth0 root 2>/dev/null || true'; done
}
role() {
  local log=.cache/lab/net_qos-role-$1.log
  ansible-playbook -i "$inv" playbooks/qos.yml -e "net_qos_enabled=$1" -e "net_qos_rate_mbit=$rate" \
    >"$log" 2>&1 || { tail -20 "$log" >&2; exit 1; }
}
ratio() { python3 -c "print(f'{$2 / $1:.2f}')"; }

echo "net_qos: without net_qos: plain HTB root at $rate Mbit/s, one class for all traffic"
role false
unshape
plain
plain_solo=$(allreduce)
plain_busy=$(contended)
plain_bulk=$(cat "$bulk_file")
unshape
echo "net_qos: with net_qos: net_qos_rate_mbit=$rate, training 80 %, users [gpuenv], ports [29500]"
role true
qos_solo=$(allreduce)
qos_busy=$(contended)
qos_bulk=$(cat "$bulk_file")
role false

echo
echo "gloo all-reduce ${mib} MiB x ${iters}, 2 lab nodes, egress shaped to ${rate} Mbit/s; busbw MB/s"
printf '%-16s %10s %16s %8s %18s\n' case solo "beside iperf3" kept "iperf3 mean Mbit/s"
printf '%-16s %10s %16s %8s %18s\n' "without net_qos" "$plain_solo" "$plain_busy" \
  "$(ratio "$plain_solo" "$plain_busy")" "$plain_bulk"
printf '%-16s %10s %16s %8s %18s\n' "with net_qos" "$qos_solo" "$qos_busy" \
  "$(ratio "$qos_solo" "$qos_busy")" "$qos_bulk"
python3 -c "import sys; sys.exit(0 if $qos_busy >= 0.8 * $qos_solo else 1)"
