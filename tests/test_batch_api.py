"""Batched ``generate()`` as transformers' API has it (issue 27; the checks of tests/test_batch.py (5), (6)):
what stays unsupported with ``B > 1`` (right padding, a streamer (as in transformers), transformers' assisted
loop, beam search, lossy target rules) is refused with a ``ValueError`` before any forward;
``return_dict_in_generate=True`` gives plain's sequences, and with ``output_scores`` / ``output_logits`` plain's
scores and logits (every generated column, rows that stopped early included); logits processors that index the
batch see each row as plain batched ``generate`` gives it."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.streamers import BaseStreamer

import hf_cascade  # noqa: F401  (installs the generate() hook)
from hf_cascade import CascadeAssistant, LossyLenientTarget, MaxGram
from tests.contract_registry import REGISTRY, base_kit, detached_copy, fresh_kit
from tests.test_batch import REP, ROWS, left_pad
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

# -- (5) errors and (6) return_dict_in_generate ---------------------------------------------------------------


class _Streamer(BaseStreamer):
    def put(self, value):
        pass

    def end(self):
        pass


def _transformers_loop():
    a = CascadeAssistant([MaxGram()])
    a.loop = "transformers"
    return a


ERRORS = {
    "right_padding": ("left padding", lambda: {"attention_mask": left_pad(ROWS)[1].flip(1)}),
    "streamer": ("streamer", lambda: {"streamer": _Streamer()}),
    "transformers_loop": ("one unpadded row", lambda: {"assistant_model": _transformers_loop()}),
    "beam_search": ("beam search", lambda: {"num_beams": 2}),
    "lossy_rules": ("batch size 1", lambda: {"logits_processor": [LossyLenientTarget(2.0)]}),
}


@pytest.mark.parametrize("error", list(ERRORS))
def test_batch_errors(error):
    """Refused with a ValueError before any forward of the target; the target works afterwards."""
    target = base_kit("llama").target
    match, extra = ERRORS[error]
    input_ids, mask = left_pad(ROWS)
    kw = {
        "attention_mask": mask,
        "assistant_model": CascadeAssistant([MaxGram()]),
        "do_sample": False,
        "max_new_tokens": 5,
        **extra(),
    }
    forwards = []
    handle = target.register_forward_pre_hook(lambda *a: forwards.append(1))
    try:
        with pytest.raises(ValueError, match=match):
            target.generate(input_ids, **kw)
    finally:
        handle.remove()
    assert forwards == []
    plain = target.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=5)
    out = target.generate(
        input_ids, attention_mask=mask, do_sample=False, max_new_tokens=5, assistant_model=CascadeAssistant([MaxGram()])
    )
    assert out.tolist() == plain.tolist()


def test_transformers_loop_refuses_one_padded_row():
    input_ids, mask = left_pad([REP], extra=2)
    with pytest.raises(ValueError, match="one unpadded row"):
        base_kit("llama").target.generate(
            input_ids, attention_mask=mask, do_sample=False, max_new_tokens=5, assistant_model=_transformers_loop()
        )


@pytest.mark.parametrize("do_sample", [False, True])
def test_return_dict_in_generate(do_sample):
    """``return_dict_in_generate=True`` with ``B > 1``: plain's sequences (sampled: the same seed gives a law,
    not tokens, so only the shape and the prompt are compared)."""
    target = base_kit("gemma3").target
    input_ids, mask = left_pad(ROWS)
    kw = {"attention_mask": mask, "do_sample": do_sample, "max_new_tokens": 12, "return_dict_in_generate": True}
    plain = target.generate(input_ids, **kw)
    out = target.generate(input_ids, assistant_model=CascadeAssistant([MaxGram()]), **kw)
    assert type(out) is type(plain)
    if do_sample:
        assert out.sequences[:, : input_ids.shape[1]].tolist() == input_ids.tolist()
        assert out.sequences.shape == plain.sequences.shape
    else:
        assert out.sequences.tolist() == plain.sequences.tolist()


SCORED = ["maxgram", "drafter+maxgram", "glide", "redrafter"]


def assert_batch_scores(target, kit, name: str, extra: dict, tol: float = 1e-4) -> None:
    """``output_scores`` / ``output_logits`` with ``B > 1``: plain batched ``generate``'s tuples, one ``[B, V]``
    float32 per generated column, within ``tol`` -- the columns after a row's EOS included (the target's rows
    after its tokens and pads, processed with the padded row, as plain batched ``generate`` computes them)."""
    from tests.test_batch import _eos_inside_drafts

    device = target.get_input_embeddings().weight.device
    input_ids, mask = left_pad(ROWS, device=device)
    kw = dict(
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=20,
        eos_token_id=_eos_inside_drafts(target),
        return_dict_in_generate=True,
        output_scores=True,
        output_logits=True,
        **extra,
    )
    expected = target.generate(input_ids, **kw)
    ends = [
        row.index(kw["eos_token_id"]) if kw["eos_token_id"] in row else None
        for row in expected.sequences[:, input_ids.shape[1] :].tolist()
    ]
    assert any(e is not None and e < 19 for e in ends)  # a row stops before the others
    a = REGISTRY[name](kit)
    got = target.generate(input_ids, assistant_model=a, **kw)
    assert got.sequences.tolist() == expected.sequences.tolist()
    steps = expected.sequences.shape[1] - input_ids.shape[1]
    for ours, plain in ((got.scores, expected.scores), (got.logits, expected.logits)):
        assert len(ours) == len(plain) == steps
        for s_got, s_exp in zip(ours, plain):
            assert s_got.dtype == torch.float32 and s_got.device == s_exp.device
            torch.testing.assert_close(s_got, s_exp, atol=tol, rtol=tol)
    if not extra:  # (the penalty leaves little to accept)
        assert sum(sum(r.accepted_per_call) for r in a.last_stats.rows) > 0  # drafts were accepted


@pytest.mark.parametrize("name", SCORED)
@pytest.mark.parametrize("extra", [{}, {"repetition_penalty": 1.5}], ids=["plain", "repetition_penalty"])
def test_scores_and_logits_match_plain_batched(name, extra, free_drafts, open_gate):
    target = base_kit("llama").target
    assert_batch_scores(target, fresh_kit("llama", target), name, extra)


@pytest.mark.parametrize("name", ["maxgram", "glide"])
def test_scores_and_logits_bf16_target(name, free_drafts, open_gate):
    """A bf16 target (fp32 drafters): float32 scores and logits, within a few bf16 roundings of plain's
    (verification computes several positions at once, plain one at a time)."""
    target = detached_copy(base_kit("llama").target).to(torch.bfloat16)
    assert_batch_scores(target, fresh_kit("llama", target), name, {}, tol=0.1)


def test_batch_specific_logits_processors():
    """Processors that index the batch see each row as plain batched ``generate`` gives it:
    ``prefix_allowed_tokens_fn`` gets the row's batch id, the repetition penalty each row's padding."""
    target = base_kit("llama").target
    input_ids, mask = left_pad([[1, 5, 6], REP])

    def allowed(batch_id, sent):
        return [10 + batch_id, 20 + batch_id, 30 + batch_id]

    for kw in ({"prefix_allowed_tokens_fn": allowed}, {"repetition_penalty": 1.5}):
        plain = target.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=8, **kw)
        for name in ("maxgram", "drafter+maxgram"):
            a = REGISTRY[name](fresh_kit("llama", target))
            out = target.generate(
                input_ids, attention_mask=mask, do_sample=False, max_new_tokens=8, assistant_model=a, **kw
            )
            assert out.tolist() == plain.tolist(), (kw, name)
