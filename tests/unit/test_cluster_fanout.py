import contextlib
import os
import socket
import threading
import time
import uuid

import paramiko
import pytest

from gpuenv.cluster.fanout import fan_out, shell_command
from gpuenv.cluster.inventory import Host


def local(name, **kw):
    return Host(name=name, address=name, rendezvous_address="127.0.0.1", local=True, **kw)


def processes_with(marker):
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def test_local_commands_run_with_the_host_environment():
    hosts = [local("a", env={"GPUENV_T": "one"}), local("b", env={"GPUENV_T": "two"})]
    out = fan_out(hosts, lambda h: shell_command(["sh", "-c", 'echo "$GPUENV_T"']), 10)
    assert [out[n].stdout.strip() for n in ("a", "b")] == ["one", "two"]
    assert all(o.ok for o in out.values())


def test_a_hung_node_is_named_within_its_deadline_and_leaves_no_process():
    marker = f"gpuenv-hang-{uuid.uuid4().hex}"
    # The hung command starts a grandchild too, as a launcher would.
    hang = f"(exec -a {marker} sleep 300) & exec -a {marker} sleep 300"
    hosts = [local("fine"), local("stuck")]
    start = time.monotonic()
    out = fan_out(hosts, lambda h: "true" if h.name == "fine" else hang, 1.5)
    elapsed = time.monotonic() - start
    assert out["fine"].ok
    assert out["stuck"].rc is None and "did not finish within 2 s" in out["stuck"].why()
    assert elapsed < 10
    time.sleep(0.2)
    assert processes_with(marker) == []


def test_an_unreachable_ssh_node_is_named_quickly(tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    host = _ssh_host("down", port, "x", kh)
    start = time.monotonic()
    out = fan_out([host], lambda h: "true", 5)["down"]
    assert out.rc is None and "unreachable at 127.0.0.1" in out.why()
    assert time.monotonic() - start < 5


def _ssh_host(name, port, user, known_hosts):
    """A loopback SSH host whose ssh reads no user configuration and only this known_hosts."""
    args = ("-F", "/dev/null", "-o", f"UserKnownHostsFile={known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null")  # fmt: skip
    return Host(name, "127.0.0.1", "127.0.0.1", port=port, user=user,
                known_hosts=(str(known_hosts),), ssh_args=args)  # fmt: skip


class _Server(paramiko.ServerInterface):
    def check_auth_password(self, username, password):
        return paramiko.AUTH_SUCCESSFUL

    def get_allowed_auths(self, username):
        return "password"

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED


@pytest.fixture
def ssh_server():
    """A loopback SSH server with a fresh host key; it only completes the key exchange."""
    host_key = paramiko.ECDSAKey.generate()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            t = paramiko.Transport(conn)
            t.add_server_key(host_key)
            with contextlib.suppress(paramiko.SSHException, EOFError):
                t.start_server(server=_Server())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port, host_key
    stop.set()
    thread.join(2)
    listener.close()


def test_unknown_host_key_is_refused(tmp_path, ssh_server):
    port, _ = ssh_server
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    host = _ssh_host("n1", port, "u", kh)
    out = fan_out([host], lambda h: "true", 10)["n1"]
    assert out.rc is None
    assert "is not in" in out.why() and "refused" in out.why()
    assert kh.read_text() == ""  # never added


def test_changed_host_key_is_refused(tmp_path, ssh_server):
    port, _ = ssh_server
    other = paramiko.ECDSAKey.generate()
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{port} {other.get_name()} {other.get_base64()}\n")
    host = _ssh_host("n1", port, "u", kh)
    out = fan_out([host], lambda h: "true", 10)["n1"]
    assert out.rc is None and "CHANGED" in out.why()


def test_first_failure_stops_the_ranks_still_waiting():
    marker = f"gpuenv-wait-{uuid.uuid4().hex}"
    hosts = [local("quitter"), local("waiter")]
    start = time.monotonic()
    out = fan_out(
        hosts,
        lambda h: "exit 3" if h.name == "quitter" else f"exec -a {marker} sleep 300",
        60,
        stop_others=lambda h: "unused for local hosts",
    )
    assert time.monotonic() - start < 10
    assert out["quitter"].rc == 3
    assert out["waiter"].why() == "stopped because quitter failed first"
    assert processes_with(marker) == []


def test_three_hundred_nodes_start_at_once_and_all_rendezvous(tmp_path):
    """A launch whose ranks wait for each other: with any cap below the node count it deadlocks.

    Each emulated node leaves its token in a shared folder and waits until all 300 are there.
    """
    n = 300
    hosts = [local(f"n{i}") for i in range(n)]
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    cmd = (
        f"touch {barrier}/$GPUENV_NODE; "
        f"while [ $(ls {barrier} | wc -l) -lt {n} ]; do sleep 0.2; done; echo joined"
    )
    start = time.monotonic()
    out = fan_out([local(h.name, env={"GPUENV_NODE": h.name}) for h in hosts], lambda h: cmd, 120)
    assert [o.why() for o in out.values() if not o.ok] == []
    assert all(o.stdout.strip() == "joined" for o in out.values())
    assert time.monotonic() - start < 120


def test_each_node_has_its_own_deadline(tmp_path):
    """A node that finishes late in its own deadline is not cut off by another node's clock."""
    hosts = [local("quick"), local("slow")]
    out = fan_out(hosts, lambda h: "sleep 2; echo done" if h.name == "slow" else "true", 4)
    assert out["slow"].ok and out["slow"].stdout.strip() == "done"


def test_a_local_node_keeps_stdout_and_stderr_apart():
    """The JSON a node prints is read from stdout; why it failed from stderr's last lines."""
    out = fan_out([local("a")], lambda h: 'echo "{\\"x\\": 1}"; echo broke >&2; exit 4', 10)["a"]
    assert out.rc == 4 and out.json() == {"x": 1} and out.why() == "exit status 4: broke"
