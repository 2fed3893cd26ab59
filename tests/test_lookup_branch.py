"""Golden values of the lookup branch (hf_cascade.drafters.lookup_branch): the sequence's repeats joined to a
model's tree, cut by the budget, learned from the target's verdicts. End-to-end parity and exact sampling with
the branch on (GLIDE's and ReDrafter's default) run in tests/test_contract.py."""

from __future__ import annotations

import torch

from hf_cascade.core.structure import TokenTree
from hf_cascade.drafters.lookup_branch import LookupBranch

# the suffix (1, 2, 3) occurred twice: followed by 4 1 2 ... (older) and by 7 1 2 ... (most recent)
TOKENS = [1, 2, 3, 4, 1, 2, 3, 7, 1, 2, 3]


class KeepAll:
    """A budget that verifies everything and does not calibrate (records what it was asked)."""

    def calibrated(self, p: float) -> float:
        return p

    def calibrated_all(self, probs: list[float]) -> list[float]:
        return list(probs)

    def keep(self, tree: TokenTree, estimates: list[float]) -> list[bool]:
        self.estimates = list(estimates)
        return [True] * tree.num_nodes


class KeepAbove(KeepAll):
    def __init__(self, floor: float):
        self.floor = floor

    def keep(self, tree, estimates):
        path = []
        for e, p in zip(estimates, tree.host_parents):
            path.append(e * (path[p] if p >= 0 else 1.0))
        return [x >= self.floor for x in path]


def model_tree() -> TokenTree:
    """A model's tree: 7 -> 1, and a sibling 5 of 7."""
    return TokenTree(torch.tensor([7, 5, 1]), torch.tensor([-1, -1, 0]))


def test_join_shares_the_model_nodes_and_appends_the_rest():
    branch = LookupBranch(depth=3)
    tree, est, from_model, shares = branch.join(model_tree(), [0.9, 0.05, 0.8], TOKENS, depth=3)
    # seeds: 7 1 2 (share 1/2 each step after the first) and 4 1 2 (share 1/2); the rate starts at 1/2
    assert tree.token_list == (7, 5, 1, 4, 1, 2, 2)  # level order below the model's nodes
    assert tree.host_parents == (-1, -1, 0, -1, 3, 2, 4)
    assert from_model == [True, True, True, False, False, False, False]
    assert shares == [0.5, 0.0, 1.0, 0.5, 1.0, 1.0, 1.0]
    assert est == [0.9, 0.05, 0.8, 0.25, 0.5, 0.5, 0.5]  # shared nodes: the larger estimate


def test_no_repeat_leaves_the_tree_as_it_is():
    tree = model_tree()
    out, est, from_model, shares = LookupBranch().join(tree, [0.9, 0.05, 0.8], [1, 2, 3, 4, 5], depth=4)
    assert out is tree and est == [0.9, 0.05, 0.8] and from_model == [True] * 3 and shares == [0.0] * 3


def test_select_marks_seed_nodes_and_cuts_with_the_budget():
    branch = LookupBranch(depth=3)
    tree, probs = branch.select(KeepAbove(0.2), model_tree(), [0.9, 0.05, 0.8], TOKENS, depth=3)
    # kept: 7 (0.9), 7-1 (0.72), 4 (0.25), 7-1-2 (0.36); cut: 5 (0.05), 4-1 (0.125), 4-1-2
    assert tree.token_list == (7, 1, 4, 2) and tree.host_parents == (-1, 0, -1, 1)
    assert probs == [0.9, 0.8, None, None]
    assert branch.proposed == 4 and branch.steps == 1  # 7 and 1 are seeds too (shared)


def test_linear_drafters_get_the_best_single_path():
    branch = LookupBranch(depth=3)
    budget = KeepAll()
    tree, probs = branch.select(budget, TokenTree.chain(torch.tensor([4, 1])), [0.3, 0.2], TOKENS, depth=3, linear=True)
    # model chain 4 1 (0.3, then 0.5 as a seed: 0.3 * 0.5 ...) against the seed path 7 1 2 (0.25, 0.25, 0.25)
    assert tree.host_parents == tuple(range(-1, tree.num_nodes - 1))  # a chain
    assert tree.token_list == (4, 1, 2) and probs == [0.3, 0.2, None]


def test_observe_learns_the_rate_of_reached_seeds_only():
    branch = LookupBranch(depth=3)
    tree, _ = branch.select(
        KeepAll(), TokenTree(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)), [], TOKENS, depth=3
    )
    assert tree.token_list == (7, 4, 1, 1, 2, 2)
    before = branch.rates.rate(3)
    branch.observe(tree, [0, 2, 4])  # 7 1 2 accepted; 4 rejected; 4's children unreached
    hits, reached = branch.rates.hits[3]
    assert (hits, reached) == (1.0 + 3, 2.0 + 0.5 + 0.5 + 1.0 + 1.0)
    assert branch.rates.rate(3) > before and branch.accepted == 3
    assert branch.level().tokens_accepted == 3 and branch.level().forward_calls == 0


def test_a_tree_cut_by_the_loop_is_not_learned_from():
    branch = LookupBranch(depth=3)
    tree, _ = branch.select(KeepAll(), model_tree(), [0.9, 0.05, 0.8], TOKENS, depth=3)
    branch.observe(TokenTree.chain(torch.tensor([7])), [0])
    assert branch.rates.hits == {}
