#!/usr/bin/env bash
# site.yml on the GPU machine against itself (local connection, no network), then the cluster
# environment it built: the GPU branch of gpu_env (CuPy, torch in /opt/gpuenv), the login-shell
# environment, `gpuenv check` from that venv, and the node suite (tests/node) with its GPU tests.
#
#   bash benchmarks/gpu_machine_site.sh          # on the GPU machine, from the repository root
#   GPUENV_FRESH=1 bash benchmarks/gpu_machine_site.sh   # first remove what an earlier run wrote
#
# Needs: .whl/gs-ansible (ansible-core and its wheels for the machine's Python) and .whl/gpu-node
# (rich, PyYAML, jinja2, nvidia-ml-py, setuptools, pytest, pytest-testinfra …), both carried; the
# machine's own Python stack (torch, cupy, mpi4py, numpy) is repacked into a wheelhouse by
# scripts/repack_wheels.py, because the machine cannot reach any index. Logs: $OUT/logs.tgz.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/gpuenv-out}
LOG=$(mktemp -d /tmp/gpuenv-logs.XXXX)   # packed into $OUT/logs.tgz at the end
mkdir -p "$OUT"
py=$(command -v python3)
say() { printf '\n== %s (%s)\n' "$*" "$(date +%T)" | tee -a "$LOG/steps.log"; }

