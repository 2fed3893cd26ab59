"""Teacher-forced soft labels (hf_cascade.training.soft_labels): the loss on hand-written tensors, the
table's layout, the table against a direct forward of a tiny target (Llama and Gemma3, batched with
padding), its reuse, and the vanilla loss with the soft term."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hf_cascade.training.loop import make_batch
from hf_cascade.training.soft_labels import (
    SoftLabels,
    compute_soft_labels,
    load_soft_labels,
    soft_cross_entropy,
    soft_label_dir,
)
from hf_cascade.training.store import DistillStore
from hf_cascade.training.vanilla import SoftTerm, VanillaSpec, build_vanilla, vanilla_loss
from tests import tiny_models as tm
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

META = {"target": "tiny", "prompt_format": "{question}", "max_new_tokens": 8, "hidden_size": 0, "vocab_size": tm.VOCAB}
SEQS = [([1, 4, 5], [6, 2]), ([1, 7], [8]), ([9, 30, 31, 32], [40, 41, 42, 43, 44]), ([1, 50], [51, 52])]


def hand_store(path) -> DistillStore:
    store = DistillStore.create_or_resume(path, META)
    for i, (p, r) in enumerate(SEQS):
        store.append(f"r{i}", "hand", p, r, False)
    return store


def test_soft_cross_entropy_golden():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]]))  # [1, 2, 3]
    ids = torch.tensor([[[0, 1], [2, 0]]])  # [1, 2, 2]
    logp = torch.log(torch.tensor([[[0.6, 0.2], [0.5, 0.5]]]))  # renormalised: [.75 .25], [.5 .5]
    got = soft_cross_entropy(logits, ids, logp)
    want = torch.tensor(
        [[-(0.75 * math.log(0.5) + 0.25 * math.log(0.25)), -(0.5 * math.log(0.8) + 0.5 * math.log(0.1))]]
    )
    torch.testing.assert_close(got, want)
    # A one-hot label is plain cross-entropy.
    one_hot = torch.tensor([[[0.0, -float("inf")], [0.0, -float("inf")]]])
    torch.testing.assert_close(
        soft_cross_entropy(logits, ids, one_hot), torch.tensor([[-math.log(0.5), -math.log(0.8)]])
    )


def test_rows_layout_and_padding(tmp_path):
    store = hand_store(tmp_path / "d")
    n_tok = store.num_tokens  # 5 + 3 + 9 + 4
    table_ids = np.arange(n_tok * 2, dtype=np.int16).reshape(n_tok, 2)
    table_logp = -np.arange(n_tok * 2, dtype=np.float16).reshape(n_tok, 2) / 8
    soft = SoftLabels(torch.arange(64), table_ids, table_logp)
    ids, logp = soft.rows(store, [1, 0], width=5)  # record 1 has 3 tokens: 2 pad rows
    assert ids.shape == (2, 5, 2) and logp.shape == (2, 5, 2)
    assert ids[0, :3].tolist() == [[10, 11], [12, 13], [14, 15]] and ids[1].tolist() == table_ids[:5].tolist()
    torch.testing.assert_close(logp[1], torch.from_numpy(table_logp[:5].astype(np.float32)))
    assert ids[0, 3:].eq(0).all() and logp[0, 3:, 0].eq(0).all() and logp[0, 3:, 1].eq(-float("inf")).all()
    assert torch.isfinite(logp[0, 3:].softmax(-1)).all()  # padding renormalises cleanly
    cut_ids, _ = soft.rows(store, [2], width=4)  # longer records are cut
    assert cut_ids[0].tolist() == table_ids[8:12].tolist()


@pytest.mark.parametrize("make_target", [tm.llama_target, tm.gemma3_target])
def test_compute_matches_a_direct_forward_and_is_reused(tmp_path, make_target, monkeypatch):
    target = make_target()
    store = hand_store(tmp_path / "d")
    subset = torch.tensor([0, 1, 2, 4, 5, 6, 7, 8, 30, 31, 40, 41, 42, 50, 51, 60])
    soft = compute_soft_labels(target, store, subset, top_k=3, batch_size=3, progress=False)
    assert soft.ids.shape == (store.num_tokens, 3) and soft.ids.dtype == np.int16 and soft.logp.dtype == np.float16
    for i, rec in enumerate(store.records):
        seq, _ = store.sequence(i)
        with torch.no_grad():
            full = target(input_ids=torch.from_numpy(seq.astype(np.int64))[None]).logits[0]  # [L, V] unbatched
        want = full[:, subset].log_softmax(-1).topk(3, dim=-1)
        got_ids = torch.from_numpy(soft.ids[rec.offset : rec.offset + rec.length].astype(np.int64))
        got_logp = torch.from_numpy(soft.logp[rec.offset : rec.offset + rec.length].astype(np.float32))
        torch.testing.assert_close(got_logp, want.values, atol=2e-3, rtol=2e-3)
        # ids agree wherever the top-3 values are not tied within fp16 precision
        gaps = (want.values[:, :-1] - want.values[:, 1:]).min(-1).values
        assert torch.equal(got_ids[gaps > 1e-3], want.indices[gaps > 1e-3])

    def boom(*args, **kwargs):
        raise AssertionError("the finished table should be reused")

    monkeypatch.setattr(target, "get_decoder", boom)
    again = compute_soft_labels(target, store, subset, top_k=3, progress=False)
    assert np.array_equal(again.ids, soft.ids)
    assert load_soft_labels(store, subset, 4) is None  # another K: another table
    assert soft_label_dir(store, subset[:-1], 3) != soft_label_dir(store, subset, 3)
    store.append("r9", "hand", [1, 2], [3], False)  # the store grew: stale
    assert load_soft_labels(store, subset, 3) is None
    with pytest.raises(ValueError, match="top_k"):
        compute_soft_labels(tm.llama_target(), store, subset, top_k=17, progress=False)


def test_vanilla_loss_with_the_soft_term(tmp_path):
    target = tm.llama_target()
    store = hand_store(tmp_path / "d")
    spec = VanillaSpec(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        intermediate_size=32,
        draft_vocab_size=32,
    )
    torch.manual_seed(0)
    model, _ = build_vanilla(target, store, spec, "tiny")
    labels = compute_soft_labels(target, store, model.vocab_subset, top_k=4, progress=False)
    batch = make_batch(store, [0, 2, 3], max_len=64, prompt_weight=0.1)
    term = SoftTerm(labels, store, weight=1.0, hard=0.5, prompt_weight=0.25)
    loss, parts = vanilla_loss(model, batch, term)

    # By hand: the hard term over response positions only, the soft term over every position.
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, full_vocab=False).logits
    draft = model.to_draft_ids(batch.input_ids)
    resp = batch.response[:, 1:]
    logq = logits[:, :-1].log_softmax(-1)
    hard_ce = -logq.gather(-1, draft[:, 1:, None])[..., 0]
    hard = hard_ce[resp].mean()
    ids, logp = labels.rows(store, [0, 2, 3], batch.input_ids.shape[1])
    soft_ce = -(logp[:, :-1].softmax(-1) * logq.gather(-1, ids[:, :-1])).sum(-1)
    w = batch.attention_mask[:, 1:].float() * torch.where(resp, 1.0, 0.25)
    soft = (soft_ce * w).sum() / w.sum()
    assert parts["hard"] == pytest.approx(float(hard), rel=1e-5) and parts["soft"] == pytest.approx(
        float(soft), rel=1e-5
    )
    assert float(loss) == pytest.approx(0.5 * float(hard) + float(soft), rel=1e-5)
    assert batch.response.tolist()[0] == [False, False, False, True, True, False, False, False, False]
