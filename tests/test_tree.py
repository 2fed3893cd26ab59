"""Token-tree verification (hf_cascade.core): golden structures and masks, tree-masked forwards equal
per-branch forwards (Llama, Gemma3 with its sliding window; eager and sdpa), the KV cache after
``keep_path``, greedy acceptance, and the exactness of lossless tree sampling (chi-square tests)."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from hf_cascade.core import (
    TokenTree,
    greedy_tree_accept,
    keep_path,
    sampling_tree_accept,
    tree_attention_mask,
    tree_position_ids,
    verify_tree,
)
from hf_cascade.core.attention import query_tree_mask, tree_queries
from hf_cascade.core.structure import prefix_tree
from hf_cascade.glide.cape import cape_tree
from hf_cascade.redrafter.beam import get_prefix_match, unpack
from tests import tiny_models as tm
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

T = torch.tensor
NEG = torch.finfo(torch.float32).min


# -- structure ---------------------------------------------------------------------------------

PAPER_BEAMS = T([[91, 92, 93, 95], [91, 92, 94, 96], [91, 92, 93, 97]])  # ReDrafter, Listing 1


def test_get_prefix_match_paper_example():
    assert torch.equal(get_prefix_match(PAPER_BEAMS), T([[0, 0, 0, 0], [0, 0, 1, 1], [0, 0, 0, 2]]))


def test_prefix_tree_packs_paper_example():
    tree, beam_to_node, host = prefix_tree(PAPER_BEAMS)
    # 12 beam tokens -> 7 nodes: "91 92" shared by all, "93" shared by beams 0 and 2.
    assert torch.equal(tree.tokens, T([91, 92, 93, 95, 94, 96, 97]))
    assert torch.equal(tree.parents, T([-1, 0, 1, 2, 1, 4, 2]))
    assert torch.equal(beam_to_node, T([[0, 1, 2, 3], [0, 1, 4, 5], [0, 1, 2, 6]])) and host == beam_to_node.tolist()
    assert torch.equal(tree.depth, T([0, 1, 2, 3, 2, 3, 3]))
    assert tree.paths() == [[0, 1, 2, 3], [0, 1, 4, 5], [0, 1, 2, 6]]
    assert torch.equal(unpack(tree.tokens, beam_to_node), PAPER_BEAMS)
    values = torch.arange(7.0)[:, None] * T([1.0, -1.0])  # [n, 2] per-node values
    assert torch.equal(unpack(values, beam_to_node)[..., 0], beam_to_node.float())


def test_prefix_tree_random_round_trip():
    g = torch.Generator().manual_seed(0)
    for w, L in [(1, 3), (4, 5), (8, 6)]:
        beams = torch.randint(0, 3, (w, L), generator=g)  # small vocab: much sharing
        beams[w // 2] = beams[0]  # a duplicate beam
        tree, b2n, _ = prefix_tree(beams)
        assert torch.equal(unpack(tree.tokens, b2n), beams)
        assert torch.equal(tree.depth[b2n], torch.arange(L).expand(w, L))
        assert torch.equal(tree.parents[b2n[:, 1:]], b2n[:, :-1]) and bool((tree.parents[b2n[:, 0]] == -1).all())
        pairs = set(zip(tree.parents.tolist(), tree.tokens.tolist()))
        assert len(pairs) == len(tree)  # no duplicated (parent, token)
        assert len(tree) == len({tuple(b[: j + 1].tolist()) for b in beams for j in range(L)})


def hand_tree() -> TokenTree:
    #        root
    #       /    \
    #     0:10   3:13
    #    /   \      \
    #  1:11  2:12   4:14
    #                 \
    #                 5:15
    return TokenTree(T([10, 11, 12, 13, 14, 15]), T([-1, 0, 0, -1, 3, 4]))


def test_hand_tree_mask_positions_paths():
    tree = hand_tree()
    assert torch.equal(tree.depth, T([0, 1, 1, 0, 1, 2]))
    assert torch.equal(tree.position_offsets(), T([0, 1, 1, 0, 1, 2]))
    assert torch.equal(
        tree.ancestor_mask().int(),
        T(
            [
                [1, 0, 0, 0, 0, 0],
                [1, 1, 0, 0, 0, 0],
                [1, 0, 1, 0, 0, 0],
                [0, 0, 0, 1, 0, 0],
                [0, 0, 0, 1, 1, 0],
                [0, 0, 0, 1, 1, 1],
            ]
        ).int(),
    )
    assert tree.paths() == [[0, 1], [0, 2], [3, 4, 5]]
    assert torch.equal(tree.children(-1), T([0, 3])) and torch.equal(tree.children(0), T([1, 2]))
    assert torch.equal(tree_position_ids(7, tree), T([[7, 8, 8, 7, 8, 9]]))
    rooted = tree.with_root(99)
    assert torch.equal(rooted.tokens, T([99, 10, 11, 12, 13, 14, 15])) and torch.equal(
        rooted.parents, T([-1, 0, 1, 1, 0, 4, 5])
    )


def test_tree_attention_mask_golden():
    tree = TokenTree(T([10, 11, 12]), T([-1, 0, -1]))  # 0 -> 1, and 2
    allowed = T(
        [
            [1, 1, 1, 0, 0],
            [1, 1, 1, 1, 0],
            [1, 1, 0, 0, 1],
        ]
    ).bool()
    mask = tree_attention_mask(2, tree)
    assert mask.shape == (1, 1, 3, 5) and mask.dtype == torch.float32
    assert torch.equal(mask[0, 0], torch.where(allowed, 0.0, NEG))
    # Window 2 (by position: node 1 is at position 3, so it no longer sees position 1; node 2, at
    # position 2, still sees position 1 although it comes later in the linearized tree).
    windowed = allowed.clone()
    windowed[0, 0] = windowed[1, :2] = windowed[2, 0] = False
    assert torch.equal(tree_attention_mask(2, tree, sliding_window=2)[0, 0], torch.where(windowed, 0.0, NEG))
    assert tree_attention_mask(2, tree, dtype=torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("window", [None, 2, 3])
@pytest.mark.parametrize("pad", [0, 2])
def test_verification_queries_equal_the_dense_reference(window, pad):
    """verify_tree's queries (tree_queries + query_tree_mask; a host-int or a tensor root) equal the dense reference
    over the tree with its root (tree_attention_mask, tree_position_ids); a padding query sees itself only."""
    tree = TokenTree(T([10, 11, 12, 13, 14]), T([-1, 0, -1, 2, 2]))
    prefix_len, real = 3, tree.num_nodes + 1
    rooted = tree.with_root(99)
    want = tree_attention_mask(prefix_len, rooted, sliding_window=window)[0, 0]
    columns = prefix_len + real + pad
    for root in (99, T(99), T([99], dtype=torch.int32)):
        ids, positions, ancestors = tree_queries(prefix_len, root, tree, real + pad, torch.device("cpu"))
        mask = query_tree_mask(prefix_len, real, positions, ancestors, columns, torch.float32, window)[0, 0]
        assert ids.dtype == torch.long and torch.equal(ids, T([[99, 10, 11, 12, 13, 14] + [99] * pad]))
        assert torch.equal(positions, torch.cat([tree_position_ids(prefix_len, rooted), T([[0] * pad])], dim=1))
        assert torch.equal(mask[:real, : prefix_len + real], want)
        assert (mask[:real, prefix_len + real :] == NEG).all()
        assert torch.equal(
            mask[real:], torch.where(torch.eye(columns, dtype=torch.bool)[prefix_len + real :], 0.0, NEG)
        )


def test_cape_expansions_match_algorithm_2():
    # main = T (gamma = 3); X_0 = {d, e}, X_1 = {}, X_2 = {f}. Algorithm 2 (GLIDE, Appendix A):
    # input = T + X_0 + X_1 + X_2, input_pi = [0, 1, 2] + [0, 0] + [] + [2], and Mask_CAPE (§4.2):
    # token i attends to itself and to main tokens j with pos(i) > j.
    a, b, c, d, e, f = 20, 21, 22, 30, 31, 32
    tree = cape_tree(T([a, b, c]), [T([d, e]), T([], dtype=torch.long), T([f])])
    assert torch.equal(tree.tokens, T([a, b, c, d, e, f]))
    assert torch.equal(tree.position_offsets(), T([0, 1, 2, 0, 0, 2]))
    vam = T(
        [
            [1, 0, 0, 0, 0, 0],  # a
            [1, 1, 0, 0, 0, 0],  # b
            [1, 1, 1, 0, 0, 0],  # c
            [0, 0, 0, 1, 0, 0],  # d: sibling of a
            [0, 0, 0, 0, 1, 0],  # e: sibling of a
            [1, 1, 0, 0, 0, 1],  # f: sibling of c, sees a, b
        ]
    ).bool()
    assert torch.equal(tree.ancestor_mask(), vam)
    # Algorithm 1's topk includes the argmax: dedupe drops it (and repeats) unless told not to.
    tree2 = cape_tree(T([a, b]), [T([a, d, d]), T([e])])
    assert torch.equal(tree2.tokens, T([a, b, d, e])) and torch.equal(tree2.parents, T([-1, 0, -1, 0]))
    raw = cape_tree(T([a, b]), [T([a, d, d]), T([e])], dedupe=False)
    assert torch.equal(raw.tokens, T([a, b, a, d, d, e]))


@pytest.mark.parametrize(
    "tokens, parents, message",
    [
        ([1, 2], [-1, 1], "precede"),
        ([1, 2], [1, -1], "precede"),
        ([1, 2], [-1, -2], "precede"),
        ([1, 2, 3], [-1, 0], "same length"),
        ([[1, 2]], [[-1, 0]], "1-D"),
        ([1.0, 2.0], [-1, 0], "integer"),
        ([1, -2], [-1, 0], ">= 0"),
    ],
)
def test_tree_validation(tokens, parents, message):
    with pytest.raises(ValueError, match=message):
        TokenTree(T(tokens), T(parents))


def test_builder_errors():
    with pytest.raises(ValueError, match="one expansion set per main token"):
        cape_tree(T([1, 2]), [T([3])])
    with pytest.raises(ValueError, match=r"\[w, L\]"):
        prefix_tree(T([1, 2, 3]))


# -- greedy acceptance -----------------------------------------------------------------------------


def logits_with_argmax(best: list[int], vocab: int = 20) -> torch.Tensor:
    g = torch.Generator().manual_seed(len(best))
    logits = torch.randn(len(best), vocab, generator=g)
    logits[torch.arange(len(best)), T(best)] = 10.0
    return logits


@pytest.mark.parametrize(
    "best, path, bonus",
    [
        ([13, 1, 2, 3, 14, 15, 16], [3, 4, 5], 16),  # down the deepest branch to its leaf
        ([10, 12, 1, 2, 3, 4, 5], [0, 2], 2),  # second child of node 0, then its argmax
        ([10, 19, 1, 2, 3, 4, 5], [0], 19),  # node 0 accepted, no child matches
        ([13, 1, 2, 3, 11, 5, 6], [3], 11),  # 11 is a child of node 0, not of node 3
        ([4, 1, 2, 3, 4, 5, 6], [], 4),  # nothing accepted: the root's argmax
    ],
)
def test_greedy_tree_accept_golden(best, path, bonus):
    tree = hand_tree()
    logits = logits_with_argmax(best)
    got = greedy_tree_accept(tree, logits)
    assert got.path.tolist() == path and got.bonus == bonus
    split = greedy_tree_accept(tree, logits[0], logits[1:])
    assert split.path.tolist() == path and split.bonus == bonus


def test_greedy_tree_accept_equals_walk():
    g = torch.Generator().manual_seed(1)
    for _ in range(100):
        n = int(torch.randint(1, 12, (), generator=g))
        parents = T([int(torch.randint(-1, i, (), generator=g)) for i in range(n)])
        tree = TokenTree(torch.randint(0, 3, (n,), generator=g), parents)
        logits = torch.randn(n + 1, 3, generator=g)
        best = logits.argmax(-1).tolist()

        # Reference: the plain walk, preferring the child with the deepest matching descendant.
        def walk(node, tree=tree, best=best):  # -> list of nodes accepted below ``node`` (this trial's tree)
            options = [[c] + walk(c) for c in tree.children(node).tolist() if tree.tokens[c] == best[node + 1]]
            return max(options, key=len) if options else []

        ref = walk(-1)
        got = greedy_tree_accept(tree, logits)
        assert len(got.path) == len(ref) and tree.tokens[got.path].tolist() == tree.tokens[ref].tolist()
        assert got.bonus == best[(ref[-1] if ref else -1) + 1]


# -- sampling acceptance: exactness -----------------------------------------------------------------

V = 5


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = counts.sum() * probs
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a zero-probability outcome occurred"
    stat = ((counts - expected)[keep] ** 2 / expected[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat.double() / 2))


def _targets():
    g = torch.Generator().manual_seed(3)
    p0 = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)  # target at the root
    p_next = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)  # target after token x
    return p0, p_next


def _two_tokens(tree, acc, p_next, g) -> tuple[int, int]:
    """The first two tokens emitted (a second step from ``p_next`` when only one was emitted)."""
    emitted = tree.tokens[acc.path].tolist() + [acc.bonus]
    if len(emitted) == 1:
        emitted.append(int(torch.multinomial(p_next[emitted[0]], 1, generator=g)))
    return emitted[0], emitted[1]


def _check_exact(counts: torch.Tensor, p0: torch.Tensor, p_next: torch.Tensor) -> None:
    assert chi2_pvalue(counts.sum(1), p0) > 1e-3  # first token ~ p0
    joint = (p0[:, None] * p_next).flatten()  # (x1, x2) ~ p0 * p(.|x1)
    assert chi2_pvalue(counts.flatten(), joint) > 1e-3


def test_sampling_tree_accept_deterministic_children_is_exact():
    # Root children 1, 3 and a duplicate 1 (top-k/beam style: fixed by the context); node 0 has
    # children 2 and 4, node 1 has child 3.
    assert_deterministic_tree_exact(TokenTree(T([1, 3, 1, 2, 4, 3]), T([-1, -1, -1, 0, 0, 1])))


def assert_deterministic_tree_exact(tree: TokenTree, draws: int = 6000) -> None:
    """Sampling acceptance of a deterministic depth-2 ``tree`` (``draft_probs=None``) emits its first two
    tokens with the target's joint distribution, and every accepted depth (0, 1, 2) happens."""
    p0, p_next = _targets()
    target = torch.cat([p0[None], p_next[tree.tokens]])  # [n + 1, V]
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(V, V)
    lengths = torch.zeros(3)
    for _ in range(draws):
        acc = sampling_tree_accept(tree, target, None, generator=g)
        x1, x2 = _two_tokens(tree, acc, p_next, g)
        counts[x1, x2] += 1
        lengths[len(acc.path)] += 1
    assert (lengths > 0).all()  # every depth happened
    _check_exact(counts, p0, p_next)


