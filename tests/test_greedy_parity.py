"""Greedy decoding with hf_cascade assistants gives exactly plain ``generate()``'s tokens: the cascade's own
configurations (K-matrices, several drafters, lenience, confidence rules, padded vocabularies), counts,
stops, outputs, streams and pipelines. The configurations of the contract registry (Max-Gram alone, drafter +
Max-Gram, lenience 3, Max-Gram first + cost-aware) are checked in tests/test_contract.py, with the reuse of
an assistant across calls."""

from __future__ import annotations

import os

import pytest
import torch
import transformers
from transformers import TextStreamer, pipeline
from transformers.generation.streamers import BaseStreamer

import hf_cascade
from hf_cascade import CascadeAssistant, CascadeSettings, MaxGram, Policy
from hf_cascade.core.payoff import CostModel
from tests import tiny_models as tm
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

#: The paper's cascade (fixed K-matrix lengths, largest drafter first): what these tests of Algorithm 1 count on;
#: the defaults (``maxgram_first``, ``cost_aware``) admit a drafter's tokens only where they pay on this machine.

REPETITIVE = ids(1, 5, 6, 7, 5, 6, 7, 5, 6)
ONE_TOKEN = ids(9)
NEW = 30

_MODELS: dict = {}


def models(name: str) -> dict:
    """Target and drafters for ``name`` ("llama" / "gemma3"), built once per session."""
    if name not in _MODELS:
        target = tm.llama_target() if name == "llama" else tm.gemma3_target()
        _MODELS[name] = {
            "target": target,
            "copy": tm.copy_model(target),
            "trunc": tm.truncated_copy(target),
            "noisy": tm.noisy_copy(target, noise=0.3),
            "big": tm.noisy_copy(target, noise=0.15, seed=7),
            "padded": tm.padded_vocab_copy(target),
        }
    return _MODELS[name]


@pytest.fixture(params=["llama", "gemma3"], scope="module")
def m(request):
    return models(request.param)


def plain(target, prompt, **kw):
    kw.setdefault("max_new_tokens", NEW)
    return target.generate(prompt, do_sample=False, **kw)


def ours(target, prompt, assistant, **kw):
    kw.setdefault("max_new_tokens", NEW)
    return target.generate(prompt, do_sample=False, assistant_model=assistant, **kw)


def assert_parity(target, prompt, assistant, **kw):
    expected = plain(target, prompt, **kw)
    got = ours(target, prompt, assistant, **kw)
    assert got.tolist() == expected.tolist()
    stats = assistant.last_stats
    assert stats is not None and stats.target_calls >= 1
    assert stats.new_tokens == got.shape[1] - prompt.shape[1]
    return stats


def mg_fixed(**kw):
    """Max-Gram with a deterministic lookahead (no timing measurements)."""
    return MaxGram(cost=CostModel(measure=False), **kw)


