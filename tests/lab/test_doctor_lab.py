"""Against a running lab: `gpuenv doctor -i` finds nothing on the clean nodes, then names four
faults injected into real nodes, each with its node, within 60 s for the whole lab.

Opt-in, because it needs docker, a lab with the NCCL and env stages converged, and gcc on the
controller (it builds the fake driver files):

    GPUENV_LAB_PREFIX=gpuenv-h2 gpuenv lab up --nodes 3 --name doctor
    ansible-playbook -i inventory/lab-doctor/hosts.yml playbooks/nccl.yml playbooks/env.yml \
        -e '{"gpu_env_packages": ["numpy"]}'
    GPUENV_LAB=doctor python -m pytest -q -s tests/lab/test_doctor_lab.py

The faults (each undone at the end, and the lab checked clean again):

* node1: ``NCCL_P2P_DISABLE=1`` appended to /etc/environment;
* node2: a copy of the system libnccl in a folder listed in /etc/ld.so.conf.d (a second NCCL
  on the library path), and a pending driver upgrade, through packages: "nvidia-kernel-lab"
  535.261.03 (an nvidia.ko holding only its .modinfo, for the running kernel) and
  "libnvidia-ml1" 535.261.03 are installed, then libnvidia-ml1 alone is upgraded to
  550.163.01 (a shared object with the real soname; dpkg's log records the upgrade);
* node3: ``NCCL_SOCKET_IFNAME=ib0`` in /etc/nccl.conf (the inventory address is on eth0).
"""

import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time

import pytest

LAB = os.environ.get("GPUENV_LAB", "")
pytestmark = pytest.mark.skipif(
    not LAB, reason="opt-in: set GPUENV_LAB to a running lab with the nccl and env stages"
)
INVENTORY = f"inventory/lab-{LAB}/hosts.yml"
GPUENV = [sys.executable, "-m", "gpuenv"]
BUDGET_S = 60.0
MODINFO_C = """
__attribute__((section(".modinfo"), used)) static const char v[] = "version=535.261.03";
__attribute__((section(".modinfo"), used)) static const char l[] = "license=NVIDIA";
__attribute__((section(".modinfo"), used)) static const char n[] = "name=nvidia";
"""
# Installs the 535 driver (module + user-space library) as packages, then upgrades only the
# user-space package to 550: the module for the running kernel stays 535 (the upgrade built
# none), as after a half-done driver upgrade.
INJECT_DRIVER = r"""
set -e
apt-get install -y -q kmod >/dev/null
k=$(uname -r)
src=/tmp/lab-driver
pkg() { # name version folder
  mkdir -p "$3/DEBIAN"
  printf 'Package: %s\nVersion: %s\nArchitecture: amd64\nMaintainer: lab <lab@localhost>\n' \
    "$1" "$2" > "$3/DEBIAN/control"
  echo 'Description: gpuenv lab fault' >> "$3/DEBIAN/control"
  dpkg-deb --build "$3" "$src/$1_$2.deb" >/dev/null
  dpkg -i "$src/$1_$2.deb" >/dev/null
}
d=$(mktemp -d); mkdir -p $d/lib/modules/$k/updates/dkms
cp $src/nvidia.ko $d/lib/modules/$k/updates/dkms/nvidia.ko
pkg nvidia-kernel-lab 535.261.03-1 $d
for v in 535.261.03 550.163.01; do
  d=$(mktemp -d); mkdir -p $d/usr/lib/x86_64-linux-gnu
  cp $src/libnvidia-ml.so.$v $d/usr/lib/x86_64-linux-gnu/
  ln -s libnvidia-ml.so.$v $d/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
  pkg libnvidia-ml1 $v-1 $d
done
ldconfig
depmod -a $k
modinfo -F version nvidia
"""
INJECT_NCCL = r"""
set -e
lib=$(readlink -f /usr/lib/x86_64-linux-gnu/libnccl.so.2)
mkdir -p /opt/nccl-copy/lib
cp "$lib" /opt/nccl-copy/lib/
ln -sf "$(basename "$lib")" /opt/nccl-copy/lib/libnccl.so.2
echo /opt/nccl-copy/lib > /etc/ld.so.conf.d/zz-nccl-copy.conf
ldconfig
"""
UNDO = {
    1: "sed -i '/^NCCL_P2P_DISABLE=1$/d' /etc/environment",
    2: "rm -rf /opt/nccl-copy /etc/ld.so.conf.d/zz-nccl-copy.conf /tmp/lab-driver; "
    "dpkg -r libnvidia-ml1 nvidia-kernel-lab; ldconfig; depmod -a $(uname -r)",
    3: "sed -i 's/^NCCL_SOCKET_IFNAME=ib0$/NCCL_SOCKET_IFNAME=eth0/' /etc/nccl.conf",
}


