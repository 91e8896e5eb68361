import random

import pytest

from gpuenv.cluster.pairs import _key, all_pairs_rounds, isolate

GOOD, SLOW, THRESHOLD = 40.0, 4.0, 20.0


class Model:
    """Pair bandwidth = the slower node, or a bad link; a dead node fails every pair."""

    def __init__(self, n, slow=(), dead=(), bad_links=()):
        self.nodes = [f"node{i:04d}" for i in range(n)]
        self.bw = {name: GOOD for name in self.nodes}
        for i in slow:
            self.bw[self.nodes[i]] = SLOW
        self.dead = {self.nodes[i] for i in dead}
        self.bad_links = {_key(self.nodes[a], self.nodes[b]) for a, b in bad_links}
        self.calls = []

    def __call__(self, pairs):
        used = [n for p in pairs for n in p]
        assert len(used) == len(set(used)), "a round must hold disjoint pairs"
        self.calls.append(list(pairs))
        out = {}
        for a, b in pairs:
            if a in self.dead or b in self.dead:
                out[(a, b)] = None
            elif _key(a, b) in self.bad_links:
                out[(a, b)] = SLOW
            else:
                out[(a, b)] = min(self.bw[a], self.bw[b])
        return out

    def names(self, idx):
        return [self.nodes[i] for i in sorted(idx)]


@pytest.mark.parametrize("n", [1024, 1025, 4096])
def test_one_bad_node_found_in_two_rounds(n):
    bad = n // 3
    model = Model(n, slow=[bad])
    found = isolate(model.nodes, model, THRESHOLD)
    assert found.bad_nodes == [model.nodes[bad]]
    assert found.unresolved == [] and found.bad_links == []
    assert len(found.rounds) == 2 == len(model.calls)
    # Round 2 only re-tests the two suspects (and an odd node out), each beside a cleared node.
    assert len(found.rounds[1]) == 2 + n % 2


@pytest.mark.parametrize("n", [1024, 2048])
def test_several_bad_nodes_including_both_of_one_pair(n):
    rng = random.Random(n)
    bad = set(rng.sample(range(n), 20)) | {10, 11}  # 10 and 11 share a round-1 pair
    model = Model(n, slow=bad, dead=[5])
    found = isolate(model.nodes, model, THRESHOLD)
    assert found.bad_nodes == model.names(bad | {5})
    assert found.unresolved == [] and found.bad_links == []
    assert len(found.rounds) == 2


def test_many_bad_nodes_need_more_rounds_but_are_all_named():
    n = 1024
    rng = random.Random(7)
    bad = set(rng.sample(range(n), 400))
    model = Model(n, slow=bad)
    found = isolate(model.nodes, model, THRESHOLD)
    assert found.bad_nodes == model.names(bad)
    assert found.unresolved == []
    assert 2 < len(found.rounds) <= 6


def test_bad_link_is_named_not_its_nodes():
    model = Model(1024, bad_links=[(100, 101)])
    found = isolate(model.nodes, model, THRESHOLD)
    assert found.bad_nodes == [] and found.unresolved == []
    assert found.bad_links == [(model.nodes[100], model.nodes[101])]


def test_healthy_cluster_takes_one_round():
    model = Model(1024)
    found = isolate(model.nodes, model, THRESHOLD)
    assert found.ok and len(found.rounds) == 1


def test_odd_node_out_is_tested_in_round_two():
    model = Model(5, slow=[4])
    found = isolate(model.nodes, model, THRESHOLD)
    assert found.bad_nodes == [model.nodes[4]]
    assert len(found.rounds) == 2


def test_two_nodes_cannot_say_which_is_bad():
    model = Model(2, slow=[1])
    found = isolate(model.nodes, model, THRESHOLD)
    assert found.bad_nodes == [] and found.unresolved == model.nodes
    assert not found.ok


def test_every_node_bad_ends_unresolved_within_max_rounds():
    model = Model(64, slow=range(64))
    found = isolate(model.nodes, model, THRESHOLD, max_rounds=5)
    assert len(found.rounds) <= 5
    assert set(found.unresolved) == set(model.nodes)


def test_duplicate_node_names_rejected():
    with pytest.raises(ValueError, match="unique"):
        isolate(["a", "a"], lambda pairs: {}, THRESHOLD)


@pytest.mark.parametrize("n", [2, 3, 4, 7, 16])
def test_all_pairs_rounds_cover_every_pair_once(n):
    nodes = [f"n{i}" for i in range(n)]
    rounds = all_pairs_rounds(nodes)
    seen = [_key(a, b) for r in rounds for a, b in r]
    assert len(seen) == len(set(seen)) == n * (n - 1) // 2
    for r in rounds:
        flat = [x for p in r for x in p]
        assert len(flat) == len(set(flat))
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)


def test_relative_threshold_from_round_one_median():
    rng = random.Random(3)
    bad = set(rng.sample(range(1024), 6))
    model = Model(1024, slow=bad)
    found = isolate(model.nodes, model)  # no absolute threshold
    assert found.threshold == pytest.approx(GOOD / 2)
    assert found.bad_nodes == model.names(bad)


def test_three_nodes_one_that_fails_every_run():
    # Failed runs measure nothing: the pass mark comes from the first round that measured.
    model = Model(3, dead=[1])
    found = isolate(model.nodes, model)
    assert found.bad_nodes == [model.nodes[1]]
    assert found.unresolved == [] and found.threshold == pytest.approx(GOOD / 2)
    assert len(found.rounds) == 3