def test_sampling_tree_accept_with_draft_probs_is_exact():
    p0, p_next = _targets()
    g = torch.Generator().manual_seed(5)
    q0 = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)  # drafts differ from target
    q_next = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)
    counts = torch.zeros(V, V)
    lengths = torch.zeros(3)
    for _ in range(6000):
        # 3 i.i.d. children of the root, 2 i.i.d. children each (SpecInfer-style sampled tree).
        kids = torch.multinomial(q0, 3, replacement=True, generator=g)
        grand = torch.stack([torch.multinomial(q_next[k], 2, replacement=True, generator=g) for k in kids])
        tree = TokenTree(torch.cat([kids, grand.flatten()]), T([-1, -1, -1, 0, 0, 1, 1, 2, 2]))
        draft = torch.cat([q0.expand(3, V), q_next[kids].repeat_interleave(2, dim=0)])
        target = torch.cat([p0[None], p_next[tree.tokens]])
        acc = sampling_tree_accept(tree, target, draft, generator=g)
        x1, x2 = _two_tokens(tree, acc, p_next, g)
        counts[x1, x2] += 1
        lengths[len(acc.path)] += 1
    assert (lengths > 0).all()
    _check_exact(counts, p0, p_next)


def test_sampling_tree_accept_edge_cases():
    tree = TokenTree(T([1, 2]), T([-1, 0]))
    onehot = torch.eye(V)
    # Target certain of the drafted tokens: both accepted, bonus from the leaf's row.
    acc = sampling_tree_accept(tree, onehot[[1, 2, 4]], None)
    assert acc.path.tolist() == [0, 1] and acc.bonus == 4
    # Target excluding the child: rejected, the bonus comes from the residual.
    acc = sampling_tree_accept(tree, onehot[[3, 2, 4]], onehot[[1, 2]])
    assert acc.path.tolist() == [] and acc.bonus == 3
    with pytest.raises(ValueError, match="probability 0"):
        sampling_tree_accept(tree, onehot[[1, 2, 4]], onehot[[3, 3]])
    with pytest.raises(ValueError, match=r"\[n \+ 1, V\]"):
        sampling_tree_accept(tree, onehot[[1, 2]], None)


