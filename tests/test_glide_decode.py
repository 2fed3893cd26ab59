"""GLIDE + CAPE decoding (hf_cascade.glide, Du et al. ICML 2024): CAPE's expansion sizes and sets and the
verification input of Algorithm 2 on hand-made inputs, a CAPE tree forward against per-branch forwards,
greedy parity with plain generate for GLIDE variants beyond the contract's (a 2-layer GLIDE, no
cross-attention, min_confidence, verify_cost; with and without CAPE; EOS lists and max_length cuts) with
their statistics, the glimpse of the target's cache without copies and the draft-cache rollback,
statistics and errors. The contract's GLIDE and GLIDE+CAPE (1 layer, cross 0.3: parity on every target
setting, exact sampling, no state across calls): tests/test_contract.py. Sampling: test_glide_sampling.py."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

import hf_cascade  # noqa: F401  (installs the generate() hook)
from hf_cascade import GlideSettings, Policy
from hf_cascade.bench.tiny import echo_glide  # noqa: F401  (imported from here by other tests)
from hf_cascade.core import tree_attention_mask, tree_position_ids, verify_tree
from hf_cascade.glide import (
    CapeSettings,
    GlideAssistant,
    GlideDrafter,
    GlideStats,
    cap_expansions,
    expanded_proposal,
    expansion_sets,
)
from tests import tiny_models as tm
from tests.test_sampling import PROMPT as SPROMPT
from tests.test_sampling import small  # noqa: F401  (fixture)
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

T = torch.tensor


@pytest.fixture(scope="module")
def targets():
    return {"llama": tm.llama_target(), "gemma3": tm.gemma3_target()}


# -- CAPE on hand-made inputs (Section 4.2, Algorithms 1-2) ---------------------------------------------
def test_expansion_sizes_golden():
    s = CapeSettings()
    p = T([0.05, 0.3, 0.3001, 0.6, 0.61, 0.8, 0.8001, 1.0])
    assert s.expansion_sizes(p).tolist() == [7, 7, 5, 5, 3, 3, 1, 1]  # (0,.3] (.3,.6] (.6,.8] (.8,1]
    custom = CapeSettings(sizes=(4, 0), thresholds=(0.5,))
    assert custom.expansion_sizes(T([0.2, 0.5, 0.9])).tolist() == [4, 4, 0]
    for bad in (
        dict(sizes=(1, 2)),
        dict(sizes=(3, 2, 1, -1)),
        dict(thresholds=(0.6, 0.3, 0.8)),
        dict(thresholds=(0.0, 0.5, 0.8)),
        dict(max_nodes=0),
    ):
        with pytest.raises(ValueError):
            CapeSettings(**bad)


def test_expansion_sets_golden():
    probs = T(
        [
            [0.05, 0.50, 0.10, 0.20, 0.15],  # main 1 (p=.5 -> K=5, only 4 others exist)
            [0.02, 0.03, 0.90, 0.04, 0.01],  # main 2 (p=.9 -> K=1)
            [0.30, 0.25, 0.20, 0.15, 0.10],
        ]
    )  # main 0 (p=.3 -> K=7 -> 4)
    main = probs.argmax(-1)
    sizes = CapeSettings().expansion_sizes(probs.max(-1).values)
    assert sizes.tolist() == [5, 1, 7]
    sets = expansion_sets(probs, main, sizes)
    assert [x.tolist() for x in sets] == [[3, 4, 2, 0], [3], [1, 2, 3, 4]]
    # The main token is excluded even when it is not the row's argmax; K = 0 gives an empty set.
    assert [x.tolist() for x in expansion_sets(probs, T([3, 2, 0]), T([2, 0, 1]))] == [[1, 4], [], [1]]
    assert [x.tolist() for x in cap_expansions(sets, 3, 8)] == [[3, 4, 2, 0], [3], []]
    assert [x.tolist() for x in cap_expansions(sets, 3, 6)] == [[3, 4, 2], [], []]
    assert cap_expansions(sets, 3, None) == sets
    # min_prob (not in the paper) drops siblings whose path the draft finds unlikely after S(p) sized the sets:
    # path probability = own probability x main confidences above (1, .5, .5 * .9 = .45 for the three rows).
    assert [x.tolist() for x in expansion_sets(probs, main, sizes, min_prob=0.1)] == [[3, 4, 2], [], [1]]
    assert [x.tolist() for x in expansion_sets(probs, main, sizes, min_prob=0.085)] == [[3, 4, 2], [], [1, 2]]
    assert [x.tolist() for x in expansion_sets(probs, main, sizes, min_prob=0.2)] == [[3], [], []]
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="min_prob"):
            CapeSettings(min_prob=bad)


def test_expansion_read_is_the_sets_and_its_first_rows_are_the_first_rows_sets():
    """The folded read (:func:`expansion_read` + :func:`parse_expansions`, what the accelerator schedule reads with the
    main path) gives :func:`expansion_sets`' sets, and the sets of the first ``m`` of ``k`` rows are those computed
    from the first ``m`` rows alone (a row's set depends on the rows before it only: its path-probability floor)."""
    from hf_cascade.glide.cape import expansion_read, parse_expansions

    probs = T([[0.05, 0.50, 0.10, 0.20, 0.15], [0.02, 0.03, 0.90, 0.04, 0.01], [0.30, 0.25, 0.20, 0.15, 0.10]])
    main = probs.argmax(-1)
    sizes = CapeSettings().expansion_sizes(probs.max(-1).values)
    for min_prob in (0.0, 0.085):
        flat, layout = expansion_read(probs, main, sizes, min_prob, max_size=7, to_target=lambda x: x + 100)
        sets, set_probs, targets = parse_expansions(flat.tolist(), layout)
        assert sets == [x.tolist() for x in expansion_sets(probs, main, sizes, min_prob)]
        assert targets == [[t + 100 for t in x] for x in sets]
        assert set_probs == [[probs[i, t].item() for t in x] for i, x in enumerate(sets)]
        for m in (1, 2):
            first, layout_m = expansion_read(probs[:m], main[:m], sizes[:m], min_prob, max_size=7)
            assert parse_expansions(flat.tolist(), layout, rows=m)[0] == parse_expansions(first.tolist(), layout_m)[0]


def test_cape_verification_input_golden():
    """Algorithms 1-2 on a hand-made proposal: main path [a b c] (draft ids 1 2 3, target id = draft id + 20)
    with S(p) = 2 / 0 / 1 for p in (0,.5] (.5,.8] (.8,1]: X_0 = {d e}, X_1 = {}, X_2 = {f}. The verified
    input is the root (the last verified token) followed by the linearized proposal."""
    probs = T(
        [
            [0.05, 0.40, 0.10, 0.05, 0.25, 0.15],  # main 1, p=.40 -> K=2: 4, 5
            [0.10, 0.05, 0.70, 0.05, 0.05, 0.05],  # main 2, p=.70 -> K=0
            [0.05, 0.03, 0.04, 0.85, 0.01, 0.02],
        ]
    )  # main 3, p=.85 -> K=1: 0
    settings = CapeSettings(sizes=(2, 0, 1), thresholds=(0.5, 0.8))
    tree, sets, node_probs = expanded_proposal(probs, T([1, 2, 3]), settings, lambda x: x + 20)
    a, b, c, d, e, f = 21, 22, 23, 24, 25, 20
    assert [x.tolist() for x in sets] == [[d, e], [], [f]]
    torch.testing.assert_close(T(node_probs), T([0.40, 0.70, 0.85, 0.25, 0.15, 0.05]))  # each token's own p
    assert tree.tokens.tolist() == [a, b, c, d, e, f]  # input: main, then X_0, X_1, X_2
    assert tree.parents.tolist() == [-1, 0, 1, -1, -1, 1]
    assert tree.position_offsets().tolist() == [0, 1, 2, 0, 0, 2]  # input_pi
    P = 4  # verified tokens before the root
    full = tree.with_root(T(99))
    assert full.tokens.tolist() == [99, a, b, c, d, e, f]
    assert tree_position_ids(P, full).tolist() == [[4, 5, 6, 7, 5, 5, 7]]
    rows = [
        "11111......",  # root
        "111111.....",  # a
        "1111111....",  # b
        "11111111...",  # c
        "11111...1..",  # d: the root and itself (Mask_CAPE: j <= gamma and pos(i) > j, or i = j)
        "11111....1.",  # e
        "1111111...1",
    ]  # f: a and b (main tokens before its position), itself
    golden = torch.tensor([[0.0 if ch == "1" else torch.finfo(torch.float32).min for ch in r] for r in rows])
    assert torch.equal(tree_attention_mask(P, full)[0, 0], golden)
    chain, none, chain_probs = expanded_proposal(probs, T([1, 2, 3]), None, lambda x: x + 20)
    assert chain.tokens.tolist() == [a, b, c] and chain.parents.tolist() == [-1, 0, 1] and none == []
    torch.testing.assert_close(T(chain_probs), T([0.40, 0.70, 0.85]))
    capped, _, _ = expanded_proposal(
        probs, T([1, 2, 3]), CapeSettings((2, 0, 1), (0.5, 0.8), max_nodes=4), lambda x: x + 20
    )
    assert capped.tokens.tolist() == [a, b, c, d] and capped.parents.tolist() == [-1, 0, 1, -1]
    paper, _, _ = expanded_proposal(probs, T([1, 2, 3]), CapeSettings())  # 7/5/3/1: K = 5 (all), 3, 1
    assert paper.num_nodes == 3 + 5 + 3 + 1


def test_cape_tree_forward_equals_per_branch_forwards(targets):
    model = targets["gemma3"]  # sliding window 8 < prefix + depth
    prefix = T([1, 5, 9, 13, 17, 21, 25, 29, 33, 37])
    probs = torch.linspace(1, 2, 96).repeat(4, 1).softmax(-1)  # flat: K = 7 everywhere
    tree, _, _ = expanded_proposal(probs, T([40, 41, 42, 43]), CapeSettings())
    assert tree.num_nodes == 4 + 4 * 7
    with torch.no_grad():
        cache = DynamicCache()
        model(input_ids=prefix[None, :-1], past_key_values=cache, use_cache=True)
        logits = verify_tree(model, cache, prefix.shape[0] - 1, tree, prefix[-1])
        for path in tree.paths():
            ref = model(input_ids=torch.cat([prefix, tree.tokens[path]])[None]).logits[0, prefix.shape[0] - 1 :]
            torch.testing.assert_close(logits[[0] + [i + 1 for i in path]], ref, rtol=1e-4, atol=1e-4)


# -- greedy parity ------------------------------------------------------------------------------------
CASES = [("llama", 0.0, 1), ("gemma3", 0.3, 2)]  # ("gemma3", 0.3, 1): tests/test_contract.py


@pytest.mark.parametrize("name,cross,layers", CASES)
@pytest.mark.parametrize("cape", [False, True])
def test_greedy_parity(targets, name, cross, layers, cape):
    target = targets[name]
    a = GlideAssistant(
        echo_glide(target, cross, layers),
        settings=GlideSettings(cape=cape),
        policy=Policy(cost_aware=False),
        cpu_kernels=False,
    )  # the paper's shape
    accepted = rejected = expansions = 0
    for prompt in (ids(1, 5, 9), ids(1, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39)):
        expected = target.generate(prompt, do_sample=False, max_new_tokens=32)
        got = target.generate(prompt, do_sample=False, max_new_tokens=32, assistant_model=a)
        assert got.tolist() == expected.tolist()
        s = a.last_stats
        assert isinstance(s, GlideStats) and s.new_tokens == got.shape[1] - prompt.shape[1]
        accepted += sum(s.accepted_per_call)
        rejected += sum(d > m for d, m in zip(s.main_lengths, s.main_accepted))
        expansions += s.expansion_accepted
        assert all(m <= 5 for m in s.main_lengths) and len(s.main_lengths) == len(s.main_accepted)
        drafted = [n for n in s.tree_sizes if n]  # the last step may have no budget
        assert len(drafted) == len(s.main_lengths) == s.target_calls - s.skipped_drafts
        if cape:
            assert all(n == m + sum(x) for n, m, x in zip(drafted, s.main_lengths, s.expansion_sizes))
        else:
            assert drafted == s.main_lengths and s.expansion_accepted == 0
    assert accepted > 0 and rejected > 0  # speculation, with rejections
    assert (expansions > 0) == cape


@pytest.mark.parametrize("cape", [False, True])
def test_greedy_parity_eos_and_max_length_cuts(targets, cape):
    target = targets["gemma3"]
    a = GlideAssistant(echo_glide(target, 0.3), settings=GlideSettings(cape=cape), cpu_kernels=False)
    prompt = ids(1, 5, 9)
    plain = target.generate(prompt, do_sample=False, max_new_tokens=40, eos_token_id=None)[0, 3:].tolist()
    eos = next(t for t in plain[8:] if t not in plain[:8])  # first appears after 8 new tokens
    for kw in (
        {"eos_token_id": eos, "max_new_tokens": 40},
        {"max_new_tokens": 7},
        {"max_new_tokens": 1},
        {"eos_token_id": [eos, 3], "max_new_tokens": 40},
    ):
        expected = target.generate(prompt, do_sample=False, **kw)
        got = target.generate(prompt, do_sample=False, assistant_model=a, **kw)
        assert got.tolist() == expected.tolist(), kw
        if "eos_token_id" in kw:
            assert got[0, -1] == eos and got.shape[1] < 3 + 40


@pytest.mark.parametrize("cape", [False, True])
def test_min_confidence_stops_the_main_path(targets, cape):
    """``min_confidence`` (not in the paper): the main path ends at the first token the draft gives less; a
    chain leaves that token out, CAPE verifies it with its expansions. Outputs stay those of plain."""
    target = targets["gemma3"]
    mc = 0.5
    a = GlideAssistant(
        echo_glide(target, 0.3),
        settings=GlideSettings(cape=CapeSettings(min_prob=0.3) if cape else None, min_confidence=mc),
        policy=Policy(cost_aware=False),
        cpu_kernels=False,
    )
    for prompt in (ids(1, 5, 9), ids(1, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39)):
        expected = target.generate(prompt, do_sample=False, max_new_tokens=32)
        got = target.generate(prompt, do_sample=False, max_new_tokens=32, assistant_model=a)
        assert got.tolist() == expected.tolist()
        s = a.last_stats
        assert len(s.main_lengths) == len(s.confidences) and sum(s.accepted_per_call) > 0
        for n, conf in zip(s.main_lengths, s.confidences):
            assert len(conf) == n
            sure = conf if not cape else conf[:-1]  # CAPE keeps the unsure token last,
            assert all(c >= mc for c in sure)
            if conf and conf[-1] < mc:  # ... when its path reaches the floor
                assert cape and torch.tensor(conf).prod() >= 0.3 - 1e-4
        assert 0 in s.main_lengths  # unsure at once: a plain step
    unsure = [c[-1] for c in a.last_stats.confidences if c]
    assert any(c < mc for c in unsure) == cape


@pytest.mark.parametrize("cape", [False, True])
def test_verify_cost_verifies_what_pays_and_keeps_parity(targets, cape, free_drafts):
    """``Policy.cost_aware`` (the default, hf_cascade.core.payoff; not in the paper): where verified rows are cheap each
    step verifies an ancestor-closed subset of the drafted tree; where they are dear the drafter mostly stays
    off (a plain step, with a few exploring drafts); outputs stay those of plain generate either way. (Draft
    forwards cost nothing here: ``free_drafts``.)"""
    from hf_cascade.core.payoff import VerifyCost

    target = targets["gemma3"]
    prompts = (ids(1, 5, 9), ids(1, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39))
    for profile, drafting in (((1.0, 1.0, 1.02, 1.05, 1.1, 1.2), True), ((1.0, 3.0, 3.5, 4.0), False)):
        a = GlideAssistant(
            echo_glide(target, 0.3),
            settings=GlideSettings(cape=cape),
            policy=Policy(verify_cost=VerifyCost(profile)),
            cpu_kernels=False,
        )
        drafted = verified = accepted = skipped = calls = 0
        for prompt in prompts:
            expected = target.generate(prompt, do_sample=False, max_new_tokens=32)
            got = target.generate(prompt, do_sample=False, max_new_tokens=32, assistant_model=a)
            assert got.tolist() == expected.tolist()
            s = a.last_stats
            assert len(s.drafted_nodes) == len(s.main_lengths) == s.target_calls - s.skipped_drafts
            drafted, verified = drafted + sum(s.drafted_nodes), verified + sum(s.tree_sizes)
            accepted, skipped, calls = (
                accepted + sum(s.accepted_per_call),
                skipped + s.skipped_drafts,
                calls + s.target_calls,
            )
        assert verified <= drafted
        if drafting:
            assert accepted > 0 and (verified < drafted or not cape) and skipped < calls / 4
        else:
            assert skipped > calls / 2
    with pytest.raises(TypeError, match="VerifyCost"):
        GlideAssistant(echo_glide(target), policy=Policy(verify_cost=(1.0, 1.5)))


# -- the glimpse and the draft cache -----------------------------------------------------------------------
class Spy(GlideDrafter):
    """Checks at every step: the draft reads the target cache as it is (its own tensors when there are no query
    heads to repeat them to; repeated once per draft otherwise) holding ``L - 1`` positions (the KV cache delay),
    and its incremental first forward equals a from-scratch forward."""

    steps = 0

    def draft_tree(self, seq, state):
        kv = self.glide.target_kv(state.cache) if state.cache.get_seq_length() else None
        seen = []
        forward = self.glide.forward

        def spy(*args, **kw):
            seen.append(kw.get("target_key_values"))
            return forward(*args, **kw)

        self.glide.forward = spy
        try:
            tree, probs = super().draft_tree(seq, state)
        finally:
            del self.glide.forward
        if kv is not None and seen:
            layer = self.glide.config.target_layer_ids[0]
            keys = state.cache.layers[layer].keys
            cross = self.glide.model.layers[0].cross_attn
            read = cross.read_target(keys, keys)[0]  # repeated to the query heads
            assert all(s[0][0] is seen[0][0][0] for s in seen)  # read once per draft
            assert torch.equal(seen[0][0][0], read)  # the cache as it is now
            if cross.num_heads == keys.shape[1]:
                assert seen[0][0][0] is keys  # nothing to repeat: no copy
            assert all(s[0][0].shape[-2] == seq.shape[0] - 1 for s in seen)  # everything but the root
        if seen:
            fresh = self.glide(seq[None], target_key_values=kv, full_vocab=False).logits[0, -1].softmax(-1)
            assert int(tree.tokens[0]) == int(fresh.argmax())  # shared vocabulary
            assert self.record.confidences[-1][0] == pytest.approx(float(fresh.max()), abs=1e-4)
            assert self.cache.get_seq_length() == seq.shape[0] + self.record.main_lengths[-1] - 1
        Spy.steps += 1
        return tree, probs


def test_glimpse_without_copy_and_cache_rollback(targets, monkeypatch):
    target = targets["gemma3"]
    monkeypatch.setattr("hf_cascade.glide.assistant.GlideDrafter", Spy)
    a = GlideAssistant(echo_glide(target, 0.3), policy=Policy(cost_aware=False), cpu_kernels=False)
    prompt = ids(1, 5, 9, 13)
    expected = target.generate(prompt, do_sample=False, max_new_tokens=30)
    Spy.steps = 0
    got = target.generate(prompt, do_sample=False, max_new_tokens=30, assistant_model=a)
    assert got.tolist() == expected.tolist() and Spy.steps == a.last_stats.target_calls > 3
    assert sum(a.last_stats.accepted_per_call) > 0


def test_stats_as_data(targets):
    target = targets["gemma3"]
    a = GlideAssistant(
        echo_glide(target, 0.3),
        settings=GlideSettings(draft_length=3, cape=CapeSettings(max_nodes=12)),
        policy=Policy(cost_aware=False),
        cpu_kernels=False,
    )
    target.generate(ids(1, 5, 9), do_sample=False, max_new_tokens=30, assistant_model=a)
    s = a.last_stats
    assert max(s.tree_sizes) <= 12 and max(s.main_lengths) <= 3
    assert all(0 < c <= 1 for step in s.confidences for c in step)
    assert s.draft_forwards == sum(s.main_lengths) and s.draft_forward_cost > 0 and s.draft_cost_ratio > 0
    d = s.to_dict()
    assert {"draft_forward_cost", "expansion_sizes", "main_accepted", "tokens_per_target_call"} <= set(d)
    assert s.levels[-1].name == "glide+cape" and s.levels[-1].forward_calls == s.draft_forwards


# -- errors ------------------------------------------------------------------------------------------------
def test_errors(targets, small):
    g = echo_glide(targets["llama"], 0.0)
    with pytest.raises(ValueError, match="vocabulary"):  # built for V=96, target has 16
        small["target"].generate(SPROMPT, max_new_tokens=3, assistant_model=GlideAssistant(g))
    other = tm.llama(layers=2, hidden=48, seed=5)  # head size 12, not 8
    with pytest.raises(ValueError, match="heads of size 12"):
        other.generate(ids(1, 5), max_new_tokens=3, assistant_model=GlideAssistant(g))
    deeper = tm.llama(layers=3, seed=5)  # same geometry, 3 layers instead of 2
    with pytest.raises(ValueError, match="layers"):
        deeper.generate(ids(1, 5), max_new_tokens=3, assistant_model=GlideAssistant(g))
    with pytest.raises(TypeError, match="GlideForCausalLM"):
        GlideAssistant(targets["llama"])
    with pytest.raises(ValueError, match="draft_length"):
        GlideAssistant(g, settings=GlideSettings(draft_length=0))
    with pytest.raises(ValueError, match="thresholds"):
        GlideAssistant(g, settings=GlideSettings(cape=CapeSettings(sizes=(3, 1), thresholds=(1.5,))))
