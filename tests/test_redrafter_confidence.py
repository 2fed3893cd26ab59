"""ReDrafter's ``min_confidence``: beam tokens the head gave a conditional probability below the
threshold (and the rest of their beam) are not verified. Golden tensors for the pieces
(``TokenTree.select``, ``confident_prefix``, ``beams_tree(keep=...)``, ``beam_search``'s per-token
log-probabilities) and greedy parity through ``generate()`` with fewer verified nodes."""

from __future__ import annotations

import pytest
import torch

from hf_cascade import Policy, ReDrafterAssistant, ReDrafterSettings
from hf_cascade.core import TokenTree
from hf_cascade.redrafter import beam_search, beams_tree, confident_prefix
from tests.test_greedy_parity import ONE_TOKEN, REPETITIVE, plain
from tests.test_redrafter_decode import assert_parity, m  # noqa: F401  (fixture)
from tests.test_tree import PAPER_BEAMS
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

T = torch.tensor


def test_select_keeps_a_subtree_renumbered():
    tree = TokenTree(T([10, 11, 12, 13, 14]), T([-1, 0, 0, 1, -1]))
    sub = tree.select(T([True, True, False, True, False]))
    assert sub.tokens.tolist() == [10, 11, 13] and sub.parents.tolist() == [-1, 0, 1]
    assert tree.select(T([False] * 5)).num_nodes == 0
    assert tree.select(T([True] * 5)).parents.tolist() == tree.parents.tolist()
    with pytest.raises(ValueError, match="closed under ancestors"):
        tree.select(T([False, True, False, False, False]))
    with pytest.raises(ValueError, match="one entry per node"):
        tree.select(T([True, True]))


def test_confident_prefix_golden():
    logp = T([[0.9, 0.2, 0.9], [0.5, 0.5, 0.1], [0.1, 0.9, 0.9]]).log()
    assert confident_prefix(logp, 0.3).tolist() == [[True, False, False], [True, True, False], [False, False, False]]
    assert confident_prefix(logp, 0.0).all() and not confident_prefix(logp, 1.0).any()


def test_beams_tree_with_keep_on_the_paper_example():
    # packed: 91 <- 92 <- {93 <- {95, 97}, 94 <- 96} (nodes 0..6 = 91, 92, 93, 95, 94, 96, 97)
    keep = T([[True, True, True, False], [True, True, True, True], [True, False, False, False]])
    tree = beams_tree(PAPER_BEAMS, keep=keep)
    assert tree.tokens.tolist() == [91, 92, 93, 94, 96] and tree.parents.tolist() == [-1, 0, 1, 1, 3]
    flat = beams_tree(PAPER_BEAMS, dedupe=False, keep=keep)
    assert flat.tokens.tolist() == [91, 92, 93, 91, 92, 94, 96, 91]
    assert flat.parents.tolist() == [-1, 0, 1, -1, 3, 4, 5, -1]
    assert beams_tree(PAPER_BEAMS, keep=torch.zeros(3, 4, dtype=torch.bool)).num_nodes == 0
    with pytest.raises(ValueError, match="prefixes"):
        beams_tree(PAPER_BEAMS, keep=T([[False, True, True, True]] * 3))


def test_beam_search_token_logp_sums_to_scores(m):
    target, head = m["target"], m["head"]
    emb = target.get_input_embeddings()
    x = torch.randn(target.config.hidden_size, generator=torch.Generator().manual_seed(0))
    beams, scores, logp = beam_search(head, x, 5, emb, width=4, length=3, token_logp=True)
    assert logp.shape == beams.shape and bool((logp <= 0).all())
    torch.testing.assert_close(logp.sum(-1), scores, rtol=1e-5, atol=1e-5)
    again, _ = beam_search(head, x, 5, emb, width=4, length=3)
    assert torch.equal(again, beams)


@pytest.mark.parametrize("width, length, dedupe", [(1, 5, True), (4, 4, True), (4, 4, False)])
@pytest.mark.parametrize("threshold", [0.3, 0.9])
def test_greedy_parity_with_fewer_nodes(m, width, length, dedupe, threshold):
    target, head = m["target"], m["head"]
    kept = drafted = 0
    for prompt in (REPETITIVE, ids(1, 40, 41, 42), ids(1, 70, 9, 70, 9), ONE_TOKEN):
        full = assert_parity(
            target,
            prompt,
            ReDrafterAssistant(
                head,
                settings=ReDrafterSettings(beam_width=width, beam_length=length, dedupe=dedupe),
                policy=Policy(cost_aware=False),
            ),
        )
        st = assert_parity(
            target,
            prompt,
            ReDrafterAssistant(
                head,
                settings=ReDrafterSettings(
                    beam_width=width, beam_length=length, dedupe=dedupe, min_confidence=threshold
                ),
                policy=Policy(cost_aware=False),
            ),
        )
        assert len(st.confident_nodes) == len(st.drafted_nodes)
        assert all(c <= d for c, d in zip(st.confident_nodes, st.drafted_nodes))
        assert sum(st.tree_sizes) <= sum(full.tree_sizes)
        kept, drafted = kept + sum(st.confident_nodes), drafted + sum(st.drafted_nodes)
    assert kept < drafted  # something was pruned
    assert st.to_dict()["confident_nodes"] == st.confident_nodes


def test_min_confidence_one_is_plain_decoding(m):
    """Nothing is confident enough: every step verifies only the root, i.e. plain decoding (the head's own
    beams; without the lookup branch, whose seeds are not the head's)."""
    a = ReDrafterAssistant(
        m["head"],
        settings=ReDrafterSettings(beam_width=4, beam_length=4, min_confidence=1.0),
        policy=Policy(lookup=False),
    )
    got = m["target"].generate(REPETITIVE, do_sample=False, assistant_model=a, max_new_tokens=12)
    assert got.tolist() == plain(m["target"], REPETITIVE, max_new_tokens=12).tolist()
    assert sum(a.last_stats.tree_sizes) == 0 and a.last_stats.target_calls == 12


def test_bad_min_confidence(m):
    for bad in (1.5, -0.1):
        with pytest.raises(ValueError, match="min_confidence"):
            ReDrafterAssistant(m["head"], settings=ReDrafterSettings(min_confidence=bad))
