"""``train_redrafter`` (hf_cascade.training.run_redrafter) end to end on a tiny target: a distillation
store, a few training steps (loss falls), the best checkpoint saved in Hub layout with its model card,
reloaded with identical logits and decoding exactly; the cached hidden states equal the target's;
the presets fit the 25 MB budget for Gemma-3-270M; bad data fails clearly."""

from __future__ import annotations

import json
import os

import pytest
import torch

from hf_cascade import Policy, ReDrafterConfig, ReDrafterModel, ReDrafterSettings
from hf_cascade.loading import load_head
from hf_cascade.redrafter import ReDrafterAssistant
from hf_cascade.training.loop import TrainConfig, make_batch, split_records
from hf_cascade.training.redrafter import redrafter_loss, target_context
from hf_cascade.training.run_redrafter import (
    PRESETS,
    ReDrafterSpec,
    build_redrafter,
    cache_hidden_states,
    train_redrafter,
)
from hf_cascade.training.store import DistillStore
from tests import tiny_models as tm
from tests.redrafter_helpers import continuations
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

META = {"target": "tiny", "prompt_format": "{question}", "max_new_tokens": 24, "hidden_size": 0, "vocab_size": tm.VOCAB}
SPEC = ReDrafterSpec(exit_dim=24, num_draft_layers=1, draft_vocab_size=64, beam_length=3)
COMMAND = "hf-cascade train redrafter --data tiny-distill --steps 10"


def make_store(path, target, n=16, meta=META) -> DistillStore:
    store = DistillStore.create_or_resume(path, meta)
    for i, (seq, plen) in enumerate(continuations(target, n=n, new=24, seed=7)):
        store.append(f"t:{i}", "tiny", seq[:plen], seq[plen:], seq[-1] == tm.EOS)
    return store


@pytest.fixture(scope="module")
def target():
    return tm.llama_target()


@pytest.fixture(scope="module")
def data(target, tmp_path_factory):
    path = tmp_path_factory.mktemp("rd-distill") / "data"
    make_store(path, target)
    return path


@pytest.fixture(scope="module")
def trained(target, data, tmp_path_factory):
    out = tmp_path_factory.mktemp("rd-train") / "head"
    cfg = TrainConfig(out, steps=10, batch_size=4, eval_every=10, eval_records=3, max_len=64, lr=1e-2, warmup=1)
    torch.manual_seed(0)
    initial, _ = build_redrafter(target, DistillStore.open(data), SPEC, "tiny")  # what training starts from
    torch.manual_seed(0)
    head, state = train_redrafter(target, data, cfg, SPEC, target_name="tiny", command=COMMAND, progress=False)
    return out, head, state, initial, cfg


def test_train_redrafter_learns_and_saves_hub_layout(trained, target, data):
    out, head, state, initial, cfg = trained
    store = DistillStore.open(data)
    losses = [h["loss"] for h in state.history if "loss" in h]
    evals = [h for h in state.history if "eval" in h]
    assert len(losses) == 10 and state.step == 10 and [h["step"] for h in evals] == [10]
    assert all(torch.isfinite(torch.tensor(losses))) and {"loss@1", "acc@3"} <= set(state.history[0])
    train_idx, eval_idx = split_records(store, 3)
    everything = make_batch(store, train_idx, 64, cfg.prompt_weight)
    with torch.no_grad():
        before, after = (redrafter_loss(m.eval(), target, everything, L=3)[0].item() for m in (initial, head))
    assert after < 0.8 * before, (before, after)
    ev = evals[-1]["eval"]
    assert {"alpha", "tau", "accept@1", "accept@2", "accept@3", "eval_positions"} <= set(ev)
    assert ev["eval_positions"] > 0 and ev["tau"] == pytest.approx(3 * ev["alpha"])

    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_redrafter.ReDrafterModel"
    assert config["draft_vocab_size"] == 64 and config["vocab_size"] == tm.VOCAB and config["hidden_size"] == 32
    assert config["exit_dim"] == 24 and config["num_draft_layers"] == 1
    assert {"model.safetensors", "modeling_redrafter.py", "configuration_redrafter.py", "README.md"} <= set(
        os.listdir(out)
    )
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\n") and COMMAND in card
    assert (
        "## Measured acceptance" in card and "| before training |" in card and "| this checkpoint (step 10) |" in card
    )
    assert f"{ev['tau']:.3f}" in card
    ts = json.loads((out / "trainer_state.json").read_text())
    assert ts["spec"]["beam_length"] == 3 and ts["hidden_states"] == "cached" and ts["baseline"]["eval_positions"] > 0
    assert ts["data"]["heldout_sequences"] == 3 and ts["vocab"]["coverage_all"] > 0.9
    assert {tm.PAD, tm.BOS, tm.EOS} <= set(head.vocab_subset.tolist())


