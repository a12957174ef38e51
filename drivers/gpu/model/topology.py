"""NVLink cliques: groups of GPUs in which every pair is NVLink-connected.

Connected components are not enough: with links A-B and B-C but none A-C, a
tensor-parallel job on {A, B, C} would run over PCIe between A and C. So GPUs
are partitioned into cliques: the largest clique first (ties go to the one with
the lowest GPU indices), then again among the GPUs left, until no connected
pair remains. GPUs behind NVSwitches are all connected to each other.
"""

from collections.abc import Iterable, Mapping, Set


def connectivity(
    direct: Mapping[int, Iterable[int]], switch_attached: Iterable[int]
) -> dict[int, set[int]]:
    """Undirected adjacency from each GPU's direct GPU links and the NVSwitch-attached set.

    Keys of ``direct`` are all GPUs considered; links to GPUs not among them are dropped.
    """
    adjacency: dict[int, set[int]] = {gpu: set() for gpu in direct}
    for gpu, peers in direct.items():
        for peer in peers:
            if peer != gpu and peer in adjacency:
                adjacency[gpu].add(peer)
                adjacency[peer].add(gpu)
    behind_switch = [gpu for gpu in switch_attached if gpu in adjacency]
    for gpu in behind_switch:
        adjacency[gpu].update(peer for peer in behind_switch if peer != gpu)
    return adjacency


def cliques(adjacency: Mapping[int, Set[int]]) -> list[tuple[int, ...]]:
    """Disjoint cliques of two or more GPUs, each sorted, ordered by their lowest GPU."""
    found: list[tuple[int, ...]] = []
    for component in _components(adjacency):
        members = set(component)
        while True:
            sub = {v: adjacency[v] & members for v in members}
            best = _largest_clique(sub)
            if len(best) < 2:
                break
            found.append(best)
            members -= set(best)
    return sorted(found)


def _components(adjacency: Mapping[int, Set[int]]) -> list[list[int]]:
    seen: set[int] = set()
    components: list[list[int]] = []
    for start in sorted(adjacency):
        if start in seen or not adjacency[start]:
            continue
        stack, component = [start], []
        seen.add(start)
        while stack:
            gpu = stack.pop()
            component.append(gpu)
            for peer in adjacency[gpu]:
                if peer not in seen:
                    seen.add(peer)
                    stack.append(peer)
        components.append(sorted(component))
    return components


def _largest_clique(sub: Mapping[int, Set[int]]) -> tuple[int, ...]:
    vertices = sorted(sub)
    # The common cases (an NVSwitch board, a bridged pair) are complete graphs.
    if all(len(sub[v]) == len(vertices) - 1 for v in vertices):
        return tuple(vertices)
    best: tuple[int, ...] = ()
    for clique in _maximal_cliques(sub):
        candidate = tuple(sorted(clique))
        if len(candidate) > len(best) or (len(candidate) == len(best) and candidate < best):
            best = candidate
    return best


def _maximal_cliques(sub: Mapping[int, Set[int]]) -> list[set[int]]:
    """Bron-Kerbosch with pivoting; the graphs here have at most a few hundred GPUs."""
    out: list[set[int]] = []

    def expand(r: set[int], p: set[int], x: set[int]) -> None:
        if not p and not x:
            out.append(r)
            return
        pivot = max(p | x, key=lambda v: len(sub[v] & p))
        for v in sorted(p - sub[pivot]):
            expand(r | {v}, p & sub[v], x & sub[v])
            p = p - {v}
            x = x | {v}

    expand(set(), set(sub), set())
    return out