CONFIGS = {
    "maxgram": lambda m: CascadeAssistant([MaxGram()]),
    "maxgram_fixed10": lambda m: CascadeAssistant([MaxGram(adaptive=False)]),
    "drafter+maxgram": lambda m: CascadeAssistant([m["trunc"], MaxGram()]),
    "noisy+maxgram_fixed": lambda m: CascadeAssistant([m["noisy"], MaxGram(adaptive=False, max_tokens=4)]),
    "drafter": lambda m: CascadeAssistant([m["noisy"]]),
    "drafter_k5": lambda m: CascadeAssistant([m["trunc"]], settings=CascadeSettings(k_matrix=[[5]])),
    "big+small+maxgram": lambda m: CascadeAssistant([m["big"], m["trunc"], MaxGram()]),
    "big+small": lambda m: CascadeAssistant(
        [m["big"], m["noisy"]], settings=CascadeSettings(k_matrix=[[3, 1], [0, 2]])
    ),
    "k_1_5_0_3": lambda m: CascadeAssistant(
        [m["noisy"], mg_fixed()], settings=CascadeSettings(k_matrix=[[1, 5], [0, 3]])
    ),
    "k_4_0_0_1": lambda m: CascadeAssistant(
        [m["noisy"], MaxGram(adaptive=False)], settings=CascadeSettings(k_matrix=[[4, 0], [0, 1]])
    ),
    "k_unused_drafter": lambda m: CascadeAssistant(
        [m["noisy"], MaxGram(adaptive=False)], settings=CascadeSettings(k_matrix=[[0, 10], [0, 0]])
    ),
    "lenience3": lambda m: CascadeAssistant(
        [m["noisy"], MaxGram(adaptive=False, max_tokens=5)], settings=CascadeSettings(lenience=3.0)
    ),
    "lenience3_drafters": lambda m: CascadeAssistant(
        [m["big"], m["noisy"], mg_fixed()], settings=CascadeSettings(lenience=3.0)
    ),
    "lenience3_k": lambda m: CascadeAssistant(
        [m["big"], m["noisy"]], settings=CascadeSettings(k_matrix=[[4, 2], [0, 3]], lenience=3.0)
    ),
    "maxgram_lenient_conf": lambda m: CascadeAssistant(
        [m["noisy"], mg_fixed()],
        settings=CascadeSettings(k_matrix=[[4, 10], [0, 10]], maxgram_lenience=float("inf"), min_confidence=0.4),
    ),
    "maxgram_first": lambda m: CascadeAssistant(
        [m["noisy"], mg_fixed()], settings=CascadeSettings(k_matrix=[[3, 10], [0, 10]], min_confidence=0.3)
    ),
    "maxgram_first_drop_unsure": lambda m: CascadeAssistant(
        [m["noisy"], mg_fixed()],
        settings=CascadeSettings(k_matrix=[[3, 10], [0, 10]], min_confidence=0.3, keep_unsure=False),
    ),
    "maxgram_first_cost_aware": lambda m: CascadeAssistant(
        [m["noisy"], MaxGram()], settings=CascadeSettings(k_matrix=[[6, 10], [0, 10]])
    ),
    "maxgram_first_two": lambda m: CascadeAssistant([m["big"], m["noisy"], MaxGram()]),
    "maxgram_lenience2": lambda m: CascadeAssistant(
        [m["noisy"], MaxGram(adaptive=False, max_tokens=5)], settings=CascadeSettings(maxgram_lenience=2.0)
    ),
    "padded_drafter": lambda m: CascadeAssistant([m["padded"], MaxGram()]),
    "padded_drafter_alone": lambda m: CascadeAssistant([m["padded"]], settings=CascadeSettings(k_matrix=[[3]])),
}


# checked for every target setting by tests/test_contract.py (the same or the contract's drafter)
IN_CONTRACT = {"maxgram", "drafter+maxgram", "lenience3", "maxgram_first_cost_aware"}


@pytest.mark.parametrize("config", [c for c in CONFIGS if c not in IN_CONTRACT])
@pytest.mark.parametrize("prompt", [REPETITIVE, ONE_TOKEN], ids=["repetitive", "one_token"])
def test_greedy_parity(m, config, prompt):
    assert_parity(m["target"], prompt, CONFIGS[config](m))


def test_maxgram_drafts_are_accepted_and_rejected(m):
    """The parity tests above exercise both outcomes of a Max-Gram draft on these targets."""
    a = CascadeAssistant([MaxGram(adaptive=False)])
    stats = assert_parity(m["target"], REPETITIVE, a, max_new_tokens=40)
    mg = stats.levels[0]
    assert 0 < mg.tokens_accepted < mg.tokens_proposed
    assert stats.tokens_per_target_call > 1.2
    assert any(n < k for n, k in zip(stats.accepted_per_call, stats.draft_len_per_call))