# -- one forward over the tree, and the cache afterwards ----------------------------------------------

PREFIX = T([1, 17, 42, 5, 63, 8, 21, 90, 33, 12, 7])  # 10 cached + the root
# Two deep branches from the root (depth 6: positions 11..16 with window 8 lose the first prefix
# tokens) and a short side branch under node 1; branch 2 sits late in the linearized tree while
# its positions are early, so a window taken over indices instead of positions would show.
TREE = TokenTree(
    T([44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57]), T([-1, 0, 1, 2, 3, 4, -1, 6, 7, 8, 9, 10, 1, 12])
)


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def model(request):
    return tm.llama() if request.param == "llama" else tm.gemma3(sliding_window=8)


def _prefilled(model) -> tuple[DynamicCache, int]:
    cache = DynamicCache()
    model(input_ids=PREFIX[None, :-1], past_key_values=cache, use_cache=True)
    return cache, PREFIX.shape[0] - 1


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_verify_tree_equals_per_branch_forwards(model, impl):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        cache, prefix_len = _prefilled(model)
        logits = verify_tree(model, cache, prefix_len, TREE, PREFIX[-1])
        assert logits.shape == (len(TREE) + 1, model.config.vocab_size)
        assert cache.get_seq_length() == prefix_len + 1 + len(TREE)
        for path in TREE.paths():
            ref = model(input_ids=torch.cat([PREFIX, TREE.tokens[path]])[None]).logits[0, prefix_len:]
            got = logits[[0] + [i + 1 for i in path]]
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
        cache_int, _ = _prefilled(model)  # a host-int root: the same inputs, the same logits
        assert torch.equal(verify_tree(model, cache_int, prefix_len, TREE, int(PREFIX[-1])), logits)
        if model.config.model_type == "gemma3_text":
            # The sliding window matters here: one windowless mask for every layer gives other logits.
            cache2, _ = _prefilled(model)
            rooted = TREE.with_root(PREFIX[-1])
            plain = model(
                input_ids=rooted.tokens[None],
                position_ids=tree_position_ids(prefix_len, rooted),
                attention_mask=tree_attention_mask(prefix_len, rooted),
                past_key_values=cache2,
            ).logits[0]
            assert (plain - logits).abs().max() > 1e-3


