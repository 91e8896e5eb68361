"""Helpers of the opt-in lab tests that boot a lab node through cloud-init with gpuenv's user data.

The node gets Debian's cloud-init and a NoCloud seed (/var/lib/cloud/seed/nocloud) holding the
rendered user data; cloud-init's stages are then started by hand, as a booting instance would
run them. The project reaches the node as a `git archive` tarball that the lab's cache container
serves over https (`gpuenv cloud-init` fetches over https only) from a server this harness starts
there on a port of its own, under a throwaway CA made here and given to the user data with
`--ca-bundle`; apt goes through the lab's apt cache, PyPI through the controller's proxy (the node
image trusts its CA). Nothing leaves the lab's network:
cloud-init looks at the NoCloud seed only, and its network, hostname, apt-sources and host-key
modules are told to leave the container alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuenv.lab.cluster import ssh_argv
from gpuenv.lab.settings import CACHE_ALIAS, Names, wheelhouse_dir

ROOT = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"  # the CPU build constraints.txt pins, which lies on the controller
# Test-harness settings for cloud-init (not user data): the NoCloud seed only, and hands off
# what a container must keep (its network, hostname, apt sources and the host keys the lab's
# known_hosts holds).
CLOUD_CFG = """\
datasource_list: [NoCloud, None]
network: {config: disabled}
preserve_hostname: true
manage_etc_hosts: false
ssh_deletekeys: false
apt:
  preserve_sources_list: true
"""
# Each stage whatever the one before returned, as systemd starts them at boot (a module that
# fails, e.g. locale on a minbase image, makes its stage exit non-zero).
CLOUD_INIT_STAGES = (
    "cloud-init init --local; cloud-init init; cloud-init modules --mode=config;"
    " cloud-init modules --mode=final"
)
SEED = "/var/lib/cloud/seed/nocloud"
MARKER = "/var/lib/gpuenv/ready.json"


@dataclass(frozen=True)
class LabNode:
    """One node of a running lab, reached over SSH with its host key verified."""

    lab: str
    name: str

    def run(self, command: str, stdin: str | None = None, timeout: float = 600):
        argv = ssh_argv(ROOT, self.lab, self.name, ["sudo", "sh", "-c", shlex.quote(command)])
        return subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )

    def marker(self) -> dict | None:
        done = self.run(f"cat {MARKER} 2>/dev/null || true")
        return json.loads(done.stdout) if done.stdout.strip() else None

    def install_cloud_init(self) -> None:
        install = self.run(
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq"
            " --no-install-recommends cloud-init >/dev/null && mkdir -p /etc/cloud/cloud.cfg.d"
            " && cat > /etc/cloud/cloud.cfg.d/99-gpuenv-lab.cfg",
            stdin=CLOUD_CFG,
            timeout=900,
        )
        assert install.returncode == 0, install.stderr

    def seed_and_start(self, user_data: str, instance_id: str) -> None:
        """Seed cloud-init as a new instance and start its stages (they run on after this)."""
        cleaned = self.run(f"cloud-init clean --logs; rm -f {MARKER}; mkdir -p {SEED}")
        assert cleaned.returncode == 0, cleaned.stderr
        assert self.run(f"cat > {SEED}/user-data", stdin=user_data).returncode == 0
        meta = f"instance-id: {instance_id}\n"
        assert self.run(f"cat > {SEED}/meta-data", stdin=meta).returncode == 0
        started = self.run(
            f"systemd-run --unit gpuenv-e2e-{instance_id} --collect sh -c '{CLOUD_INIT_STAGES}'"
        )
        assert started.returncode == 0, started.stderr

    def wait_ready(self, instance_id: str, deadline_s: float) -> dict:
        """The bootstrap's final marker for this instance (fails the test at the deadline)."""
        stop_at = time.monotonic() + deadline_s
        while time.monotonic() < stop_at:
            state = self.marker()
            if state and state["ref"] in instance_id and state["status"] != "running":
                return state
            time.sleep(20)
        log = self.run("tail -n 40 /var/log/gpuenv-bootstrap.log /var/log/cloud-init-output.log")
        pytest.fail(f"no final marker within {deadline_s} s:\n{log.stdout}")

    def boot(self, user_data: str, instance_id: str, deadline_s: float) -> dict:
        self.seed_and_start(user_data, instance_id)
        return self.wait_ready(instance_id, deadline_s)