def test_reloaded_head_has_identical_logits_and_decodes_exactly(trained, target):
    out, head = trained[:2]
    reloaded = load_head(out).eval()
    assert type(reloaded).__name__ == "ReDrafterModel"  # the remote-code class of the checkpoint
    assert torch.equal(reloaded.vocab_subset, head.vocab_subset)
    g = torch.Generator().manual_seed(0)
    x, e = torch.randn(2, 32, generator=g), torch.randn(2, 4, 32, generator=g)
    with torch.no_grad():
        assert torch.equal(
            reloaded(hidden_states=x, inputs_embeds=e).logits, head(hidden_states=x, inputs_embeds=e).logits
        )
    for prompt in (ids(1, 5, 9), ids(1, 50, 51, 52, 53)):
        expected = target.generate(prompt, do_sample=False, max_new_tokens=20)
        a = ReDrafterAssistant(
            str(out), settings=ReDrafterSettings(beam_width=4, beam_length=3), policy=Policy(cost_aware=False)
        )  # loads the head from its path
        assert (
            target.generate(prompt, do_sample=False, max_new_tokens=20, assistant_model=a).tolist() == expected.tolist()
        )
        assert a.last_stats.target_calls < 20


def test_cached_hidden_states_equal_the_targets(target, data):
    store = DistillStore.open(data)
    cache = cache_hidden_states(target, store, [0, 3, 5], batch_size=2)
    assert cache.hidden_size == 32 and len(cache) == len(store) and cache.records == store.records
    batch = make_batch(store, [5, 0, 3], 64, 0.1)
    probe = ReDrafterModel(ReDrafterConfig(vocab_size=tm.VOCAB, hidden_size=32))
    from_cache, e1 = target_context(probe, target, batch, cache)
    direct, e2 = target_context(probe, target, batch)
    valid = batch.attention_mask.bool()
    torch.testing.assert_close(from_cache[valid], direct[valid], rtol=1e-4, atol=1e-4)
    assert torch.equal(e1, e2)
    # what decoding hands the head (TreeStep.last_hidden): the final-norm output, as trained on
    seq, _ = store.sequence(5)
    with torch.no_grad():
        decoded = target.model(input_ids=torch.tensor(seq.tolist())[None]).last_hidden_state[0]
    torch.testing.assert_close(from_cache[0, : len(seq)], decoded, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_fit_25mb_for_gemma_270m(name):
    spec = PRESETS[name]
    with torch.device("meta"):
        head = ReDrafterModel(
            ReDrafterConfig(
                vocab_size=262144,
                hidden_size=640,
                exit_dim=spec.exit_dim,
                num_draft_layers=spec.num_draft_layers,
                draft_vocab_size=spec.draft_vocab_size,
            )
        )
    size = sum(p.numel() * 4 for p in head.parameters()) + spec.draft_vocab_size * 8  # float32 + id buffer
    assert 5e6 < size <= 25e6, size


def test_bad_data_fails_clearly(target, tmp_path):
    cfg = TrainConfig(tmp_path / "out", steps=1)
    make_store(tmp_path / "one", target, n=1)
    with pytest.raises(ValueError, match="distill more"):
        train_redrafter(target, tmp_path / "one", cfg, SPEC, progress=False)
    make_store(tmp_path / "vocab", target, n=2, meta={**META, "vocab_size": 1000})
    with pytest.raises(ValueError, match="vocab_size 1000"):
        train_redrafter(target, tmp_path / "vocab", cfg, SPEC, progress=False)
    with pytest.raises(FileNotFoundError):
        train_redrafter(target, tmp_path / "missing", cfg, SPEC, progress=False)
    assert not (tmp_path / "out").exists()