def node(n):
    return f"{LAB}-node{n}"


def on_node(n, command, check=True, data=None):
    done = subprocess.run(
        # ssh joins its arguments into one remote command line: quote it as one word
        [*GPUENV, "lab", "ssh", "--name", LAB, node(n), f"sudo bash -c {shlex.quote(command)}"],
        input=data,
        capture_output=True,
        check=False,
    )
    if check:
        assert done.returncode == 0, (n, command, done.stdout, done.stderr)
    return done


def copy_to(n, folder, remote):
    """Unpack the files of ``folder`` into ``remote`` on node ``n``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(folder, arcname=".")
    on_node(n, f"mkdir -p {remote} && tar -C {remote} -xf -", data=buf.getvalue())


def fake_driver_files(tmp_path):
    """An nvidia.ko holding only .modinfo, and two libnvidia-ml builds with the real soname."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed on the controller to build the fake driver files")
    out = tmp_path / "driver"
    out.mkdir()
    (tmp_path / "nvidia.c").write_text(MODINFO_C)
    (tmp_path / "empty.c").write_text("int gpuenv_lab_fake_driver;\n")
    subprocess.run(
        ["gcc", "-c", "-o", str(out / "nvidia.ko"), str(tmp_path / "nvidia.c")], check=True
    )
    for version in ("535.261.03", "550.163.01"):
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1",
             "-o", str(out / f"libnvidia-ml.so.{version}"), str(tmp_path / "empty.c")],
            check=True,
        )  # fmt: skip
    return out


def doctor():
    start = time.monotonic()
    done = subprocess.run(
        [*GPUENV, "doctor", "-i", INVENTORY, "--become", "--json", "-"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done, json.loads(done.stdout), time.monotonic() - start


def failing(data):
    return sorted((r["node"], r["check"]) for r in data["results"]
                  if r["status"] not in ("PASS", "SKIP"))  # fmt: skip


def test_doctor_names_each_injected_fault_and_its_node(tmp_path):
    done, data, took = doctor()
    assert done.returncode == 0, (failing(data), done.stderr[-2000:])
    print(f"clean lab: exit 0 in {took:.1f} s")

    driver_files = fake_driver_files(tmp_path)
    try:
        on_node(1, "echo NCCL_P2P_DISABLE=1 >> /etc/environment")
        on_node(2, INJECT_NCCL)
        copy_to(2, driver_files, "/tmp/lab-driver")
        assert on_node(2, INJECT_DRIVER).stdout.decode().strip().endswith("535.261.03")
        on_node(3, "sed -i 's/^NCCL_SOCKET_IFNAME=.*/NCCL_SOCKET_IFNAME=ib0/' /etc/nccl.conf")

        done, data, took = doctor()
        print(done.stderr)
        print(f"faulty lab: exit {done.returncode} in {took:.1f} s")
        assert done.returncode == 1
        assert took < BUDGET_S
        assert failing(data) == [
            (node(1), "doctor.stray-env"),
            (node(2), "doctor.driver-version"),
            (node(2), "doctor.nccl-libraries"),
            (node(3), "doctor.nccl-socket-ifname"),
        ]
        by = {(r["node"], r["check"]): r for r in data["results"]}
        stray = by[(node(1), "doctor.stray-env")]["reason"]
        assert "NCCL_P2P_DISABLE=1 set in /etc/environment" in stray
        driver = by[(node(2), "doctor.driver-version")]["details"]["findings"][0]
        assert "550.163.01" in driver["title"] and "535.261.03" in driver["title"]
        assert any("upgrade libnvidia-ml1" in e for e in driver["evidence"])
        assert driver["fixes"] and driver["cause"]
        assert "/opt/nccl-copy/lib/" in by[(node(2), "doctor.nccl-libraries")]["reason"]
        ifname = by[(node(3), "doctor.nccl-socket-ifname")]["reason"]
        assert "NCCL_SOCKET_IFNAME=ib0 does not select eth0" in ifname
    finally:
        for n, command in UNDO.items():
            on_node(n, command, check=False)

    done, data, _ = doctor()
    assert done.returncode == 0, failing(data)