@pytest.mark.parametrize("path", [[6, 7, 8], [0, 1, 12, 13], [0, 1, 2], []])
def test_keep_path_equals_plain_forward_cache(model, path):
    model.set_attn_implementation("sdpa")
    path = T(path, dtype=torch.long)
    with torch.no_grad():
        cache, prefix_len = _prefilled(model)
        logits = verify_tree(model, cache, prefix_len, TREE, PREFIX[-1])
        keep_path(cache, prefix_len, path)
        accepted = torch.cat([PREFIX, TREE.tokens[path]])
        assert cache.get_seq_length() == accepted.shape[0]
        ref_cache = DynamicCache()
        ref = model(input_ids=accepted[None], past_key_values=ref_cache, use_cache=True).logits[0, -1]
        torch.testing.assert_close(logits[(int(path[-1]) + 1) if len(path) else 0], ref, rtol=1e-4, atol=1e-4)
        for mine, theirs in zip(cache.layers, ref_cache.layers):
            torch.testing.assert_close(mine.keys, theirs.keys, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(mine.values, theirs.values, rtol=1e-4, atol=1e-4)
        nxt = T([[29]])
        got = model(input_ids=nxt, past_key_values=cache, use_cache=True).logits[0, -1]
        want = model(input_ids=torch.cat([accepted, nxt[0]])[None]).logits[0, -1]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_verify_tree_refuses_bad_caches():
    model = tm.gemma3(sliding_window=8)
    cache, prefix_len = _prefilled(model)
    with pytest.raises(ValueError, match="expected prefix_len"):
        verify_tree(model, cache, prefix_len + 1, TREE, PREFIX[-1])
    sliding = DynamicCache(config=model.config)
    model(input_ids=PREFIX[None, :-1], past_key_values=sliding, use_cache=True)
    with pytest.raises(ValueError, match="does not keep every position"):
        verify_tree(model, sliding, prefix_len, TREE, PREFIX[-1])
