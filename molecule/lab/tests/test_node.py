"""What every lab node must be, whatever runs on it later (testinfra, one run per platform)."""

import re
import uuid
from datetime import datetime, timezone
from pathlib import Path

import docker
import pytest

CONTROLLER_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
PEM = re.compile(r"-----BEGIN CERTIFICATE-----\n.+?-----END CERTIFICATE-----", re.DOTALL)


@pytest.fixture(scope="module")
def engine():
    return docker.from_env()


def _container(engine, host):
    return engine.containers.get(host.backend.get_hostname())


def _created(container):
    """When docker created the container, as a Unix time."""
    stamp = datetime.fromisoformat(container.attrs["Created"][:19])
    return stamp.replace(tzinfo=timezone.utc).timestamp()


def test_systemd_is_pid_1_and_the_system_is_running(host):
    assert host.file("/proc/1/comm").content_string.strip() == "systemd"
    state = host.run("systemctl is-system-running")
    assert state.stdout.strip() == "running", host.run("systemctl --failed").stdout


def test_sshd_is_an_enabled_active_service_listening_on_22(host):
    ssh = host.service("ssh")
    assert ssh.is_running
    assert ssh.is_enabled
    assert host.socket("tcp://0.0.0.0:22").is_listening


def test_admin_has_passwordless_sudo_and_no_password(host):
    admin = host.user("admin")
    assert admin.exists
    assert admin.home == "/home/admin"
    assert host.run("sudo -u admin sudo -n true").rc == 0
    assert host.file("/home/admin/.ssh").mode == 0o700
    shadow = host.run("getent shadow admin").stdout.split(":")
    assert shadow[1] in ("*", "!")


def test_host_keys_were_made_at_this_containers_boot(host, engine):
    container = _container(engine, host)
    created = _created(container)
    key = host.file("/etc/ssh/ssh_host_ed25519_key")
    assert key.exists
    assert key.mode == 0o600
    assert key.mtime.timestamp() >= created - 1
    # ... and the image itself carries none.
    image = container.image.tags[0]
    out = engine.containers.run(
        image,
        ["sh", "-c", "ls /etc/ssh/ssh_host_* 2>/dev/null | wc -l"],
        name=f"gpuenv-verify-{uuid.uuid4().hex[:8]}",
        remove=True,
    )
    assert out.decode().strip() == "0"


def test_host_keys_differ_between_nodes(host, engine):
    mine = host.file("/etc/ssh/ssh_host_ed25519_key.pub").content_string.split()[1]
    others = [
        c
        for c in engine.containers.list(filters={"label": "owner=molecule"})
        if c.name in ("lab-trixie", "lab-bookworm") and c.name != host.backend.get_hostname()
    ]
    assert others, "the other platform of this scenario is not running"
    for other in others:
        theirs = other.exec_run(["cat", "/etc/ssh/ssh_host_ed25519_key.pub"]).output.split()[1]
        assert theirs.decode() != mine


def test_controller_ca_bundle_is_trusted(host):
    node_bundle = host.file("/etc/ssl/certs/ca-certificates.crt").content_string
    node_certs = {"".join(c.split()) for c in PEM.findall(node_bundle)}
    controller_certs = PEM.findall(CONTROLLER_BUNDLE.read_text())
    assert controller_certs
    missing = [c for c in controller_certs if "".join(c.split()) not in node_certs]
    assert not missing, f"{len(missing)} controller CA certificates are not trusted on the node"
    assert host.file("/etc/pip.conf").contains("^cert = /etc/ssl/certs/ca-certificates.crt")
    pip_config = host.run("pip3 config list").stdout
    assert "global.cert='/etc/ssl/certs/ca-certificates.crt'" in pip_config


def test_apt_proxy_is_the_cache_when_it_answers_else_direct(host):
    detect = "/usr/local/lib/gpuenv/apt-proxy-detect"
    assert host.run(detect).stdout.strip() == "http://apt-cache:3142"
    # Without a network (a fresh namespace) the same image goes DIRECT.
    assert host.run(f"unshare --net {detect}").stdout.strip() == "DIRECT"


def test_wheelhouse_is_served_by_the_cache(host):
    code = (
        "import urllib.request; "
        "print(urllib.request.urlopen('http://apt-cache:8080/', timeout=5).status)"
    )
    assert host.run(f'python3 -c "{code}"').stdout.strip() == "200"


def test_packages_came_through_the_lab_cache(host, engine):
    assert host.package("hello").is_installed
    container = _container(engine, host)
    ip = container.attrs["NetworkSettings"]["Networks"]["gpuenv-molecule"]["IPAddress"]
    log = engine.containers.get("gpuenv-cache").exec_run(
        ["cat", "/var/log/apt-cacher-ng/apt-cacher.log"]
    )
    # Lines are "epoch|I/O|bytes|client|path"; only requests since this container was created.
    since = _created(container)
    fetched = [
        fields
        for fields in (line.split("|") for line in log.output.decode().splitlines())
        if len(fields) >= 5
        and fields[0].isdigit()
        and int(fields[0]) >= since - 1
        and fields[3] == ip
        and "/hello_" in fields[4]
    ]
    assert fetched, f"the cache saw no request from {ip} for hello since the node was created"
