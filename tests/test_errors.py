"""What hf_cascade assistants do not support fails early with a clear ValueError / TypeError."""

from __future__ import annotations

import pytest
import torch
from transformers import StaticCache

from hf_cascade import (
    CascadeAssistant,
    CascadeSettings,
    Loading,
    LossyLenientTarget,
    MaxGram,
)
from hf_cascade.compat import CACHE
from hf_cascade.core.static import static_rollback_supported
from hf_cascade.drafters.neural import check_same_vocabulary
from tests import tiny_models as tm
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

PROMPT = ids(1, 5, 6, 7, 5, 6)


@pytest.fixture(scope="module")
def target():
    return tm.llama_target()


def gen(target, assistant, prompt=PROMPT, **kw):
    kw.setdefault("max_new_tokens", 5)
    kw.setdefault("do_sample", False)
    return target.generate(prompt, assistant_model=assistant, **kw)


# -- vocabulary ---------------------------------------------------------------------------------


def test_vocabulary_size_mismatch(target):
    other = tm.llama(vocab_size=tm.VOCAB + 1025, seed=3)
    with pytest.raises(ValueError, match="Vocabulary mismatch.*96.*1121"):
        gen(target, CascadeAssistant([other, MaxGram()]))
    with pytest.raises(ValueError, match="Vocabulary mismatch"):
        check_same_vocabulary(target, other)
    # up to 1024 padding rows are fine (a padded copy of the same vocabulary)
    check_same_vocabulary(target, tm.llama(vocab_size=tm.VOCAB + 1024, seed=3))


def test_different_eos(target):
    other = tm.llama(eos_token_id=3, seed=3)
    with pytest.raises(ValueError, match="eos_token_id"):
        gen(target, CascadeAssistant([other]))


def test_different_tokenizer_is_detected_when_both_are_given(target):
    """``CascadeAssistant(tokenizer=...)`` promises an exact vocabulary check when
    ``generate(..., tokenizer=...)`` is also given."""
    drafter = tm.copy_model(target)
    assistant = CascadeAssistant([drafter], loading=Loading(tokenizer=tm.word_tokenizer(tm.VOCAB - 6)))
    with pytest.raises(ValueError, match="different tokenizer"):
        gen(target, assistant, tokenizer=tm.word_tokenizer())


def test_same_tokenizer_is_fine(target):
    assistant = CascadeAssistant([tm.copy_model(target)], loading=Loading(tokenizer=tm.word_tokenizer()))
    out = gen(target, assistant, tokenizer=tm.word_tokenizer())
    assert out.shape[1] == PROMPT.shape[1] + 5


# -- unsupported generation settings -------------------------------------------------------------------


@pytest.mark.parametrize("do_sample", [False, True])
def test_beam_search(target, do_sample):
    """transformers silently drops an assistant under beam search; ours must refuse instead of
    being ignored."""
    assistant = CascadeAssistant([MaxGram()])
    with pytest.raises(ValueError, match="beam"):
        gen(target, assistant, num_beams=2, do_sample=do_sample)


def test_guidance_scale(target):
    """Classifier-free guidance runs its own unconditional forward per plain step: refused, not silently changed."""
    with pytest.raises(ValueError, match="guidance"):
        gen(target, CascadeAssistant([MaxGram()]), guidance_scale=1.5)


@pytest.mark.skipif(static_rollback_supported(), reason="transformers >= 5 runs static caches (tests/test_static.py)")
def test_static_refused_before_5(target):
    """4.57's static layers do not roll back: a static cache is refused there (at batch 1 and for a batch), naming the
    release it needs."""
    with pytest.raises(ValueError, match="transformers >= 5 for a static cache"):
        gen(target, CascadeAssistant([MaxGram()]), cache_implementation="static")
    with pytest.raises(ValueError, match="transformers >= 5 for a static cache"):
        gen(target, CascadeAssistant([MaxGram()]), **{CACHE: StaticCache(config=target.config, max_cache_len=64)})
    batch = torch.tensor([[0, 1, 5, 6], [1, 9, 10, 11]])  # a batch too (batched loop)
    for static in ({"cache_implementation": "static"}, {CACHE: StaticCache(config=target.config, max_cache_len=64)}):
        with pytest.raises(ValueError, match="transformers >= 5 for a static cache"):
            gen(
                target,
                CascadeAssistant([MaxGram()]),
                batch,
                attention_mask=(batch != 0).long(),
                pad_token_id=0,
                **static,
            )


