"""The reduced-vocabulary drafter head (hf_cascade.heads.drafter): golden values, Hub round trip as
remote code, strict loading, and greedy parity as an assistant (ours and transformers' own)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList

from hf_cascade import (
    CascadeAssistant,
    CascadeDrafterConfig,
    CascadeDrafterForCausalLM,
    CascadeSettings,
    MaxGram,
    Policy,
)
from hf_cascade.cascade.drafter import _Drafted
from hf_cascade.core.stats import GenerationStats
from hf_cascade.heads.hub import save_hub
from hf_cascade.loading import load_head
from tests import tiny_models as tm
from tests.fresh_process import run_offline
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

N = 48
EVEN = torch.arange(0, tm.VOCAB, 2)  # a subset covering half the target vocabulary


def make_drafter(subset=EVEN, seed: int = 0, tie: bool = True, **kw) -> CascadeDrafterForCausalLM:
    torch.manual_seed(seed)
    config = CascadeDrafterConfig(
        vocab_size=tm.VOCAB,
        draft_vocab_size=len(subset),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tm.BOS,
        eos_token_id=tm.EOS,
        pad_token_id=tm.PAD,
        initializer_range=0.5,
        tie_word_embeddings=tie,
        target_name_or_path="tiny/llama",
        **kw,
    )
    model = CascadeDrafterForCausalLM(config)
    model.set_vocab_subset(subset)
    return tm._finish(model)


def restricted_copy(target, subset=EVEN) -> CascadeDrafterForCausalLM:
    """The target's own weights, restricted to ``subset`` (OOV input row = 0): on prompts inside the
    subset its logits are the target's subset columns."""
    drafter = make_drafter(subset, tie=False)
    with torch.no_grad():
        drafter.model.layers.load_state_dict(target.model.layers.state_dict())
        drafter.model.norm.load_state_dict(target.model.norm.state_dict())
        emb = drafter.model.embed_tokens.weight
        emb.zero_()
        emb[:N] = target.model.embed_tokens.weight[subset]
        drafter.lm_head.weight[:N] = target.lm_head.weight[subset]
    return drafter


# -- golden values ------------------------------------------------------------------------------
def test_to_draft_ids_golden():
    d = make_drafter(torch.arange(0, 96, 2))
    x = torch.tensor([[0, 1, 2, 3, 94, 95], [10, 11, 46, 47, 48, 12]])
    assert d.to_draft_ids(x).tolist() == [[0, N, 1, N, 47, N], [5, N, 23, N, 24, 6]]
    d.set_vocab_subset(list(range(48, 96)))
    assert d.to_draft_ids(torch.tensor([0, 47, 48, 50, 95])).tolist() == [N, N, 0, 2, 47]


def test_set_vocab_subset_validates():
    d = make_drafter()
    for bad in (
        torch.arange(47),
        torch.arange(47, -1, -1),
        torch.tensor([0] * 2 + list(range(2, 48))),
        torch.arange(50, 98),
    ):
        with pytest.raises(ValueError):
            d.set_vocab_subset(bad)


def test_full_vocab_logits_and_loss():
    d = make_drafter()
    x = ids(1, 4, 5, 6, 7, 8, 10)
    full = d(x).logits  # [1, 7, 96]
    reduced = d(x, full_vocab=False).logits  # [1, 7, 48]
    assert full.shape == (1, 7, tm.VOCAB) and reduced.shape == (1, 7, N)
    outside = torch.ones(tm.VOCAB, dtype=torch.bool)
    outside[EVEN] = False
    assert (full[..., outside] == torch.finfo(full.dtype).min).all()
    assert torch.equal(full[..., EVEN], reduced)
    assert d(x, logits_to_keep=2).logits.shape == (1, 2, tm.VOCAB)
    torch.testing.assert_close(d(x, logits_to_keep=2).logits, full[:, -2:])  # matmul of 2 rows: not bitwise

    # Labels: position t predicts labels[t + 1]; -100 and ids outside the subset are ignored.
    labels = torch.tensor([[1, 4, 5, -100, 7, 8, 10]])  # 5, 7 odd: OOV
    logp = reduced[0].log_softmax(-1)
    expected = -(logp[0, 2] + logp[4, 4] + logp[5, 5]) / 3  # 4 -> 2, 8 -> 4, 10 -> 5
    loss = d(x, labels=labels).loss
    torch.testing.assert_close(loss, expected)

    d.requires_grad_(True)
    d(x, labels=labels).loss.backward()
    grad = d.lm_head.weight.grad  # tied: embedding + head
    assert grad is not None and grad[:N].abs().sum() > 0


