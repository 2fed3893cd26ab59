"""The training recipe's parts (issue 74) on tiny models: held-out acceptance by drafted position and its labels (the
target's greedy tokens, computed from a teacher-forced store's hidden states), the training-time test of GLIDE and
ReDrafter (an unrolled position sees what it sees in decoding), and the feature regression the loop trains beside the
head without saving it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hf_cascade.training.acceptance import GreedyLabels, accept_by_position
from hf_cascade.training.batches import Batch
from hf_cascade.training.features import FeatureRegression, HeadLoss
from hf_cascade.training.glide import _draft_logits, glide_acceptance, glide_loss, target_kv_batch
from hf_cascade.training.loop import TrainConfig, iterate_batches, make_batch, split_records, train
from hf_cascade.training.redrafter import redrafter_acceptance, redrafter_loss, target_context
from hf_cascade.training.run_glide import build_glide
from hf_cascade.training.run_redrafter import ReDrafterSpec, build_redrafter
from hf_cascade.training.teacher import teacher_forced
from tests import tiny_models as tm
from tests.test_glide_train import SPEC as GLIDE_SPEC
from tests.test_teacher_forced import TEXTS, _config
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

BLOCK = 5


@pytest.fixture(scope="module")
def target():
    return tm.llama_target()


@pytest.fixture(scope="module")
def store(target, tmp_path_factory):
    out = tmp_path_factory.mktemp("recipe") / "tf"
    return teacher_forced(target, tm.word_tokenizer(), _config(out), TEXTS, target_name="tiny", progress=False)


@pytest.fixture(scope="module")
def glide(target, store):
    """A draft with sharp random weights (an initialised one predicts near uniformly: its own tokens would change
    little)."""
    torch.manual_seed(0)
    model = build_glide(target, store, GLIDE_SPEC, "tiny")[0].eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model


def _batch(rows: int = 2, length: int = 3 * BLOCK + 1, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, tm.VOCAB, (rows, length), generator=g)
    return Batch(ids, torch.ones(rows, length), torch.ones(rows, length, dtype=torch.long), list(range(rows)))


def test_accept_by_position_counts_drafts_reaching_each_position():
    got = accept_by_position([0, 1, 5, 3], 5)
    assert got == {"tau": 2.25, "accept@1": 0.75, "accept@2": 0.5, "accept@3": 0.5, "accept@4": 0.25, "accept@5": 0.25}
    assert accept_by_position([], 2) == {"tau": 0.0, "accept@1": 0.0, "accept@2": 0.0}


def test_greedy_labels_of_a_teacher_forced_store_are_the_targets_argmax(store, target):
    labels = GreedyLabels(store, target)
    assert labels.computed
    batch = make_batch(store, list(range(len(store))), 16, 0.0)
    with torch.no_grad():
        argmax = target(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.argmax(-1)
    valid = batch.attention_mask.bool()
    got = labels(batch)
    assert torch.equal(got[valid], argmax[valid])
    assert not torch.equal(got[:, :-1][valid[:, 1:]], batch.input_ids[:, 1:][valid[:, 1:]])  # the text is not greedy


def test_glide_acceptance_by_position_against_its_labels(glide, target):
    batch = _batch()
    kv = target_kv_batch(glide, target, batch)
    with torch.no_grad():
        own = glide.vocab_subset[_draft_logits(glide, batch, kv, BLOCK, "none").argmax(-1)]  # [B, T] own next tokens
    full = glide_acceptance(glide, target, batch, block=BLOCK, labels_fn=lambda b: own)
    assert full["drafts"] == 2 * 3 and full["tau"] == full["tau@5"] == 5.0
    assert [full[f"accept@{k}"] for k in range(1, 6)] == [1.0] * 5
    third_wrong = own.clone()
    third_wrong[:, 2::BLOCK] = -1  # every draft's third token misses
    cut = glide_acceptance(glide, target, batch, block=BLOCK, labels_fn=lambda b: third_wrong)
    assert [cut[f"accept@{k}"] for k in range(1, 6)] == [1.0, 1.0, 0.0, 0.0, 0.0] and cut["tau"] == 2.0


def _decoding_logits(glide, target, batch: Batch, p: int, j: int) -> torch.Tensor:
    """What drafted position ``j`` of a draft started at block start ``p`` reads in decoding: the draft, fed its own
    greedy tokens one at a time after the verified ``p + 1``; its logits ``[B, N]`` for token ``p + j``."""
    seq = batch.input_ids[:, : p + 1]
    kv = target_kv_batch(glide, target, batch)
    for o in range(j):
        t = seq.shape[1]
        sub = Batch(seq, batch.weights[:, :t], batch.attention_mask[:, :t], batch.index)
        logits = _draft_logits(glide, sub, [(k[:, :, :t], v[:, :, :t]) for k, v in kv], BLOCK, "none")[:, -1]
        if o < j - 1:
            seq = torch.cat([seq, glide.vocab_subset[logits.argmax(-1)][:, None]], dim=1)
    return logits


def _ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the labels inside the draft's vocabulary (the losses ignore the others)."""
    n = logits.shape[-1]
    keep = (labels < n).flatten()
    return F.cross_entropy(logits.flatten(0, 1)[keep], labels.flatten()[keep])


