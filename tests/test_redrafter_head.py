"""The ReDrafter head (hf_cascade.heads.redrafter): reference weight layout, recurrence semantics,
Hub round trip as remote code, strict loading, conversion of reference checkpoints, training loss."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F

import hf_cascade  # noqa: F401  (registers the heads)
from hf_cascade import ReDrafterConfig, ReDrafterModel
from hf_cascade.heads.hub import save_hub
from hf_cascade.heads.redrafter.convert import convert_reference_checkpoint
from hf_cascade.loading import load_head
from hf_cascade.training.loop import Batch
from hf_cascade.training.redrafter import redrafter_acceptance, redrafter_loss
from hf_cascade.training.store import DistillStore
from tests import tiny_models as tm
from tests.fresh_process import run_offline
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

H = 32  # the tiny targets' hidden size
EVEN = torch.arange(0, tm.VOCAB, 2)  # a reduced vocabulary: half of the target's


def make_head(seed: int = 0, subset=None, **kw) -> ReDrafterModel:
    torch.manual_seed(seed)
    kw.setdefault("num_draft_layers", 2)
    config = ReDrafterConfig(
        vocab_size=tm.VOCAB,
        hidden_size=H,
        initializer_range=0.2,
        draft_vocab_size=None if subset is None else len(subset),
        target_name_or_path="tiny/llama",
        **kw,
    )
    head = ReDrafterModel(config)
    if subset is not None:
        head.set_vocab_subset(subset)
    return head.eval()


def reference_names(hidden: int, exit_dim: int, layers: int, vocab: int, rnn: bool) -> dict[str, tuple]:
    """Tensor names and shapes of the reference ``Drafter`` (recurrent_drafting/modeling_drafter.py)."""
    names = {}
    if exit_dim != 2 * hidden:
        names.update({"input_proj.weight": (exit_dim, 2 * hidden), "input_proj.bias": (exit_dim,)})
    for i in range(layers):
        names.update({f"lm_head.{i}.linear.weight": (exit_dim, exit_dim), f"lm_head.{i}.linear.bias": (exit_dim,)})
    names[f"lm_head.{layers}.weight"] = (vocab, exit_dim)
    if rnn:
        names.update({"rnn_u.weight": (hidden, hidden), "rnn_u.bias": (hidden,), "rnn_w.weight": (hidden, hidden)})
    return names


def direct_logits(t: dict, x: torch.Tensor, embs: torch.Tensor, rnn: bool, layers: int) -> torch.Tensor:
    """The drafter computed from raw tensors: ``x`` ``[..., H]``, ``embs`` ``[..., K, H]`` -> ``[..., K, V]``."""
    s = torch.zeros_like(x)
    out = []
    for k in range(embs.shape[-2]):
        ek = embs[..., k, :]
        if rnn:
            s = F.silu(s @ t["rnn_u.weight"].T + t["rnn_u.bias"] + ek @ t["rnn_w.weight"].T)
        else:
            s = s + ek
        h = torch.cat([x, s], -1)
        if "input_proj.weight" in t:
            h = h @ t["input_proj.weight"].T + t["input_proj.bias"]
        for i in range(layers):
            h = h + F.silu(h @ t[f"lm_head.{i}.linear.weight"].T + t[f"lm_head.{i}.linear.bias"])
        out.append(h @ t[f"lm_head.{layers}.weight"].T)
    return torch.stack(out, -2)


# -- the model ------------------------------------------------------------------------------------
@pytest.mark.parametrize("rnn,exit_dim,layers", [(True, None, 2), (False, 48, 1), (True, 40, 0)])
def test_reference_weight_layout_loads_strictly(rnn, exit_dim, layers):
    head = make_head(rnn=rnn, exit_dim=exit_dim, num_draft_layers=layers)
    d = head.config.exit_dim
    expected = reference_names(H, d, layers, tm.VOCAB, rnn)
    assert {k: tuple(v.shape) for k, v in head.state_dict().items()} == expected
    g = torch.Generator().manual_seed(1)
    raw = {k: torch.randn(s, generator=g) for k, s in expected.items()}
    head.load_state_dict(raw, strict=True)
    x, embs = torch.randn(2, 3, H, generator=g), torch.randn(2, 3, 4, H, generator=g)
    torch.testing.assert_close(head(x, embs).logits, direct_logits(raw, x, embs, rnn, layers))


def test_emb_norm_checkpoint_layout():
    head = make_head(emb_norm=True, rms_norm_eps=1e-6)
    assert tuple(head.state_dict()["emb_norm.weight"].shape) == (H,)
    assert "vocab_subset" not in head.state_dict()


def test_shapes_step_and_logits():
    head = make_head(subset=EVEN)
    g = torch.Generator().manual_seed(2)
    x, embs = torch.randn(2, 5, H, generator=g), torch.randn(2, 5, 3, H, generator=g)  # [B, T, H], [B, T, K, H]
    out = head(x, embs)
    assert out.logits.shape == (2, 5, 3, tm.VOCAB) and out.states.shape == (2, 5, 3, H)
    reduced = head(x, embs, full_vocab=False).logits
    assert reduced.shape == (2, 5, 3, len(EVEN))
    outside = torch.ones(tm.VOCAB, dtype=torch.bool)
    outside[EVEN] = False
    assert (out.logits[..., outside] == torch.finfo(out.logits.dtype).min).all()
    assert torch.equal(out.logits[..., EVEN], reduced)

    # forward == init_state, then step/logits one position at a time (what beam search drives)
    s = head.init_state(x)
    assert torch.equal(s, torch.zeros_like(x))
    for k in range(3):
        s = head.step(s, embs[:, :, k])
        torch.testing.assert_close(head.logits(s, x), out.logits[:, :, k])
        torch.testing.assert_close(s, out.states[:, :, k])
    # beams: a state per beam against one shared context broadcast
    beams = head.step(head.init_state(x[:, 0]).unsqueeze(1).expand(2, 4, H), embs[:, 0, :1].expand(2, 4, H))
    assert head.logits(beams, x[:, 0:1]).shape == (2, 4, tm.VOCAB)

    # the paper's s_0 = e_0 is an explicit initial state
    e0 = torch.randn(2, 5, H, generator=g)
    got = head(x, embs, state=e0).states[:, :, 0]
    torch.testing.assert_close(got, F.silu(head.rnn_u(e0) + head.rnn_w(embs[:, :, 0])))

    # ids <-> columns
    assert head.to_draft_ids(torch.tensor([0, 1, 2, 94, 95])).tolist() == [0, 48, 1, 47, 48]
    assert head.to_target_ids(torch.tensor([0, 1, 47])).tolist() == [0, 2, 94]
    with pytest.raises(ValueError, match="inputs_embeds"):
        head(x, embs[:, :4])


def test_no_rnn_is_cumulative_embedding_sum():
    head = make_head(rnn=False)
    assert head.rnn_u is None and head.rnn_w is None
    embs = torch.randn(1, 4, H)
    states = head(torch.randn(1, H), embs).states
    torch.testing.assert_close(states, embs.cumsum(-2))


def test_config_roundtrip(tmp_path):
    c = make_head(subset=EVEN, exit_dim=48, rnn=False).config
    c.save_pretrained(tmp_path)
    c2 = ReDrafterConfig.from_pretrained(tmp_path)
    assert c2.to_dict() == c.to_dict() and c2.exit_dim == 48 and c2.draft_vocab_size == 48 and not c2.rnn
    assert ReDrafterConfig(hidden_size=8, vocab_size=10, exit_dim=-1).exit_dim == 16  # reference "unset"
    with pytest.raises(ValueError, match="draft_vocab_size"):
        ReDrafterConfig(vocab_size=10, hidden_size=8, draft_vocab_size=11)


# -- Hub layout -----------------------------------------------------------------------------------
def test_save_hub_reload_as_remote_code_in_fresh_process(tmp_path):
    head = make_head(subset=EVEN, exit_dim=48)
    repo = tmp_path / "repo"
    save_hub(head, repo, "# Tiny ReDrafter\n\nFor tests.")
    files = set(os.listdir(repo))
    assert {
        "config.json",
        "model.safetensors",
        "README.md",
        "configuration_redrafter.py",
        "modeling_redrafter.py",
    } <= files and "convert.py" not in files
    config = json.loads((repo / "config.json").read_text())
    assert config["model_type"] == "hf_cascade_redrafter"
    assert config["auto_map"]["AutoModel"] == "modeling_redrafter.ReDrafterModel"
    assert "base_model: tiny/llama" in (repo / "README.md").read_text()

    g = torch.Generator().manual_seed(3)
    x, embs = torch.randn(2, 3, H, generator=g), torch.randn(2, 3, 4, H, generator=g)
    with torch.no_grad():
        out = head(x, embs)
        reduced = head(x, embs, full_vocab=False).logits
    torch.save(
        {"x": x, "embs": embs, "logits": out.logits, "states": out.states, "reduced": reduced}, tmp_path / "expected.pt"
    )
    script = f"""