def head_commit() -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def serve_project(commit: str) -> Path:
    """The committed project as a tarball the lab's cache container serves."""
    out = wheelhouse_dir(ROOT) / "bootstrap"
    out.mkdir(parents=True, exist_ok=True)
    tarball = out / f"gpuenv-{commit}.tar.gz"
    subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar.gz", "--prefix=gpuenv/", "-o",
         str(tarball), commit],
        check=True,
    )  # fmt: skip
    return tarball


def serve_torch() -> None:
    """CPU-only lab nodes are judged by the cpu profile, which requires ddp: the node gets the
    CPU build of torch from the lab's wheelhouse (cp311: a Debian 12 node), as `make demo` does."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "-c", str(ROOT / "constraints.txt"),
         "-d", str(wheelhouse_dir(ROOT)), TORCH],
        check=True, capture_output=True,
    )  # fmt: skip


# An https server for the project's tarball, in the lab's cache container: python's http.server
# wrapped with ssl. It writes its pid, so that the harness stops it and only it.
HTTPS_SERVER = """\
import functools, http.server, os, ssl, sys
port, folder, cert, key, pidfile = sys.argv[1:]
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=folder)
server = http.server.ThreadingHTTPServer(("0.0.0.0", int(port)), handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
with open(pidfile, "w") as f:
    f.write(str(os.getpid()))
server.serve_forever()
"""
HTTPS_START_S = 60  # until the server answers, on a loaded machine


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=120)


def _docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@dataclass(frozen=True)
class HttpsSource:
    """The project's tarball over https from the lab's cache container (``apt-cache:port``)."""

    container: str
    port: int
    folder: str  # in the container: www/bootstrap/ (what it serves), tls/ (its key), its script
    ca: Path  # the throwaway CA's certificate, on the controller (its key never leaves tmp)
    tarball: Path
    sha256: str

    @property
    def url(self) -> str:
        return f"https://{CACHE_ALIAS}:{self.port}/bootstrap/gpuenv-{{ref}}.tar.gz"

    def stop(self) -> None:
        pidfile = f"{self.folder}/server.pid"
        _docker("exec", self.container, "sh", "-c", f"[ ! -f {pidfile} ] || kill $(cat {pidfile})")
        _docker("exec", self.container, "rm", "-rf", self.folder)


def serve_https(lab: str, tarball: Path, tmp: Path) -> HttpsSource:
    """A throwaway CA and a server certificate for apt-cache (keys in ``tmp``, never committed),
    and an https server in the cache container serving a copy of the tarball's folder on a port
    of this lab's. A copy: the cache's /srv/wheels is the wheelhouse of the checkout that created
    the cache container (read-only), not necessarily this one's."""
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed on the controller (apt-get install -y openssl)")
    ca_key, ca, key, csr, cert = (
        tmp / n for n in ("ca.key", "ca.pem", "srv.key", "srv.csr", "srv.pem")
    )
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    # The extensions Python 3.13's strict verification (the cache's) and curl expect of a CA.
    _openssl("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "2",
             "-subj", f"/CN=gpuenv lab {lab} throwaway CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    _openssl(
        "req", "-new", *ec, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={CACHE_ALIAS}"
    )
    san = tmp / "san.ext"
    san.write_text(
        f"subjectAltName=DNS:{CACHE_ALIAS}\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(san))  # fmt: skip
    (tmp / "serve.py").write_text(HTTPS_SERVER)
    container = Names.from_env().cache_container
    # A port of this lab's own, beside 8080 and other labs' servers in the same cache container.
    port = 8443 + zlib.crc32(lab.encode()) % 500
    folder = f"/srv/https-{lab}"
    source = HttpsSource(
        container, port, folder, ca, tarball, hashlib.sha256(tarball.read_bytes()).hexdigest()
    )
    source.stop()  # a server a killed run of this lab left behind
    made = _docker("exec", container, "mkdir", "-p", f"{folder}/www/bootstrap", f"{folder}/tls")
    assert made.returncode == 0, made.stderr
    for path, there in (
        (tarball, f"www/bootstrap/{tarball.name}"),  # only www/ is served: the key is beside it
        (cert, "tls/srv.pem"),
        (key, "tls/srv.key"),
        (ca, "tls/ca.pem"),
        (tmp / "serve.py", "serve.py"),
    ):
        copied = _docker("cp", str(path), f"{container}:{folder}/{there}")
        assert copied.returncode == 0, copied.stderr
    started = _docker("exec", "-d", container, "python3", f"{folder}/serve.py", str(port),
                      f"{folder}/www", f"{folder}/tls/srv.pem", f"{folder}/tls/srv.key",
                      f"{folder}/server.pid")  # fmt: skip
    assert started.returncode == 0, started.stderr
    probe = (
        "import socket, ssl, sys; c = ssl.create_default_context(cafile=sys.argv[2]);"
        " c.wrap_socket(socket.create_connection(('127.0.0.1', int(sys.argv[1])), 5),"
        f" server_hostname='{CACHE_ALIAS}').close()"
    )
    stop_at = time.monotonic() + HTTPS_START_S
    while True:
        # The certificate verified by the CA for the name nodes use: what curl on a node will do.
        said = _docker("exec", container, "python3", "-c", probe, str(port), f"{folder}/tls/ca.pem")
        if said.returncode == 0:
            return source
        if time.monotonic() > stop_at:
            source.stop()
            pytest.fail(f"https server in {container}:{port} did not answer: {said.stderr[-2000:]}")
        time.sleep(2)


def render(inventory: Path, group: str, ref: str, source: HttpsSource) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "gpuenv", "cloud-init", "-i", str(inventory), "--group", group,
         "--source", source.url, "--ref", ref, "--sha256", source.sha256,
         "--ca-bundle", str(source.ca)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "PRIVATE KEY" not in done.stdout
    return done.stdout


@dataclass(frozen=True)
class Change:
    task: str  # its name, without the role's
    path: str  # the task's file and line
    files: tuple[str, ...] | None  # the files it changed, where the module says (gpuenv_files)


@dataclass(frozen=True)
class PlaybookRun:
    rc: int
    recap: dict[str, tuple[int, int, int]]  # host -> (changed, unreachable, failed)
    changed_tasks: dict[str, list[Change]]  # host -> what changed it, task by task
    output: str
    wall_s: float


def playbook(inventory: Path, *args: str, timeout: float = 3600) -> PlaybookRun:
    """site.yml from this checkout, reported through ansible.posix.json: which task changed what."""
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        # profile_tasks writes to the same stream and the JSON document must stand alone; an empty
        # list is refused, and the stdout callback named again loads once.
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.json",
    }
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "site.yml"]
    argv += ["-i", str(inventory), *args]
    started = time.monotonic()
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    wall_s = time.monotonic() - started
    start = done.stdout.find("{")
    assert start >= 0, f"no JSON from ansible-playbook (rc {done.returncode}):\n{done.stderr}"
    report = json.loads(done.stdout[start:])
    changed: dict[str, list[Change]] = defaultdict(list)
    for play in report["plays"]:
        for task in play["tasks"]:
            for host, result in task["hosts"].items():
                if result.get("changed"):
                    files = result.get("changed_paths")
                    changed[host].append(
                        Change(
                            task["task"]["name"].split(" : ", 1)[-1],  # less "role : "
                            task["task"].get("path", ""),
                            None if files is None else tuple(files),
                        )
                    )
    recap = {
        host: (s["changed"], s["unreachable"], s["failures"]) for host, s in report["stats"].items()
    }
    run = PlaybookRun(done.returncode, recap, dict(changed), done.stdout + done.stderr, wall_s)
    # What a reader of `pytest -s` wants to see: the recap and every change, by host.
    print(f"\n{' '.join(argv[1:])}: rc {run.rc} in {wall_s:.1f} s")
    for host, (n_changed, unreachable, failed) in sorted(recap.items()):
        print(f"  {host}: changed={n_changed} unreachable={unreachable} failed={failed}")
        for change in run.changed_tasks.get(host, []):
            print(f"    {change.task}" + (f": {', '.join(change.files)}" if change.files else ""))
    return run
