"""Bad-node isolation: parallel rounds of disjoint node pairs name the node(s) at fault.

A pair test runs a 2-node all-reduce between two nodes; its bus bandwidth is at most that of
the slower node and of the link between them. So a pair that passes clears both nodes, and a
pair that fails holds at least one bad node (or a bad link). The search:

1. Round 1 pairs the nodes off, (n0, n1), (n2, n3), ...: N/2 tests at once. Every node of a
   passing pair is cleared; both nodes of a failing pair become suspects.
2. Each later round tests every suspect against a distinct cleared node, all at once. A suspect
   that fails beside a cleared node is bad; one that passes is cleared. When there are more
   suspects than cleared nodes, the spare suspects are paired with each other (never twice the
   same pair): a passing pair of suspects clears both.
3. A failed pair whose two nodes were both cleared afterwards names a bad link.

With k bad nodes, at most 2k suspects remain after round 1 and at least N - 2k nodes are
cleared, so for k <= N/4 every suspect gets a cleared partner in round 2: two rounds in all,
whatever N is. More bad nodes cost ceil(suspects / cleared) further rounds. A pair of nodes
with no third node (N = 2) cannot say which of the two is bad: both stay unresolved.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

Pair = tuple[str, str]
# Runs all the given (disjoint) pairs at once; bus bandwidth per pair in GB/s, None when the
# pair's run failed or did not finish in time.
RoundTester = Callable[[Sequence[Pair]], Mapping[Pair, "float | None"]]
# Without a threshold, a pair passes at this fraction of round 1's median (the CLI's
# --pair-relative, which the pair matrix uses too).
RELATIVE = 0.5


@dataclass
class Isolation:
    """What the pair rounds found."""

    bad_nodes: list[str]
    bad_links: list[Pair]
    # Suspects the rounds could not decide on (no cleared partner left, or max_rounds reached).
    unresolved: list[str]
    # One mapping per round: the pairs tested and their bandwidth (None: failed).
    rounds: list[dict[Pair, float | None]] = field(default_factory=list)
    threshold: float | None = None  # GB/s a pair had to reach

    @property
    def ok(self) -> bool:
        return not (self.bad_nodes or self.bad_links or self.unresolved)


def _passes(bw: float | None, threshold: float) -> bool:
    return bw is not None and bw >= threshold


def _key(a: str, b: str) -> Pair:
    return (a, b) if a <= b else (b, a)


def isolate(
    nodes: Sequence[str],
    test_round: RoundTester,
    threshold: float | None = None,
    max_rounds: int = 12,
    relative: float = RELATIVE,
) -> Isolation:
    """Name the bad nodes and links among ``nodes`` with as few parallel rounds as possible.

    A pair passes at ``threshold`` GB/s or more; with no threshold, at ``relative`` times the
    median of round 1 (a slow node stands out against its healthy peers).
    """
    if len(set(nodes)) != len(nodes):
        raise ValueError("node names must be unique")
    limit: list[float] = [] if threshold is None else [threshold]
    cleared: set[str] = set()
    bad: set[str] = set()
    tried: set[Pair] = set()  # every pair tested, ordered by _key
    failed: set[Pair] = set()
    result = Isolation(bad_nodes=[], bad_links=[], unresolved=[])

    def run(pairs: list[Pair]) -> dict[Pair, float | None]:
        measured = test_round(pairs)
        outcome = {p: measured.get(p) for p in pairs}
        result.rounds.append(outcome)
        seen = sorted(v for v in outcome.values() if v is not None)
        if not limit and seen:
            # The first round that measured anything sets the relative pass mark.
            limit.append(relative * seen[len(seen) // 2])
        result.threshold = limit[0] if limit else None
        for (a, b), bw in outcome.items():
            tried.add(_key(a, b))
            if _passes(bw, limit[0] if limit else float("inf")):
                cleared.update((a, b))
            else:
                failed.add(_key(a, b))
        return outcome

    order = list(nodes)
    first = [(order[i], order[i + 1]) for i in range(0, len(order) - 1, 2)]
    if first:
        run(first)
    suspects = [n for n in order if n not in cleared]

    while suspects and len(result.rounds) < max_rounds:
        partners = sorted(cleared)
        pairs: list[Pair] = []
        against_cleared: dict[Pair, str] = {}
        for suspect, partner in zip(suspects, partners, strict=False):
            pairs.append((suspect, partner))
            against_cleared[(suspect, partner)] = suspect
        spare = suspects[len(partners) :]
        used: set[str] = set()
        for i, a in enumerate(spare):
            if a in used:
                continue
            for b in spare[i + 1 :]:
                if b not in used and _key(a, b) not in tried:
                    pairs.append((a, b))
                    used.update((a, b))
                    break
        if not pairs:
            break  # nothing new can be learned
        outcome = run(pairs)
        for pair, suspect in against_cleared.items():
            if not _passes(outcome[pair], limit[0] if limit else float("inf")):
                bad.add(suspect)
        suspects = [n for n in suspects if n not in cleared and n not in bad]

    result.bad_nodes = [n for n in order if n in bad]
    result.unresolved = [n for n in order if n not in bad and n not in cleared]
    result.bad_links = sorted(p for p in failed if p[0] in cleared and p[1] in cleared)
    return result


def all_pairs_rounds(nodes: Sequence[str]) -> list[list[Pair]]:
    """Every pair of nodes exactly once, in rounds of disjoint pairs (the circle method).

    N - 1 rounds for even N, N rounds for odd N (one node sits out each round). Used for the
    full node-pair matrix of small clusters.
    """
    ring: list[str | None] = list(nodes)
    if len(ring) % 2:
        ring.append(None)
    n = len(ring)
    rounds: list[list[Pair]] = []
    for _ in range(n - 1):
        pairs = [(ring[i], ring[n - 1 - i]) for i in range(n // 2)]
        rounds.append([(a, b) for a, b in pairs if a is not None and b is not None])
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return [r for r in rounds if r]