def test_neural_drafts_rejected_sometimes(m):
    a = CascadeAssistant([m["noisy"]], settings=CascadeSettings(k_matrix=[[3]]), policy=Policy.paper())
    stats = assert_parity(m["target"], REPETITIVE, a)
    assert 0 < sum(stats.accepted_per_call) < sum(stats.draft_len_per_call)


def test_long_generation_through_sliding_window(m):
    """Sequences several times the sliding window (8 on Gemma3): drafter caches roll back through it."""
    for a in (
        CascadeAssistant([m["trunc"], MaxGram()]),
        CascadeAssistant([m["noisy"]], settings=CascadeSettings(k_matrix=[[6]])),
    ):
        assert_parity(m["target"], REPETITIVE, a, max_new_tokens=60)


# -- counts --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, neural_tokens",
    [
        (lambda m: CascadeAssistant([m["copy"]], policy=Policy.paper()), 2),
        (lambda m: CascadeAssistant([m["copy"]], settings=CascadeSettings(k_matrix=[[4]]), policy=Policy.paper()), 4),
        (lambda m: CascadeAssistant([m["copy"], MaxGram(adaptive=False)], policy=Policy.paper()), 2),
    ],
    ids=["copy", "copy_k4", "copy+maxgram"],
)
def test_drafter_equal_to_target_accepts_everything(m, make, neural_tokens):
    a = make(m)
    stats = assert_parity(m["target"], REPETITIVE, a)
    assert stats.tokens_per_target_call > 2
    # every token of the (identical) neural drafter is accepted; Max-Gram's tokens after them
    # (horizontal cascade, unreviewed by the drafter) may be rejected
    for n, k in zip(stats.accepted_per_call, stats.draft_len_per_call):
        assert n >= min(neural_tokens, k)
    assert stats.levels[0].forward_calls > 0


def test_drafter_equal_to_target_count_is_exact(m):
    a = CascadeAssistant([m["copy"]], settings=CascadeSettings(k_matrix=[[2]]), policy=Policy.paper())
    stats = assert_parity(m["target"], REPETITIVE, a, max_new_tokens=30)
    # 30 tokens, 3 per target call (2 drafts + 1 bonus)
    assert stats.target_calls == 10
    assert stats.accepted_per_call == [2] * 10
    assert stats.tokens_per_target_call == 3.0


# -- EOS, max length --------------------------------------------------------------------------------


@pytest.mark.parametrize("config", ["copy_k6", "copy+maxgram", "maxgram_fixed10", "noisy"])
def test_eos_inside_a_draft(m, config):
    target = m["target"]
    free = plain(target, REPETITIVE, max_new_tokens=40)[0, REPETITIVE.shape[1] :].tolist()
    eos = free[6]  # a token the model emits (our targets loop, so it recurs in drafts)
    first = free.index(eos)
    assistant = {
        "copy_k6": lambda: CascadeAssistant([m["copy"]], settings=CascadeSettings(k_matrix=[[6]])),
        "copy+maxgram": lambda: CascadeAssistant([m["copy"], MaxGram(adaptive=False)]),
        "maxgram_fixed10": lambda: CascadeAssistant([MaxGram(adaptive=False)]),
        "noisy": lambda: CascadeAssistant([m["noisy"]], settings=CascadeSettings(k_matrix=[[5]])),
    }[config]()
    expected = plain(target, REPETITIVE, max_new_tokens=40, eos_token_id=eos)
    got = ours(target, REPETITIVE, assistant, max_new_tokens=40, eos_token_id=eos)
    assert got.tolist() == expected.tolist()
    assert got.shape[1] == REPETITIVE.shape[1] + first + 1 and int(got[0, -1]) == eos
    assert assistant.last_stats.new_tokens == first + 1