def test_glide_unrolled_positions_see_what_decoding_shows_them(glide, target):
    batch = _batch()
    labels = glide.to_draft_ids(batch.input_ids[:, 1:])
    with torch.no_grad():
        _, metrics = glide_loss(glide, target, batch, BLOCK, unroll=3)
        teacher = _draft_logits(glide, batch, target_kv_batch(glide, target, batch), BLOCK, "none")
    for j in (2, 3):
        starts = range(0, batch.input_ids.shape[1] - j, BLOCK)
        decoded = torch.stack([_decoding_logits(glide, target, batch, p, j) for p in starts], dim=1)  # [B, D, N]
        at = [p + j - 1 for p in starts]
        want, forced = (_ce(logits, labels[:, at]) for logits in (decoded, teacher[:, at]))
        assert metrics[f"loss@{j}"] == pytest.approx(want.item(), rel=1e-5), j
        assert abs(metrics[f"loss@{j}"] - forced.item()) > 1e-3  # not the teacher-forced loss


@pytest.fixture(scope="module")
def redrafter(target, store):
    torch.manual_seed(0)
    spec = ReDrafterSpec(exit_dim=24, num_draft_layers=1, draft_vocab_size=64, beam_length=3)
    head = build_redrafter(target, store, spec, "tiny")[0].eval()
    with torch.no_grad():  # sharp, as the GLIDE above
        for p in head.parameters():
            p.normal_(0.0, 0.5)
    return head


def test_redrafter_unrolled_step_is_fed_its_own_token(redrafter, target, store):
    batch = make_batch(store, list(range(len(store))), 16, 0.5)
    with torch.no_grad():
        _, metrics = redrafter_loss(redrafter, target, batch, L=3, store=store, unroll=2)
        x, e = target_context(redrafter, target, batch, store)
        t = x.shape[1]
        n = t - 3  # positions with a step-2 label
        s1 = redrafter.step(torch.zeros_like(x[:, :n]), e[:, 1 : 1 + n])
        first = redrafter.to_target_ids(redrafter.logits(s1, x[:, :n], full_vocab=False).argmax(-1))
        s2 = redrafter.step(s1, target.get_input_embeddings()(first))
        logits = redrafter.logits(s2, x[:, :n], full_vocab=False)
        labels = redrafter.to_draft_ids(batch.input_ids[:, 3 : 3 + n])
        w = batch.weights[:, 3 : 3 + n] * (labels < logits.shape[-1])
        ce = F.cross_entropy(logits.flatten(0, 1), labels.clamp_max(logits.shape[-1] - 1).flatten(), reduction="none")
        want = (ce * w.flatten()).sum() / w.sum()
    assert metrics["own@2"] == pytest.approx(want.item(), rel=1e-5)
    assert abs(metrics["own@2"] - metrics["loss@2"]) > 1e-3


def test_redrafter_feature_loss_regresses_every_step(redrafter, target, store):
    batch = make_batch(store, list(range(len(store))), 16, 0.5)
    h = int(target.config.hidden_size)
    with torch.no_grad():
        plain, _ = redrafter_loss(redrafter, target, batch, L=3, store=store)
        both, metrics = redrafter_loss(redrafter, target, batch, L=3, store=store, features=FeatureRegression(h, h))
    terms = [metrics[f"feature@{k}"] for k in (1, 2, 3)]
    assert min(terms) > 0 and both.item() == pytest.approx(plain.item() + sum(terms), rel=1e-5)


def test_redrafter_acceptance_scores_against_its_labels(redrafter, target, store):
    _, held = split_records(store, 4)
    default = redrafter_acceptance(redrafter, target, store, held, L=3)
    stored = redrafter_acceptance(redrafter, target, store, held, L=3, labels_fn=lambda b: b.input_ids[:, 1:])

    def first_own(b):  # column t + 1: the head's first drafted token after position t
        x, e = target_context(redrafter, target, b, store)
        s1 = redrafter.step(torch.zeros_like(x[:, :-2]), e[:, 1:-1])
        labels = torch.full_like(b.input_ids, -1)
        labels[:, 1:-1] = redrafter.to_target_ids(redrafter.logits(s1, x[:, :-2], full_vocab=False).argmax(-1))
        return labels

    first = redrafter_acceptance(redrafter, target, store, held, L=3, labels_fn=first_own)
    assert default == stored and default["eval_positions"] > 0 and default["accept@1"] < 0.5
    assert first["accept@1"] == 1.0 and first["eval_positions"] == default["eval_positions"]


def test_feature_loss_is_added_and_trained_beside_the_head_not_saved(glide, target, store, tmp_path):
    batch = make_batch(store, list(range(len(store))), 16, 0.5)
    regression = FeatureRegression(GLIDE_SPEC.hidden_size, int(target.config.hidden_size), weight=2.0)
    with torch.no_grad():
        plain, _ = glide_loss(glide, target, batch, BLOCK)
        both, metrics = glide_loss(glide, target, batch, BLOCK, features=regression, store=store)
    assert metrics["feature_loss"] > 0
    assert both.item() == pytest.approx(plain.item() + metrics["feature_loss"], rel=1e-5)

    model = build_glide(target, store, GLIDE_SPEC, "tiny")[0]
    before, keys = regression.proj.weight.detach().clone(), set(model.state_dict())
    cfg = TrainConfig(tmp_path, steps=3, batch_size=2, max_len=16, eval_every=3, eval_records=2, warmup=1)
    train_idx, _ = split_records(store, cfg.eval_records)

    def fn(m, b, features):
        return glide_loss(m, target, b, BLOCK, features=features, store=store)

    train(
        model,
        iterate_batches(store, train_idx, cfg),
        HeadLoss(fn, features=regression),
        lambda m: {},
        lambda m, s: None,
        cfg,
        progress=False,
    )
    assert not torch.equal(regression.proj.weight, before)  # the loop trains the loss's own map
    assert set(model.state_dict()) == keys  # the head holds none of it