say "ansible-core and test tools into /tmp/site"
"$py" -m pip install -q --no-index --find-links .whl/gs-ansible --find-links .whl/gpu-node \
  --target /tmp/site ansible-core setuptools wheel pytest pytest-testinfra >"$LOG/pip-site.log" 2>&1 ||
  { tail -20 "$LOG/pip-site.log"; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH ANSIBLE_CONFIG=$PWD/ansible.cfg

say "wheelhouse /tmp/wh from $($py -c 'import sys; print(sys.prefix)') and .whl/gpu-node"
t0=$SECONDS
rm -rf /tmp/wh   # a warm machine keeps the last run's
env -u PYTHONPATH "$py" scripts/repack_wheels.py /tmp/wh >"$LOG/repack.log" 2>&1
echo "repack rc=$? in $((SECONDS - t0)) s, $(ls /tmp/wh | wc -l) wheels, $(du -sh /tmp/wh | cut -f1)" | tee -a "$LOG/steps.log"
cp .whl/gpu-node/*.whl /tmp/wh/

say "what the machine has (no network: the roles can only find, not fetch)"
dpkg-query -W -f='${Package} ${Status} ${Version}\n' python3-venv python3-dev python3-packaging \
  ca-certificates python3-apt openmpi-bin libopenmpi-dev 2>&1 | tee "$LOG/dpkg.txt"
/usr/bin/python3 -c 'import ensurepip, sys; print("ensurepip in", sys.version.split()[0])' 2>&1 | tee -a "$LOG/dpkg.txt"
command -v mpirun ompi_info | tee -a "$LOG/dpkg.txt"
# The venv's OS packages this offline machine can satisfy (the rest could only come from apt).
osp=$(for p in python3-venv python3-dev python3-packaging ca-certificates; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' && printf '%s, ' "$p"; done)
echo "gpu_env_os_packages: [${osp%, }]" | tee -a "$LOG/steps.log"

cat >/tmp/gpu-inv.yml <<EOF
all:
  hosts:
    gpu0:
      ansible_connection: local
      ansible_host: 127.0.0.1
      ansible_python_interpreter: $py
  vars:
    nvidia_driver_install_method: nvidia_repo
    nvidia_driver_branch: "580"
    cuda_toolkit_install_method: nvidia_repo
    cuda_toolkit_version: "13.0"
    nccl_install_method: pip
    nccl_version: "2.28"
    gpu_env_pip_no_index: true
    gpu_env_pip_find_links: [/tmp/wh]
    gpu_env_install_torch: true
    gpu_env_os_packages: [${osp%, }]
EOF
# The ssh stage needs an SSH server (the machine has none); validate is `gpuenv check` below.
skip=ssh,validate
site() { # name, extra args…
  local name=$1; shift
  say "site.yml $name: --skip-tags $skip $*"
  local t=$SECONDS
  ansible-playbook site.yml -i /tmp/gpu-inv.yml --skip-tags "$skip" "$@" >"$LOG/site-$name.log" 2>&1
  local rc=$?
  echo "site-$name rc=$rc wall=$((SECONDS - t)) s $(grep -E '^gpu0 +:' "$LOG/site-$name.log")" | tee -a "$LOG/steps.log"
  grep -E '^(fatal|failed):' -A3 "$LOG/site-$name.log" | cut -c1-1500 | head -20
  return $rc
}
if [ "${GPUENV_FRESH:-0}" = 1 ]; then
  # A warm machine keeps what the last run wrote: remove it so run1 is a first converge again.
  say "removing what an earlier run of the roles wrote (GPUENV_FRESH=1)"
  rm -rf /opt/gpuenv /opt/nccl /etc/gpuenv /etc/profile.d/gpuenv.sh /etc/environment.d/60-gpuenv.conf \
    /etc/systemd/system.conf.d/60-gpuenv.conf /etc/systemd/user.conf.d/60-gpuenv.conf \
    /etc/openmpi/openmpi-mca-params.conf.gpuenv~ /etc/ansible/facts.d/gpuenv_mpi.fact
  sed -i '/^# BEGIN gpuenv nccl role/,/^# END gpuenv nccl role/d' /etc/nccl.conf 2>/dev/null
  sed -i '/^# BEGIN gpuenv mpi role/,/^# END gpuenv mpi role/d' /etc/openmpi/openmpi-mca-params.conf 2>/dev/null
fi
cp /etc/nccl.conf "$LOG/nccl.conf.before" 2>/dev/null
# Without network the mpi stage can only detect an Open MPI that dpkg knows; if it cannot, the
# other stages still run (and the reason is in site-run1.log).
components="driver, cuda, nccl, mpi, env"
site run1 || { skip=ssh,mpi,validate; components="driver, cuda, nccl, env"; site run1b; }
site run2
site check --check
cp /etc/nccl.conf "$LOG/nccl.conf.after" 2>/dev/null

say "login shell sees the environment and the venv"
bash -lc 'echo CUDA_HOME=$CUDA_HOME; echo PATH=$PATH; echo LD_LIBRARY_PATH=$LD_LIBRARY_PATH; env | grep ^NCCL_ | sort
  command -v python; python -c "import cupy, torch, mpi4py, gpuenv, numpy
print(\"cupy\", cupy.__version__, \"cuda\", cupy.cuda.runtime.runtimeGetVersion(), \"gpus\", cupy.cuda.runtime.getDeviceCount())
print(\"torch\", torch.__version__, \"cuda\", torch.cuda.is_available(), torch.cuda.device_count())
print(\"mpi4py\", mpi4py.__version__, \"numpy\", numpy.__version__)
print(\"sum\", float(cupy.arange(1 << 20, dtype=cupy.float64).sum()))"' >"$LOG/login.log" 2>&1
cat "$LOG/login.log"

say "gpuenv check from /opt/gpuenv"
bash -lc "gpuenv check --profile quick --json $LOG/check.json --junit $LOG/check.xml" >"$LOG/check.log" 2>&1
echo "check rc=$?" | tee -a "$LOG/steps.log"
tail -15 "$LOG/check.log"

# The ssh stage is skipped (no sshd on the machine): gpuenv_components leaves ssh (and mpi when its
# stage could not run) out, and those tests skip saying so.
say "node suite against the same inventory, components: $components"
sed "s/^  vars:$/  vars:\n    gpuenv_components: [$components]/" /tmp/gpu-inv.yml >/tmp/gpu-inv-suite.yml
python3 -m pytest -q -p no:cacheprovider tests/node --hosts=ansible://all --ansible-inventory=/tmp/gpu-inv-suite.yml \
  -rs >"$LOG/node-suite.log" 2>&1
echo "node-suite rc=$?" | tee -a "$LOG/steps.log"
tail -40 "$LOG/node-suite.log"
tar -C "$LOG" -czf "$OUT/logs.tgz" . && ls "$LOG"
