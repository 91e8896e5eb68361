import sys

import pytest

from gpuenv.cluster.inventory import Host
from gpuenv.cluster.preflight import iface_matches, iface_problems, rendezvous_result
from gpuenv.results import Status

IFACES = ["eth0", "ib0", "lo"]


@pytest.mark.parametrize(
    ("spec", "ok"),
    [
        ("eth", True),
        ("eth0,ib", True),
        ("=eth", False),
        ("=eth0", True),
        ("ens", False),
        ("^docker,lo", True),
        ("^eth,ib", False),
    ],
)
def test_nccl_socket_ifname_syntax(spec, ok):
    assert iface_matches(spec, IFACES) is ok


def test_missing_interface_is_named():
    host = Host("n1", "n1", "10.0.0.1", env={"NCCL_SOCKET_IFNAME": "ib"})
    assert iface_problems(host, {"interfaces": ["eth0", "lo"], "facts": {}}) == [
        "NCCL_SOCKET_IFNAME=ib matches no interface (has: eth0, lo)"
    ]
    probe = {"interfaces": ["eth0"], "facts": {"env.GLOO_SOCKET_IFNAME": "eth1"}}
    assert "GLOO_SOCKET_IFNAME=eth1" in iface_problems(Host("n2", "n2", "x"), probe)[0]


def emulated(name, **kw):
    return Host(name, name, "127.0.0.1", local=True, python=sys.executable, **kw)


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_node_reaches_the_master_port():
    hosts = [emulated("a"), emulated("b"), emulated("c")]
    probes = {h.name: {"interfaces": ["lo"], "facts": {}} for h in hosts}
    r = rendezvous_result(hosts, hosts[0], free_port(), probes, 10)
    assert r.status is Status.PASS, r.reason


def test_a_node_that_cannot_reach_the_port_is_named():
    # b tries the master at an address nothing listens on (emulates a firewall in between).
    hosts = [emulated("a"), emulated("b", env={"NCCL_SOCKET_IFNAME": "ib"})]
    probes = {"a": {"interfaces": ["lo"], "facts": {}}, "b": {"interfaces": ["lo"], "facts": {}}}
    master = Host("a", "a", "127.0.0.2", local=True, python=sys.executable)
    r = rendezvous_result(hosts, master, free_port(), probes, 2)
    assert r.status is Status.FAIL
    assert "b: NCCL_SOCKET_IFNAME=ib matches no interface" in r.reason


def test_a_port_nobody_can_reach_names_every_node():
    import socket

    hosts = [emulated("a"), emulated("b")]
    probes = {h.name: {"interfaces": ["lo"], "facts": {}} for h in hosts}
    with socket.socket() as blocker:  # bound, not listening: the master cannot listen there
        blocker.bind(("", 0))
        port = blocker.getsockname()[1]
        r = rendezvous_result(hosts, hosts[0], port, probes, 2)
    assert r.status is Status.FAIL
    assert f"a: cannot listen on port {port}" in r.reason
    assert f"b: cannot reach 127.0.0.1:{port}" in r.reason