def test_other_caches(target):
    with pytest.raises(ValueError, match="dynamic or a static cache"):
        gen(target, CascadeAssistant([MaxGram()]), cache_implementation="offloaded")


def test_another_draft_source(target):
    """transformers' own draft sources (prompt lookup; MTP heads from 5.24) beside an hf_cascade assistant: refused."""
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens"):
        gen(target, CascadeAssistant([MaxGram()]), prompt_lookup_num_tokens=3)


def test_other_decoding_modes(target):
    """transformers lets an assistant override DoLa with a warning only; hf_cascade refuses. (Contrastive search
    never reaches the hook: transformers itself sends it to its Hub recipe first.)"""
    with pytest.raises(ValueError, match="greedy decoding and sampling; this call asks for dola"):
        gen(target, CascadeAssistant([MaxGram()]), dola_layers="high")


def test_no_cache(target):
    with pytest.raises(ValueError, match="use_cache"):
        gen(target, CascadeAssistant([MaxGram()]), use_cache=False)


# -- bad settings ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "k, message",
    [
        ([[2, 10]], "must be 2x2"),
        ([[2, 10], [3, 10]], "upper triangular"),
        ([[2, -1], [0, 10]], ">= 0"),
        ([[0, 0], [0, 10]], "row 0 is all zeros"),
        ([[2, 10], [0, 0]], "row 1 is all zeros"),
        ([[0.5, 10], [0, 10]], "whole numbers"),
    ],
)
def test_bad_k_matrix(target, k, message):
    with pytest.raises(ValueError, match=message):
        CascadeAssistant([tm.copy_model(target), MaxGram()], settings=CascadeSettings(k_matrix=k))


@pytest.mark.parametrize("lenience", [0.0, 0.5, 0.999, -1.0])
def test_lenience_below_one(target, lenience):
    with pytest.raises(ValueError, match="lenience must be >= 1"):
        CascadeAssistant([tm.copy_model(target), MaxGram()], settings=CascadeSettings(lenience=lenience))
    with pytest.raises(ValueError, match="lenience must be >= 1"):
        LossyLenientTarget(lenience)


def test_maxgram_must_be_last(target):
    with pytest.raises(ValueError, match="MaxGram must be the last"):
        CascadeAssistant([MaxGram(), tm.copy_model(target)])
    with pytest.raises(ValueError, match="MaxGram must be the last"):
        CascadeAssistant([MaxGram(), MaxGram()])


@pytest.mark.parametrize("bad", [torch.nn.Linear(2, 2), None, 3])  # strings are paths / Hub ids: test_hub_loading
def test_non_model_drafter(bad):
    with pytest.raises(TypeError, match="Drafter 0 must be a transformers causal LM or MaxGram"):
        CascadeAssistant([bad, MaxGram()])


def test_no_drafters():
    with pytest.raises(ValueError, match="at least one drafter"):
        CascadeAssistant([])


def test_errors_leave_target_usable(target):
    """After a refused call, the same target and a valid assistant still work (nothing half-installed)."""
    with pytest.raises(ValueError):
        gen(target, CascadeAssistant([MaxGram()]), num_beams=2)
    a = CascadeAssistant([MaxGram()])
    assert gen(target, a).tolist() == target.generate(PROMPT, max_new_tokens=5, do_sample=False).tolist()
