from gpuenv.cluster.consistency import compare, consistency_result, node_facts, odd_nodes
from gpuenv.results import Result, Status

BASE = {
    "driver": "580.159.04",
    "cuda.driver_api": "13.0",
    "openmpi": "4.1.6",
    "pkg.torch": "2.11.0",
    "gpu.model": "NVIDIA H200",
    "gpu.count": "8",
    "env.NCCL_SOCKET_IFNAME": "eth0",
}


def cluster(n=4, **changes):
    facts = {f"n{i}": dict(BASE) for i in range(n)}
    for node, (key, value) in changes.items():
        if value is None:
            facts[node].pop(key)
        else:
            facts[node][key] = value
    return facts


def test_agreeing_nodes_pass():
    r = consistency_result(cluster())
    assert r.status is Status.PASS and "4 nodes agree on 7 facts" in r.reason


def test_one_node_with_another_torch_is_named_with_both_values():
    r = consistency_result(cluster(n2=("pkg.torch", "2.10.0")))
    assert r.status is Status.FAIL
    assert "pkg.torch: 2.11.0 on n0, n1, n3; 2.10.0 on n2" in r.reason
    assert r.details["odd_nodes"] == ["n2"]


def test_missing_fact_and_several_disagreements():
    facts = cluster(n1=("env.NCCL_SOCKET_IFNAME", None), n3=("gpu.count", "7"))
    found = compare(facts)
    assert [d.key for d in found] == ["env.NCCL_SOCKET_IFNAME", "gpu.count"]
    assert found[0].values == {"eth0": ["n0", "n2", "n3"], "<absent>": ["n1"]}
    assert odd_nodes(found) == ["n1", "n3"]


def test_a_two_node_tie_names_both():
    found = compare(cluster(n=2, n1=("driver", "550.163")))
    assert odd_nodes(found) == ["n0", "n1"]


def test_check_versions_are_compared_too():
    a = node_facts(BASE, [Result("system", "a", Status.PASS, versions={"nccl": "2.28.9"})])
    b = node_facts(BASE, [Result("system", "b", Status.PASS, versions={"nccl": "2.27.3"})])
    r = consistency_result({"a": a, "b": b})
    assert r.status is Status.FAIL and "versions.nccl" in r.reason


def test_one_node_is_not_compared():
    r = consistency_result(cluster(n=1))
    assert r.status is Status.SKIP and "nothing to compare" in r.reason


FABRIC = {
    "nccl.conf.NCCL_IB_HCA": "=mlx5_0:1,mlx5_3:1",
    "nccl.conf.NCCL_IB_TC": "106",
    "nccl.conf.NCCL_SOCKET_IFNAME": "eno1",
}


def test_the_fabric_settings_are_compared_among_nodes_of_one_type():
    facts = {f"n{i}": {**BASE, **FABRIC} for i in range(4)}
    # n3 is another node type: other NICs and interface, legitimately other settings
    facts["n3"].update({"gpu.count": "4", "nccl.conf.NCCL_IB_HCA": "=mlx5_0:1",
                        "nccl.conf.NCCL_SOCKET_IFNAME": "enp1s0"})  # fmt: skip
    facts["n1"]["nccl.conf.NCCL_IB_HCA"] = "=mlx5_0:1,mlx5_1:1"  # a storage port picked
    keys = [d.key for d in compare(facts)]
    assert keys == ["gpu.count", "nccl.conf.NCCL_IB_HCA (NVIDIA H200 x8)"]
    found = compare(facts)[1]
    assert found.values == {"=mlx5_0:1,mlx5_3:1": ["n0", "n2"], "=mlx5_0:1,mlx5_1:1": ["n1"]}


def test_traffic_class_must_match_across_node_types():
    facts = {f"n{i}": {**BASE, **FABRIC} for i in range(2)}
    facts["n1"].update({"gpu.count": "4", "nccl.conf.NCCL_IB_TC": "0"})
    assert [d.key for d in compare(facts)] == ["gpu.count", "nccl.conf.NCCL_IB_TC"]
