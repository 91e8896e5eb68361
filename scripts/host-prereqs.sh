#!/usr/bin/env bash
# Make sure this controller has what the lab needs: a running Docker engine and debootstrap.
# As root on Debian/Ubuntu it installs Debian's docker.io and debootstrap and starts dockerd;
# otherwise it says exactly what is missing and exits 1.
# If it starts dockerd itself it writes the pid to .cache/dockerd.pid, so a caller can stop it.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v docker >/dev/null 2>&1 || missing+=(docker.io)
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
# mpi4py's wheel loads libmpi at run time.
ldconfig -p 2>/dev/null | grep -q 'libmpi\.so' || missing+=(libopenmpi-dev)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u | sed '/^$/d')

is_debian_root() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }

if [ "${#missing[@]}" -gt 0 ]; then
  if is_debian_root; then
    echo "host-prereqs: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" ca-certificates >/dev/null
  else
    echo "host-prereqs: missing: ${missing[*]}" >&2
    echo "host-prereqs: install them, e.g.: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

if ! docker info >/dev/null 2>&1; then
  if is_debian_root && command -v dockerd >/dev/null 2>&1; then
    echo "host-prereqs: starting dockerd"
    mkdir -p .cache
    nohup dockerd >.cache/dockerd.log 2>&1 &
    echo $! >.cache/dockerd.pid
    for _ in $(seq 1 60); do
      docker info >/dev/null 2>&1 && break
      sleep 0.5
    done
    docker info >/dev/null 2>&1 || { echo "host-prereqs: dockerd did not start; see .cache/dockerd.log" >&2; exit 1; }
  else
    echo "host-prereqs: the Docker engine is not running. Start it: sudo systemctl start docker" >&2
    echo "host-prereqs: (or, without systemd: sudo dockerd &)" >&2
    exit 1
  fi
fi