@pytest.mark.parametrize("new", [1, 2, 3, 5])
@pytest.mark.parametrize("config", ["copy_k4", "copy+maxgram", "maxgram_fixed10"])
def test_max_new_tokens_reached_mid_draft(m, new, config):
    assistant = {
        "copy_k4": lambda: CascadeAssistant([m["copy"]], settings=CascadeSettings(k_matrix=[[4]])),
        "copy+maxgram": lambda: CascadeAssistant([m["copy"], MaxGram(adaptive=False)]),
        "maxgram_fixed10": lambda: CascadeAssistant([MaxGram(adaptive=False)]),
    }[config]()
    stats = assert_parity(m["target"], REPETITIVE, assistant, max_new_tokens=new)
    assert assistant.last_stats.new_tokens == new
    # drafts never run past the length budget
    assert all(k <= new - 1 for k in stats.draft_len_per_call)


# -- outputs ---------------------------------------------------------------------------------------


def test_scores_and_logits_match_plain(m):
    target = m["target"]
    kw = dict(max_new_tokens=20, return_dict_in_generate=True, output_scores=True, output_logits=True)
    expected = plain(target, REPETITIVE, **kw)
    for a in (CascadeAssistant([m["trunc"], MaxGram()]), CascadeAssistant([MaxGram(adaptive=False)])):
        assert_same_outputs(ours(target, REPETITIVE, a, **kw), expected, 20)


def assert_same_outputs(got, expected, steps: int) -> None:
    """``generate(..., return_dict_in_generate=True, output_scores=True, output_logits=True)`` outputs agree:
    the same sequences and ``steps`` scores and logits per step (up to float noise)."""
    assert got.sequences.tolist() == expected.sequences.tolist()
    assert len(got.scores) == len(expected.scores) == steps
    assert len(got.logits) == len(expected.logits) == steps
    for s_got, s_exp in zip(got.scores, expected.scores):
        torch.testing.assert_close(s_got, s_exp, atol=1e-4, rtol=1e-4)
    for s_got, s_exp in zip(got.logits, expected.logits):
        torch.testing.assert_close(s_got, s_exp, atol=1e-4, rtol=1e-4)


def _processor_kwargs(target, name):
    free = plain(target, REPETITIVE)[0, REPETITIVE.shape[1] :].tolist()
    return {
        "repetition_penalty": {"repetition_penalty": 1.5},
        "no_repeat_ngram_size": {"no_repeat_ngram_size": 2},
        "bad_words_ids": {"bad_words_ids": [[free[0]], [free[3]]]},
        "combined": {"repetition_penalty": 1.2, "no_repeat_ngram_size": 3, "bad_words_ids": [[free[1]]]},
    }[name]


