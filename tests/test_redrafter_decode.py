"""ReDrafter decoding (hf_cascade.redrafter): the paper's dynamic tree attention on golden tensors,
beam search against brute force, a tree-masked forward equal to per-beam forwards, and decoding
through ``generate()`` with trained tiny heads: greedy output identical to plain ``generate`` (beam
widths / lengths, packed and flat trees, EOS and length cuts), no extra target forward, beam width
above 1 accepting more, clear errors. The contract's 4 x 4 beams on every target setting, and state not
leaking between calls: tests/test_contract.py."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import DynamicCache

from hf_cascade import (
    Policy,
    ReDrafterAssistant,
    ReDrafterConfig,
    ReDrafterModel,
    ReDrafterSettings,
    ReDrafterStats,
)
from hf_cascade.core import tree_attention_mask, verify_tree
from hf_cascade.core.structure import prefix_tree
from hf_cascade.measure import measured_verify_cost
from hf_cascade.redrafter import beam_search, beams_tree, flat_tree
from hf_cascade.redrafter.beam import unpack
from tests import tiny_models as tm
from tests.redrafter_helpers import fit_head, random_head
from tests.test_greedy_parity import ONE_TOKEN, REPETITIVE, models, plain
from tests.test_tree import PAPER_BEAMS
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

T = torch.tensor
NEG = torch.finfo(torch.float32).min
NEW = 30


# -- golden tensors: the paper's example (Listing 1 / Figure 2) ------------------------------------


def test_paper_example_tree_mask_and_flat_layout():
    tree = beams_tree(PAPER_BEAMS)  # 12 beam tokens -> 7 nodes
    assert tree.tokens.tolist() == [91, 92, 93, 95, 94, 96, 97]
    # node i attends to itself and its ancestors: 91 <- 92 <- {93 <- {95, 97}, 94 <- 96}
    assert torch.equal(
        tree.ancestor_mask().int(),
        T(
            [
                [1, 0, 0, 0, 0, 0, 0],
                [1, 1, 0, 0, 0, 0, 0],
                [1, 1, 1, 0, 0, 0, 0],
                [1, 1, 1, 1, 0, 0, 0],
                [1, 1, 0, 0, 1, 0, 0],
                [1, 1, 0, 0, 1, 1, 0],
                [1, 1, 1, 0, 0, 0, 1],
            ]
        ).int(),
    )
    # the additive mask the target gets after 2 cached tokens and the root (verify_tree adds the root)
    rooted = tree.with_root(90)
    mask = tree_attention_mask(2, rooted)[0, 0]
    assert mask.shape == (8, 10) and bool((mask[:, :2] == 0).all())
    assert torch.equal(mask[:, 2:] == 0, rooted.ancestor_mask())
    assert mask[3, 2 + 4] == NEG and mask[7, 2 + 3] == 0  # 93 !-> 94 ; 97 -> 93
    flat = flat_tree(PAPER_BEAMS)
    assert flat.tokens.tolist() == PAPER_BEAMS.flatten().tolist()
    assert flat.parents.tolist() == [-1, 0, 1, 2, -1, 4, 5, 6, -1, 8, 9, 10]
    assert flat.paths() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert len(beams_tree(PAPER_BEAMS, dedupe=False)) == 12
    with pytest.raises(ValueError, match=r"\[w, L\]"):
        flat_tree(T([1, 2]))


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_tree_masked_forward_equals_per_beam_forwards(name):
    """One forward over the packed tree (and over the flat beams) gives every beam's logits, unpacked
    to ``[w, L, V]``, equal to running each beam alone (gemma3: through its sliding window)."""
    model = tm.llama() if name == "llama" else tm.gemma3(sliding_window=4)
    prefix = T([1, 17, 42, 5, 63, 8, 21])
    g = torch.Generator().manual_seed(0)
    beams = torch.randint(10, 13, (5, 6), generator=g)  # 3 tokens: many shared prefixes
    beams[3] = beams[1]
    tree, beam_to_node, _ = prefix_tree(beams)
    assert len(tree) < beams.numel()
    with torch.no_grad():
        per_beam = torch.stack(
            [model(input_ids=torch.cat([prefix, b])[None]).logits[0, prefix.shape[0] :] for b in beams]
        )  # [w, L, V]
        for t, b2n in ((tree, beam_to_node), (flat_tree(beams), torch.arange(beams.numel()).view(beams.shape))):
            cache = DynamicCache()
            model(input_ids=prefix[None, :-1], past_key_values=cache, use_cache=True)
            logits = verify_tree(model, cache, prefix.shape[0] - 1, t, prefix[-1])  # [n + 1, V]
            torch.testing.assert_close(unpack(logits[1:], b2n), per_beam, rtol=1e-4, atol=1e-4)


# -- beam search -------------------------------------------------------------------------------------


def _head(vocab=8, hidden=6, subset=None, seed=0) -> ReDrafterModel:
    torch.manual_seed(seed)
    head = ReDrafterModel(
        ReDrafterConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            num_draft_layers=1,
            initializer_range=0.5,
            draft_vocab_size=None if subset is None else len(subset),
        )
    ).eval()
    if subset is not None:
        head.set_vocab_subset(subset)
    return head


def _joint_logp(head, x, emb, root, seq) -> float:
    """log p(seq | root, x) under the head, from its teacher-forced forward (independent of beam_search)."""
    tokens = [root] + list(seq[:-1])
    logits = head(hidden_states=x[None], inputs_embeds=emb(T(tokens))[None], full_vocab=True).logits[0]
    logp = logits.float().log_softmax(-1)
    return float(sum(logp[k, t] for k, t in enumerate(seq)))


@pytest.mark.parametrize("subset", [None, [0, 2, 3, 5, 7]])
def test_beam_search_against_brute_force(subset):
    head = _head(subset=subset)
    emb = torch.nn.Embedding(8, 6)
    g = torch.Generator().manual_seed(1)
    x, root = torch.randn(6, generator=g), 4
    cols = list(range(8)) if subset is None else subset
    with torch.no_grad():
        every = sorted(
            ((_joint_logp(head, x, emb, root, s), s) for s in itertools.product(cols, repeat=2)), key=lambda t: -t[0]
        )
        # width >= N ** L: every sequence, best first
        beams, scores = beam_search(head, x, root, emb, width=100, length=2)
        assert beams.shape == (len(cols) ** 2, 2)
        assert [tuple(b) for b in beams.tolist()] == [s for _, s in every]
        torch.testing.assert_close(scores, T([lp for lp, _ in every]), rtol=1e-5, atol=1e-5)
        # width 1: the head's greedy chain
        chain, _ = beam_search(head, x, root, emb, width=1, length=4)
        seq = []
        for _ in range(4):
            logits = head(hidden_states=x[None], inputs_embeds=emb(T([root] + seq))[None]).logits[0, -1]
            seq.append(int(logits.argmax()))
        assert chain.tolist() == [seq]
        # width 3, length 3: a naive beam search that rescores every prefix from scratch
        kept = [()]
        for _ in range(3):
            cands = [p + (t,) for p in kept for t in cols]
            kept = sorted(cands, key=lambda s: -_joint_logp(head, x, emb, root, s))[:3]
        beams, _ = beam_search(head, x, root, emb, width=3, length=3)
        assert [tuple(b) for b in beams.tolist()] == kept
    with pytest.raises(ValueError, match="width >= 1"):
        beam_search(head, x, root, emb, width=0, length=2)


# -- decoding through generate() ---------------------------------------------------------------------


@pytest.fixture(params=["llama", "gemma3"], scope="module")
def m(request):
    target = models(request.param)["target"]
    return {"target": target, "head": fit_head(target, request.param, steps=80)}


def ours(target, prompt, assistant, **kw):
    kw.setdefault("max_new_tokens", NEW)
    return target.generate(prompt, do_sample=False, assistant_model=assistant, **kw)


def assert_parity(target, prompt, assistant, **kw) -> ReDrafterStats:
    kw.setdefault("max_new_tokens", NEW)
    expected = plain(target, prompt, **kw)
    got = ours(target, prompt, assistant, **kw)
    assert got.tolist() == expected.tolist()
    stats = assistant.last_stats
    assert isinstance(stats, ReDrafterStats) and stats.new_tokens == got.shape[1] - prompt.shape[1]
    assert len(stats.beam_tokens) == len(stats.drafted_nodes) == stats.target_calls - stats.skipped_drafts
    return stats


@pytest.mark.parametrize(
    "width, length, dedupe", [(1, 1, True), (1, 5, True), (4, 5, True), (4, 5, False), (3, 2, True), (8, 6, True)]
)
@pytest.mark.parametrize("prompt", [REPETITIVE, ONE_TOKEN], ids=["repetitive", "one_token"])
def test_greedy_parity(m, width, length, dedupe, prompt):
    stats = assert_parity(
        m["target"],
        prompt,
        ReDrafterAssistant(
            m["head"],
            settings=ReDrafterSettings(beam_width=width, beam_length=length, dedupe=dedupe),
            policy=Policy(cost_aware=False),
        ),
    )
    assert max(stats.tree_depths) <= length and max(stats.tree_leaves) <= width
    assert sum(stats.accepted_per_call) > 0  # the trained head's drafts are used
    if prompt is ONE_TOKEN:  # no hidden state before the first step
        assert stats.tree_sizes[0] == 0 and stats.skipped_drafts >= 1


def test_packed_and_flat_trees_accept_the_same_tokens(m):
    """Dedupe only removes duplicated work: the same accepted paths (by tokens), fewer tree nodes."""
    prompts = [REPETITIVE, ids(1, 40, 41, 42), ids(1, 70, 9, 70, 9)]
    ratios = []
    for prompt in prompts:
        packed = assert_parity(
            m["target"],
            prompt,
            ReDrafterAssistant(
                m["head"],
                settings=ReDrafterSettings(beam_width=6, beam_length=4, dedupe=True),
                policy=Policy(cost_aware=False),
            ),
        )
        flat = assert_parity(
            m["target"],
            prompt,
            ReDrafterAssistant(
                m["head"],
                settings=ReDrafterSettings(beam_width=6, beam_length=4, dedupe=False),
                policy=Policy(cost_aware=False),
            ),
        )
        assert packed.accepted_per_call == flat.accepted_per_call
        assert flat.drafted_nodes == flat.beam_tokens and flat.compression_ratio == 1.0
        assert packed.beam_tokens == flat.beam_tokens
        assert all(p <= f for p, f in zip(packed.drafted_nodes, flat.drafted_nodes))
        ratios.append(packed.compression_ratio)
    assert min(ratios) > 1.0, ratios  # beams do share prefixes
    d = packed.to_dict()
    assert d["compression_ratio"] == packed.compression_ratio and d["beam_tokens"] == packed.beam_tokens
    assert packed.draft_cost_ratio > 0 and "draft" in d["phase_seconds"]


def test_no_extra_target_forward(m):
    """The head drafts from the hidden state the previous target pass left: prefill + one forward per
    step (counted on the target's decoder, which verification calls without the output head)."""
    target = m["target"]
    a = ReDrafterAssistant(m["head"], settings=ReDrafterSettings(beam_width=4, beam_length=4))
    measured_verify_cost(target)  # the default profile is measured once per process, not counted here
    calls = []
    handle = target.get_decoder().register_forward_hook(lambda mod, args, out: calls.append(1))
    try:
        got = ours(target, REPETITIVE, a)
    finally:
        handle.remove()
    assert got.tolist() == plain(target, REPETITIVE).tolist()
    assert len(calls) == 1 + a.last_stats.target_calls < NEW


def test_eos_and_length_cuts(m):
    target = m["target"]
    free = plain(target, REPETITIVE, max_new_tokens=40)[0, REPETITIVE.shape[1] :].tolist()
    for eos in dict.fromkeys(free[3:12]):
        stats = assert_parity(
            target,
            REPETITIVE,
            ReDrafterAssistant(m["head"], settings=ReDrafterSettings(beam_width=4, beam_length=5)),
            max_new_tokens=40,
            eos_token_id=eos,
        )
        assert stats.new_tokens == free.index(eos) + 1
    for new in (1, 2, 3, 5, 7):
        stats = assert_parity(
            target,
            REPETITIVE,
            ReDrafterAssistant(m["head"], settings=ReDrafterSettings(beam_width=3, beam_length=6)),
            max_new_tokens=new,
        )
        assert stats.new_tokens == new and all(d <= new - 1 for d in stats.tree_depths)


def test_wider_beams_accept_more(m):
    """Count-based: with one draft token the width-4 tree holds the width-1 token, so at every
    context (here: a sampled text, the head's training data is greedy) it accepts at least as much,
    and over many contexts strictly more. Over generations (length 4) width 4 gives more tokens per
    target call than width 1 on these prompts."""
    target, head = m["target"], m["head"]
    emb = target.get_input_embeddings()
    torch.manual_seed(0)
    seq = target.generate(REPETITIVE, do_sample=True, max_new_tokens=60)[0]
    with torch.no_grad():
        out = target(input_ids=seq[None], output_hidden_states=True)
    hidden, greedy_next = out.hidden_states[-1][0], out.logits[0].argmax(-1)  # [L, H], [L]
    hits = {1: 0, 4: 0}
    for p in range(1, seq.shape[0]):  # root seq[p], produced by hidden[p - 1]
        ok = {}
        for w in hits:
            beams, _ = beam_search(head, hidden[p - 1], seq[p], emb, width=w, length=1)
            ok[w] = int(greedy_next[p]) in beams[:, 0].tolist()
            hits[w] += ok[w]
        assert ok[4] >= ok[1]
    assert hits[4] > hits[1], hits
    per_call = {}
    for w in (1, 4):
        calls = tokens = 0
        for prompt in (REPETITIVE, ids(1, 40, 41, 42), ids(1, 70, 9, 70, 9), ids(1, 33, 12)):
            st = assert_parity(
                target,
                prompt,
                ReDrafterAssistant(
                    head, settings=ReDrafterSettings(beam_width=w, beam_length=4), policy=Policy(cost_aware=False)
                ),
            )
            calls, tokens = calls + st.target_calls, tokens + st.new_tokens
        per_call[w] = tokens / calls
    assert per_call[4] >= per_call[1], per_call


def test_untrained_head_still_exact(m):
    assert_parity(
        m["target"],
        REPETITIVE,
        ReDrafterAssistant(random_head(m["target"]), settings=ReDrafterSettings(beam_width=4, beam_length=5)),
    )


def test_errors():
    target = models("llama")["target"]
    head = fit_head(target, "llama", steps=80)
    a = ReDrafterAssistant(head, settings=ReDrafterSettings(beam_width=4, beam_length=4))
    with pytest.raises(ValueError, match="left padding"):  # right padding is refused
        ours(target, torch.cat([REPETITIVE, REPETITIVE]), a, attention_mask=torch.tensor([[1] * 9, [1] * 8 + [0]]))
    with pytest.raises(ValueError, match="beam"):
        ours(target, REPETITIVE, a, num_beams=2)
    other_vocab = ReDrafterModel(ReDrafterConfig(vocab_size=tm.VOCAB + 32, hidden_size=32))
    with pytest.raises(ValueError, match="vocabulary of 128 tokens but the target's has 96"):
        ours(target, REPETITIVE, ReDrafterAssistant(other_vocab))
    other_hidden = ReDrafterModel(ReDrafterConfig(vocab_size=tm.VOCAB, hidden_size=16))
    with pytest.raises(ValueError, match="hidden states of size 16"):
        ours(target, REPETITIVE, ReDrafterAssistant(other_hidden))
    for bad in ({"beam_width": 0}, {"beam_length": 0}):
        with pytest.raises(ValueError, match="beam_width >= 1 and beam_length >= 1"):
            ReDrafterAssistant(head, settings=ReDrafterSettings(**bad))
    with pytest.raises(TypeError, match="ReDrafterModel"):
        ReDrafterAssistant(tm.copy_model(target))
    # nothing half-installed: the same assistant works afterwards
    assert ours(target, REPETITIVE, a).tolist() == plain(target, REPETITIVE).tolist()
