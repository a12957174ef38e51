from drivers.gpu.model.topology import cliques, connectivity


def test_non_transitive_links_form_a_clique_not_a_component() -> None:
    # 0-1 and 1-2 are linked, 0-2 is not: {0, 1, 2} is connected but not a clique.
    groups = cliques(connectivity({0: [1], 1: [2], 2: []}, switch_attached=[]))
    assert groups == [(0, 1)]


def test_largest_clique_wins_over_lower_indices() -> None:
    # A triangle 1-2-3 plus a pendant edge 0-1: the triangle is taken first.
    direct = {0: [1], 1: [2, 3], 2: [3], 3: []}
    assert cliques(connectivity(direct, switch_attached=[])) == [(1, 2, 3)]


def test_square_splits_into_two_pairs() -> None:
    direct = {0: [1], 1: [2], 2: [3], 3: [0]}
    assert cliques(connectivity(direct, switch_attached=[])) == [(0, 1), (2, 3)]


def test_switch_attached_gpus_are_all_connected() -> None:
    direct: dict[int, list[int]] = {i: [] for i in range(8)}
    assert cliques(connectivity(direct, switch_attached=range(8))) == [tuple(range(8))]


def test_links_to_unknown_gpus_and_self_are_ignored() -> None:
    adjacency = connectivity({0: [0, 9], 1: [0]}, switch_attached=[7])
    assert adjacency == {0: {1}, 1: {0}}


def test_pcie_only_gives_no_groups() -> None:
    assert cliques(connectivity({0: [], 1: [], 2: []}, switch_attached=[])) == []