@pytest.mark.parametrize(
    "name, config",
    [
        (name, config)
        for name in ("repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "combined")
        for config in ("drafter+maxgram", "maxgram_fixed10", "lenience3_drafters")
        # repetition_penalty / no_repeat_ngram_size with drafter + Max-Gram: tests/test_contract.py
        if not (config == "drafter+maxgram" and name in ("repetition_penalty", "no_repeat_ngram_size"))
    ],
)
def test_logits_processors(m, name, config):
    target = m["target"]
    kw = _processor_kwargs(target, name)
    # the processor really changes the output (so parity is not trivially inherited)
    assert plain(target, REPETITIVE, **kw).tolist() != plain(target, REPETITIVE).tolist()
    assert_parity(target, REPETITIVE, CONFIGS[config](m), **kw)


class Collect(BaseStreamer):
    def __init__(self):
        self.chunks = []
        self.ended = 0

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.ended += 1


def test_streamer_receives_exactly_the_generated_tokens(m):
    target = m["target"]
    expected_stream = Collect()
    expected = plain(target, REPETITIVE, streamer=expected_stream)
    s = Collect()
    got = ours(target, REPETITIVE, CascadeAssistant([m["trunc"], MaxGram()]), streamer=s)
    assert got.tolist() == expected.tolist()
    assert s.chunks[0] == REPETITIVE[0].tolist()  # the prompt first
    assert sum(s.chunks[1:], []) == got[0, REPETITIVE.shape[1] :].tolist()
    assert s.ended == 1
    assert len(s.chunks) - 1 < NEW  # some chunks hold several tokens


class TextCollect(TextStreamer):
    def __init__(self, tokenizer):
        super().__init__(tokenizer, skip_prompt=True)
        self.text = ""

    def on_finalized_text(self, text, stream_end=False):
        self.text += text


def test_text_streamer(m):
    target, tok = m["target"], tm.word_tokenizer()
    ref = TextCollect(tok)
    expected = plain(target, REPETITIVE, streamer=ref)
    s = TextCollect(tok)
    got = ours(target, REPETITIVE, CascadeAssistant([m["noisy"], MaxGram()]), streamer=s)
    assert got.tolist() == expected.tolist()
    assert s.text == ref.text
    assert s.text.split() == tok.decode(got[0, REPETITIVE.shape[1] :]).split()


# -- pipeline ---------------------------------------------------------------------------------------


def test_pipeline(m):
    target, tok = m["target"], tm.word_tokenizer()
    text = "w5 w6 w7 w5 w6 w7 w5 w6"
    kw = dict(max_new_tokens=25, do_sample=False)
    expected = pipeline("text-generation", model=target, tokenizer=tok)(text, **kw)[0]["generated_text"]

    at_construction = CascadeAssistant([m["trunc"], MaxGram()])
    pipe = pipeline("text-generation", model=target, tokenizer=tok, assistant_model=at_construction)
    assert pipe(text, **kw)[0]["generated_text"] == expected
    assert at_construction.last_stats is not None and at_construction.last_stats.new_tokens == 25

    per_call = CascadeAssistant([MaxGram(adaptive=False)])
    pipe = pipeline("text-generation", model=target, tokenizer=tok)
    assert pipe(text, assistant_model=per_call, **kw)[0]["generated_text"] == expected
    assert per_call.last_stats is not None and per_call.last_stats.new_tokens == 25


# -- the hook leaves every other generate() call alone ------------------------------------------------


def _other_calls(target, hf_assistant):
    out = [plain(target, REPETITIVE), plain(target, ONE_TOKEN)]
    out.append(plain(target, REPETITIVE, prompt_lookup_num_tokens=5))
    out.append(plain(target, REPETITIVE, assistant_model=hf_assistant))
    torch.manual_seed(11)
    out.append(target.generate(REPETITIVE, do_sample=True, max_new_tokens=NEW, top_k=20))
    torch.manual_seed(12)
    out.append(target.generate(REPETITIVE, do_sample=True, max_new_tokens=NEW, assistant_model=hf_assistant))
    return [o.tolist() for o in out]


def test_other_generate_calls_unchanged(m):
    target = m["target"]
    hf_assistant = tm.truncated_copy(target)
    installed = _other_calls(target, hf_assistant)
    hf_cascade.hook.uninstall()
    try:
        # without the hook, transformers cannot use our assistant: it fails inside transformers' own code, and no
        # frame of hf_cascade runs on the way (nothing of the hook is left in generate())
        with pytest.raises(Exception) as err:
            ours(target, REPETITIVE, CascadeAssistant([MaxGram()]))
        frames = [str(entry.path) for entry in err.traceback]
        package = os.path.dirname(hf_cascade.__file__)
        assert frames[-1].startswith(os.path.dirname(transformers.__file__)), frames[-1]
        assert not any(f.startswith(package) for f in frames), frames
        uninstalled = _other_calls(target, hf_assistant)
    finally:
        hf_cascade.hook.install()
    assert installed == uninstalled
    assert _other_calls(target, hf_assistant)[:3] == installed[:3]
    # and our assistant works again
    assert_parity(target, REPETITIVE, CascadeAssistant([MaxGram()]))


def test_install_is_idempotent():
    from transformers.generation.utils import GenerationMixin

    hf_cascade.hook.install()
    hf_cascade.hook.install()
    wrapper = GenerationMixin._get_candidate_generator
    original = wrapper.__hf_cascade_original__
    assert getattr(original, "__hf_cascade_original__", None) is None