def test_incremental_dynamic_cache_matches_full_forward():
    d = make_drafter()
    x = ids(1, 4, 5, 6, 7, 8, 10, 12, 3, 20)
    full = d(x, full_vocab=False).logits
    cache, steps = DynamicCache(), []
    for a, b in ((0, 4), (4, 5), (5, 8), (8, 10)):
        out = d(x[:, a:b], past_key_values=cache, use_cache=True, full_vocab=False)
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    cache.crop(-4)  # roll back to 6 tokens and redo (5.x rejects a positive crop length)
    out = d(x[:, 6:], past_key_values=cache, use_cache=True, full_vocab=False)
    torch.testing.assert_close(out.logits, full[:, 6:], rtol=1e-5, atol=1e-5)


def test_left_padded_batch_matches_single_rows():
    d = make_drafter()
    a, b = ids(1, 4, 5, 6, 7, 8), ids(1, 9, 10)
    batch = torch.cat([a, torch.cat([torch.full((1, 3), tm.PAD), b], dim=1)])  # [2, 6]
    mask = (torch.arange(6) >= torch.tensor([[0], [3]])).long()
    out = d(batch, attention_mask=mask, output_hidden_states=True)
    assert len(out.hidden_states) == 3  # embeddings + 2 layers
    torch.testing.assert_close(out.logits[0, -1], d(a).logits[0, -1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.logits[1, -1], d(b).logits[0, -1], rtol=1e-4, atol=1e-4)


def test_restricted_copy_matches_target_on_subset():
    target = tm.llama_target()
    d = restricted_copy(target)
    x = ids(2, 4, 6, 8, 10, 40, 94)
    torch.testing.assert_close(d(x).logits[..., EVEN], target(x).logits[..., EVEN], rtol=1e-5, atol=1e-5)


# -- Hub layout ---------------------------------------------------------------------------------
def test_save_hub_reload_as_remote_code_in_fresh_process(tmp_path):
    d = make_drafter()
    repo = tmp_path / "repo"
    save_hub(d, repo, "# Tiny drafter\n\nFor tests.")
    files = set(os.listdir(repo))
    assert {
        "config.json",
        "model.safetensors",
        "README.md",
        "configuration_cascade_drafter.py",
        "modeling_cascade_drafter.py",
    } <= files
    config = json.loads((repo / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_cascade_drafter.CascadeDrafterForCausalLM"
    card = (repo / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\n") and "- speculative-decoding" in card
    assert "base_model: tiny/llama" in card and card.rstrip().endswith("For tests.")

    x = ids(1, 4, 5, 6, 7, 8, 10, 95)
    torch.save({"x": x, "logits": d(x).logits, "reduced": d(x, full_vocab=False).logits}, tmp_path / "expected.pt")
    script = f"""
import sys, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained({str(repo)!r}, trust_remote_code=True).eval()
assert not any(k.startswith("hf_cascade") for k in sys.modules), "hf_cascade was imported"
assert type(m).__module__.startswith("transformers_modules"), type(m).__module__
e = torch.load({str(tmp_path / "expected.pt")!r})
with torch.no_grad():
    assert torch.equal(m(e["x"]).logits, e["logits"])
    assert torch.equal(m(e["x"], full_vocab=False).logits, e["reduced"])
print("OK", m.num_parameters())
"""
    assert run_offline(script, tmp_path).split() == ["OK", str(d.num_parameters())]


def test_load_head_roundtrip_and_wrong_shape(tmp_path):
    d = make_drafter(tie=False)
    save_hub(d, tmp_path / "ok", {"license": "apache-2.0", "body": "x"})
    m = load_head(tmp_path / "ok")
    x = ids(1, 4, 6, 9)
    assert torch.equal(m(x).logits, d(x).logits) and torch.equal(m.vocab_subset, EVEN)
    assert "license: apache-2.0" in (tmp_path / "ok" / "README.md").read_text()

    save_hub(d, tmp_path / "bad", "")
    cfg = json.loads((tmp_path / "bad" / "config.json").read_text())
    cfg["hidden_size"] = 64
    (tmp_path / "bad" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="does not match its config"):
        load_head(tmp_path / "bad")


def test_config_roundtrip(tmp_path):
    c = make_drafter(rope_theta=5000.0).config
    c.save_pretrained(tmp_path)
    c2 = CascadeDrafterConfig.from_pretrained(tmp_path)
    assert c2.to_dict() == c.to_dict() and c2.rope_theta == 5000.0 and c2.draft_vocab_size == N
    assert c2.vocab_size == tm.VOCAB and c2.target_name_or_path == "tiny/llama"


# -- greedy parity as an assistant --------------------------------------------------------------
@pytest.fixture(scope="module")
def target():
    return tm.llama_target()


@pytest.mark.parametrize("kind", ["random", "restricted_copy"])
@pytest.mark.parametrize("prompt", [ids(1, 5, 6, 7, 5, 6, 7, 5, 6), ids(9)])
def test_greedy_parity(target, kind, prompt):
    drafter = make_drafter() if kind == "random" else restricted_copy(target)
    expected = target.generate(prompt, do_sample=False, max_new_tokens=20)

    assistant = CascadeAssistant([drafter, MaxGram()])
    got = target.generate(prompt, do_sample=False, max_new_tokens=20, assistant_model=assistant)
    assert got.tolist() == expected.tolist()
    assert assistant.last_stats.levels[0].forward_calls >= 1
    if kind == "restricted_copy":  # the paper's fixed lengths: the default's measured costs may rightly refuse
        fixed = CascadeAssistant(
            [drafter, MaxGram()], policy=Policy(cost_aware=False)
        )  # a drafter as slow as the target
        got = target.generate(prompt, do_sample=False, max_new_tokens=20, assistant_model=fixed)
        assert got.tolist() == expected.tolist() and sum(fixed.last_stats.accepted_per_call) > 0

    got_hf = target.generate(prompt, do_sample=False, max_new_tokens=20, assistant_model=drafter)
    assert got_hf.tolist() == expected.tolist()


def test_reduced_greedy_step_equals_the_full_row():
    """``NeuralLevel.next_greedy`` (softmax over the drafter's subset only) gives the token and
    probability of the full-vocabulary row, and ``generate`` drafts the same tokens with it."""
    from transformers import LogitsProcessorList

    from hf_cascade.core.stats import LevelStats
    from hf_cascade.drafters.neural import NeuralLevel

    drafter = make_drafter(seed=3)
    for prompt in tm.random_prompts(6, seed=4):
        seq = prompt[0]
        fast = NeuralLevel(drafter, tm.VOCAB, LogitsProcessorList(), LevelStats("d"))
        full = NeuralLevel(drafter, tm.VOCAB, LogitsProcessorList(), LevelStats("d"))
        full._reduced = False
        token, prob = fast.next_greedy(seq)
        row = full.scores(seq, seq.shape[0])[-1].softmax(-1)
        assert int(token) == int(row.argmax()) and int(token) in EVEN.tolist()
        torch.testing.assert_close(prob, row[token][0], rtol=1e-6, atol=1e-7)
        t_fast, p_fast, _ = fast.generate(seq, 5, False, set())
        t_full, p_full, _ = full.generate(seq, 5, False, set())
        assert t_fast.tolist() == t_full.tolist()
        torch.testing.assert_close(p_fast, p_full, rtol=1e-6, atol=1e-7)
    assert NeuralLevel(tm.llama_target(), tm.VOCAB, LogitsProcessorList(), LevelStats("d")).next_greedy(seq) is None


@pytest.mark.parametrize("prompt", [ids(1, 5, 6, 7, 5, 6, 7, 5, 6), ids(9)])
def test_greedy_parity_drafting_below_maxgram(target, prompt):
    """The drafter drafts autoregressively (the reduced greedy path) after Max-Gram's match."""
    drafter = restricted_copy(target)
    expected = target.generate(prompt, do_sample=False, max_new_tokens=20)
    for policy in (Policy(cost_aware=False), Policy()):
        assistant = CascadeAssistant(
            [drafter, MaxGram()], settings=CascadeSettings(k_matrix=[[3, 10], [0, 10]]), policy=policy
        )
        got = target.generate(prompt, do_sample=False, max_new_tokens=20, assistant_model=assistant)
        assert got.tolist() == expected.tolist()
        assert assistant.last_stats.levels[0].forward_calls >= 1


def test_cost_aware_calibration_learns_from_the_targets_verdicts(target):
    """Only the smallest neural drafter's tokens the target reached teach the calibration: here a draft
    [Max-Gram, Max-Gram, drafter p=.5, drafter p=.7, drafter p=.9] of which the target accepted 3."""
    assistant = CascadeAssistant([restricted_copy(target), MaxGram()])
    gen = assistant.build(
        target, GenerationConfig(do_sample=False, max_length=64), LogitsProcessorList(), GenerationStats()
    )
    d = _Drafted.empty(ids(1)[0], tm.VOCAB, do_sample=False)
    d.append(ids(5, 6)[0], torch.ones(2), None, origin=1, lenient=False)
    d.append(ids(7, 8, 9)[0], torch.tensor([0.5, 0.7, 0.9]), None, origin=0, lenient=True)
    gen._pending = d
    gen.on_target_review(ids(1, 5, 6, 7)[0], num_proposed=5, num_accepted=3, verify_seconds=None)
    cal = gen.policy.calibration
    assert cal._hits == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]  # p=.5 accepted
    assert cal._expected == pytest.approx(
        [0.0, 0.0, 0.5, 0.7, 0.0, 0.0]
    )  # p=.7 reached and rejected, p=.9 never reached
    assert cal(0.7) < 0.7 < cal(0.5) / 0.5 * 0.7  # a rejection lowers, an acceptance raises


@pytest.mark.measured_costs
def test_cascade_stops_consulting_a_drafter_that_does_not_pay(target, monkeypatch):
    """A drafter whose forwards cost far more than the target's steps save (here: 50 ms each, on a target
    whose steps take about a millisecond, drafting tokens the target rarely accepts) is consulted only to
    keep learning (``DrafterPayoff.explore_every``); the output is plain greedy's."""
    import time as _time

    drafter = make_drafter(seed=5)
    forward = drafter.forward

    def slow_forward(*args, **kwargs):
        _time.sleep(0.05)
        return forward(*args, **kwargs)

    monkeypatch.setattr(drafter, "forward", slow_forward)
    prompt = ids(1, 5, 6, 7, 5, 6, 7, 5, 6)  # 25 target calls, one drafter forward each if pinned
    expected = target.generate(prompt, do_sample=False, max_new_tokens=40)
    assistant = CascadeAssistant([drafter, MaxGram()])
    got = target.generate(prompt, do_sample=False, max_new_tokens=40, assistant_model=assistant)
    assert got.tolist() == expected.tolist()
    stats = assistant.last_stats
    assert stats.target_calls >= 16
    assert stats.levels[0].forward_calls <= 3 + stats.target_calls // 8, (
        stats.levels[0].forward_calls,
        stats.target_calls,
    )