import sys, torch
from transformers import AutoModel
m = AutoModel.from_pretrained({str(repo)!r}, trust_remote_code=True).eval()
assert not any(k.startswith("hf_cascade") for k in sys.modules), "hf_cascade was imported"
assert type(m).__module__.startswith("transformers_modules"), type(m).__module__
e = torch.load({str(tmp_path / "expected.pt")!r})
with torch.no_grad():
    out = m(e["x"], e["embs"])
    assert torch.equal(out.logits, e["logits"]) and torch.equal(out.states, e["states"])
    assert torch.equal(m(e["x"], e["embs"], full_vocab=False).logits, e["reduced"])
    s = m.step(m.init_state(e["x"]), e["embs"][:, :, 0])
    assert torch.equal(m.logits(s, e["x"]), e["logits"][:, :, 0])
assert m.vocab_subset.tolist() == list(range(0, 96, 2))
print("OK", m.num_parameters())
"""
    assert run_offline(script, tmp_path).split() == ["OK", str(head.num_parameters())]


def test_load_head_roundtrip_and_wrong_shape(tmp_path):
    head = make_head(subset=EVEN)
    save_hub(head, tmp_path / "ok", "")
    m = load_head(tmp_path / "ok")
    x, embs = torch.randn(1, 2, H), torch.randn(1, 2, 3, H)
    assert torch.equal(m(x, embs).logits, head(x, embs).logits) and torch.equal(m.vocab_subset, EVEN)

    save_hub(head, tmp_path / "bad", "")
    cfg = json.loads((tmp_path / "bad" / "config.json").read_text())
    cfg["exit_dim"] = 48  # input_proj appears, block shapes change
    (tmp_path / "bad" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="does not match its config"):
        load_head(tmp_path / "bad")


# -- conversion of reference checkpoints ----------------------------------------------------------
def write_reference_checkpoint(path, rnn: bool, exit_dim: int, layers: int, fmt: str, dtype=torch.float32, seed=0):
    """A synthetic checkpoint laid out as the reference's ``Drafter.save_pretrained`` writes it."""
    path.mkdir(parents=True)
    config = {  # what transformers writes for recurrent_drafting.configuration_drafter.DrafterConfig
        "_name_or_path": "",
        "architectures": ["Drafter"],
        "exit_dim": exit_dim,
        "hidden_size": H,
        "model_type": "recurrent_drafting_drafter",
        "num_draft_layers": layers,
        "num_lookback_tokens": -1,
        "rnn": rnn,
        "torch_dtype": str(dtype).split(".")[-1],
        "transformers_version": "4.41.2",
        "vocab_size": tm.VOCAB,
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    g = torch.Generator().manual_seed(seed)
    tensors = {
        k: (0.3 * torch.randn(s, generator=g)).to(dtype)
        for k, s in reference_names(H, exit_dim, layers, tm.VOCAB, rnn).items()
    }
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    else:
        torch.save(tensors, path / "pytorch_model.bin")
    return tensors


@pytest.mark.parametrize("rnn,exit_dim,layers,fmt", [(True, 2 * H, 2, "safetensors"), (False, 48, 1, "bin")])
def test_convert_reference_checkpoint(tmp_path, rnn, exit_dim, layers, fmt):
    raw = write_reference_checkpoint(tmp_path / "ref", rnn, exit_dim, layers, fmt)
    out = convert_reference_checkpoint(tmp_path / "ref", tmp_path / "hub", target_name_or_path="tiny/llama")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "hf_cascade_redrafter" and config["rnn"] is rnn
    assert (
        config["exit_dim"] == exit_dim and config["num_draft_layers"] == layers and config["draft_vocab_size"] is None
    )
    m = load_head(out)
    assert set(m.state_dict()) == set(raw)
    g = torch.Generator().manual_seed(4)
    x, embs = torch.randn(3, H, generator=g), torch.randn(3, 5, H, generator=g)
    with torch.no_grad():
        got = m(x, embs).logits
    # the reference's op order differs from the head's: float32 sums in another order (BLAS paths differ by
    # CPU, e.g. MKL held to AVX2 gave 1.06e-5); a wrong mapping of any weight moves logits by O(0.1)
    torch.testing.assert_close(got, direct_logits(raw, x, embs, rnn, layers), rtol=1e-4, atol=1e-4)


def test_convert_rejects_mismatched_checkpoint(tmp_path):
    write_reference_checkpoint(tmp_path / "ref", True, 2 * H, 2, "safetensors")
    cfg = json.loads((tmp_path / "ref" / "config.json").read_text())
    cfg["num_draft_layers"] = 3
    (tmp_path / "ref" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="missing"):
        convert_reference_checkpoint(tmp_path / "ref", tmp_path / "hub")
    cfg.update(num_draft_layers=2, model_type="llama")
    (tmp_path / "ref" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="model_type"):
        convert_reference_checkpoint(tmp_path / "ref", tmp_path / "hub")


# -- training loss ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def target():
    return tm.llama_target()


@pytest.fixture(scope="module")
def sequences(target):
    """Prompts + the target's greedy continuations (what distillation stores)."""
    out = []
    for p in ([1, 5, 6, 7], [1, 9, 30, 31, 40], [1, 50], [1, 60, 61, 62, 63, 64]):
        ids = target.generate(torch.tensor([p]), do_sample=False, max_new_tokens=18)[0].tolist()
        out.append((ids, len(p)))
    return out


def make_train_batch(sequences, prompt_weight=0.0) -> Batch:
    width = max(len(s) for s, _ in sequences)
    ids = torch.full((len(sequences), width), tm.PAD, dtype=torch.long)
    w, mask = torch.zeros(len(sequences), width), torch.zeros(len(sequences), width, dtype=torch.long)
    for b, (s, plen) in enumerate(sequences):
        ids[b, : len(s)] = torch.tensor(s)
        mask[b, : len(s)] = 1
        w[b, 1 : len(s)] = prompt_weight
        w[b, plen : len(s)] = 1.0
    return Batch(ids, w, mask, list(range(len(sequences))))


def reference_style_loss(head, target, ids, mask, labels, next_n):
    """The reference trainer's computation (train/model.py ``ReDrafter.forward`` + train/loss.py
    ``drafter_loss``), transcribed: rolled embeddings, cumulative RNN state, sum of per-step CE."""
    hidden = target(ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
    input_embs = target.get_input_embeddings()(ids)
    cum = torch.zeros_like(input_embs)
    logits = []
    for _ in range(next_n):
        input_embs = torch.roll(input_embs, -1, dims=1)
        cum = F.silu(head.rnn_u(cum) + head.rnn_w(input_embs))
        logits.append(head.lm_head(torch.cat((hidden, cum), -1)))
    logits = torch.stack(logits)
    loss = 0
    for i in range(next_n):
        li = logits[i, :, : -(i + 2)].reshape(-1, logits.shape[-1])
        loss = loss + F.cross_entropy(li, labels[..., i + 2 :].reshape(-1), ignore_index=-100)
    return loss


def test_loss_matches_reference_trainer(target, sequences):
    head = make_head()
    batch = make_train_batch(sequences)
    labels = batch.input_ids.masked_fill(batch.weights == 0, -100)
    with torch.no_grad():
        expected = reference_style_loss(head, target, batch.input_ids, batch.attention_mask, labels, 4)
    loss, metrics = redrafter_loss(head, target, batch, L=4)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    assert sorted(metrics) == sorted([f"loss@{k}" for k in range(1, 5)] + [f"acc@{k}" for k in range(1, 5)])
    torch.testing.assert_close(torch.tensor(sum(metrics[f"loss@{k}"] for k in range(1, 5))), loss.detach())


def test_loss_reads_store_hidden_states(target, sequences, tmp_path):
    store = DistillStore.create_or_resume(
        tmp_path / "store", {"target": "tiny", "prompt_format": "raw", "max_new_tokens": 18, "hidden_size": H}
    )
    for i, (s, plen) in enumerate(sequences):
        with torch.no_grad():
            hid = target(torch.tensor([s]), output_hidden_states=True).hidden_states[-1][0].numpy()
        store.append(str(i), "test", s[:plen], s[plen:], False, hidden=hid)
    head = make_head(subset=EVEN)
    batch = make_train_batch(sequences, prompt_weight=0.1)
    from_target, _ = redrafter_loss(head, target, batch, L=3)
    from_store, _ = redrafter_loss(head, target, batch, L=3, store=store)
    torch.testing.assert_close(from_store, from_target, rtol=2e-3, atol=2e-3)  # float16 storage

    ev = redrafter_acceptance(head, target, store, [0, 1, 2, 3], L=3)
    assert ev["eval_positions"] > 0 and 0.0 <= ev["alpha"] <= 1.0 and ev["tau"] == pytest.approx(3 * ev["alpha"])
    assert 1.0 >= ev["accept@1"] >= ev["accept@2"] >= ev["accept@3"] >= 0.0
    ev2 = redrafter_acceptance(head, target, store, [0, 1, 2, 3], L=3, use_store_hidden=False)
    assert ev2["eval_positions"] == ev["eval_positions"] and abs(ev2["tau"] - ev["tau"]) < 0.2


@pytest.mark.parametrize("subset", [None, EVEN])
def test_a_few_steps_reduce_the_loss(target, sequences, subset):
    head = make_head(subset=subset, num_draft_layers=1)
    head.train()
    batch = make_train_batch(sequences, prompt_weight=0.1)
    opt = torch.optim.AdamW(head.parameters(), lr=1e-2)
    losses = []
    for _ in range(25):
        loss, _ = redrafter_loss(head, target, batch, L=3)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert all(p.grad is None for p in target.parameters())
    assert losses[-1] < 0.7 * losses[0], losses
