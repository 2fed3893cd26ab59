"""The ``custom_generate`` recipe (issue 54, part 2: ``custom_generate_recipe/`` in Hub layout), run as users run
it: ``model.generate(**inputs, custom_generate=<the recipe's folder>, trust_remote_code=True, assistant_model=...)``,
loaded by transformers from the local path (offline), gives what plain ``generate`` gives.

Tiny models (every CI pass): the default assistant, an hf_cascade assistant and a loaded GLIDE head; a left-padded
batch; ``return_dict_in_generate`` with scores and logits; a streamer; sampling; a pipeline call; ``tokenizer=``
calls (through hf_cascade's hook); transformers' own assisted loop never runs otherwise; clear errors for what the
recipe cannot honour.
The real Gemma-3-270M (``real_model``): Max-Gram, GLIDE + CAPE with the shipped head, a batch of four left-padded
prompts, a text streamer, stop strings, and errors raised before any forward.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import GenerationMixin, pipeline
from transformers.generation.streamers import BaseStreamer

import hf_cascade  # noqa: F401  (the recipe imports it too)
from hf_cascade import CascadeAssistant, GlideAssistant, MaxGram
from tests import tiny_models as tm
from tests.test_glide_decode import echo_glide
from tests.test_greedy_parity import TextCollect
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "custom_generate_recipe"
GLIDE_CARD = ROOT / "model_cards" / "gemma-3-270m-glide-xs"
RUN = {"custom_generate": str(RECIPE), "trust_remote_code": True}
PROMPT = ids(1, 5, 6, 7, 5, 6, 7, 5, 6)
NEW = 20


def left_pad(rows: list[list[int]], pad: int = tm.PAD) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    input_ids = torch.tensor([[pad] * (width - len(r)) + list(r) for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return input_ids, mask


class Chunks(BaseStreamer):
    """Every ``put`` as a list of ids (the prompt first), and how often ``end`` was called."""

    def __init__(self):
        self.chunks, self.ended = [], 0

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.ended += 1


@pytest.fixture(scope="module")
def target():
    return tm.gemma3_target()  # sliding-window layers: plain generate() prepares a sliding cache


@pytest.fixture
def no_assisted_loop(monkeypatch):
    """The recipe decodes through transformers' callable ``custom_generate``, not its assisted loop (nor the hook
    that replaces it)."""
    monkeypatch.setattr(
        GenerationMixin,
        "_assisted_decoding",
        lambda *a, **k: pytest.fail("transformers' assisted loop (or hf_cascade's hook) ran"),
    )


# -- the repository layout ------------------------------------------------------------------------


def test_recipe_layout():
    readme = (RECIPE / "README.md").read_text(encoding="utf-8")
    assert readme.startswith("---\n")
    front = readme.split("---\n")[1]
    assert "library_name: transformers" in front.splitlines()
    assert "- custom_generate" in [line.strip() for line in front.splitlines()]
    assert (RECIPE / "custom_generate" / "generate.py").is_file()
    requirements = (RECIPE / "custom_generate" / "requirements.txt").read_text().split()
    assert any(r.split(">")[0].split("=")[0] == "hf-cascade" for r in requirements)


# -- tiny models ----------------------------------------------------------------------------------


def test_default_assistant_and_given_ones_match_plain(target, no_assisted_loop):
    plain = target.generate(PROMPT, do_sample=False, max_new_tokens=NEW)
    assert target.generate(PROMPT, do_sample=False, max_new_tokens=NEW, **RUN).tolist() == plain.tolist()

    a = CascadeAssistant([MaxGram()])
    out = target.generate(PROMPT, do_sample=False, max_new_tokens=NEW, assistant_model=a, **RUN)
    assert out.tolist() == plain.tolist()
    assert a.last_stats.new_tokens == NEW and a.last_stats.target_calls < NEW  # it drafted

    head = echo_glide(target)  # an hf_cascade checkpoint, loaded
    out = target.generate(PROMPT, do_sample=False, max_new_tokens=NEW, assistant_model=head, **RUN)
    assert out.tolist() == plain.tolist()
    assert isinstance(hf_cascade.assistant_for(head), GlideAssistant)
    assert hf_cascade.assistant_for(head).last_stats.new_tokens == NEW


def test_left_padded_batch_matches_plain(target, no_assisted_loop):
    input_ids, mask = left_pad([[5, 6, 7, 5, 6, 7, 5], [9], [11, 12, 13, 11, 12], [20, 21, 22, 23, 20, 21, 22, 23, 20]])
    kw = {"input_ids": input_ids, "attention_mask": mask, "do_sample": False, "max_new_tokens": 12}
    plain = target.generate(**kw)
    a = CascadeAssistant([MaxGram()])
    assert target.generate(**kw, assistant_model=a, **RUN).tolist() == plain.tolist()
    assert len(a.last_stats.rows) == 4


def test_return_dict_scores_and_logits_match_plain(target, no_assisted_loop):
    kw = {
        "do_sample": False,
        "max_new_tokens": NEW,
        "return_dict_in_generate": True,
        "output_scores": True,
        "output_logits": True,
        "repetition_penalty": 1.3,
    }
    plain = target.generate(PROMPT, **kw)
    out = target.generate(PROMPT, **kw, assistant_model=CascadeAssistant([MaxGram()]), **RUN)
    assert type(out) is type(plain)
    assert out.sequences.tolist() == plain.sequences.tolist()
    assert len(out.scores) == len(plain.scores) == len(out.logits) == NEW
    for got, want in zip(out.scores + out.logits, plain.scores + plain.logits):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_streamer_receives_what_plain_streams(target, no_assisted_loop):
    ref, s = Chunks(), Chunks()
    plain = target.generate(PROMPT, do_sample=False, max_new_tokens=NEW, streamer=ref)
    out = target.generate(
        PROMPT, do_sample=False, max_new_tokens=NEW, streamer=s, assistant_model=CascadeAssistant([MaxGram()]), **RUN
    )
    assert out.tolist() == plain.tolist()
    assert s.chunks[0] == PROMPT[0].tolist() and s.ended == ref.ended == 1
    assert sum(s.chunks[1:], []) == sum(ref.chunks[1:], []) == plain[0, PROMPT.shape[1] :].tolist()


def test_sampling_runs_through_the_assistant(target, no_assisted_loop):
    a = CascadeAssistant([MaxGram()])
    torch.manual_seed(0)
    out = target.generate(
        PROMPT,
        do_sample=True,
        temperature=0.7,
        top_k=20,
        max_new_tokens=NEW,
        min_new_tokens=NEW,
        assistant_model=a,
        **RUN,
    )
    assert out.shape == (1, PROMPT.shape[1] + NEW) and out[0, : PROMPT.shape[1]].tolist() == PROMPT[0].tolist()
    assert a.last_stats.new_tokens == NEW


def test_tokenizer_calls_go_through_the_hook(target, monkeypatch):
    """transformers does not hand ``tokenizer`` to a callable decoding loop (it needs it for stop strings), so a
    call with ``tokenizer=`` runs hf_cascade's ``generate(assistant_model=...)`` hook: same core, same output."""
    calls = []
    hooked = GenerationMixin._assisted_decoding
    monkeypatch.setattr(GenerationMixin, "_assisted_decoding", lambda *a, **k: calls.append(1) or hooked(*a, **k))
    tok = tm.word_tokenizer()
    plain = target.generate(PROMPT, do_sample=False, max_new_tokens=NEW, tokenizer=tok)
    out = target.generate(
        PROMPT, do_sample=False, max_new_tokens=NEW, tokenizer=tok, assistant_model=CascadeAssistant([MaxGram()]), **RUN
    )
    assert out.tolist() == plain.tolist() and calls == [1]


def test_pipeline_call(target, no_assisted_loop):
    tok = tm.word_tokenizer()
    pipe = pipeline("text-generation", model=target, tokenizer=tok)
    text, kw = "w5 w6 w7 w5 w6 w7 w5 w6", {"max_new_tokens": NEW, "do_sample": False}
    a = CascadeAssistant([MaxGram()])
    out = pipe(text, **kw, assistant_model=a, **RUN)[0]["generated_text"]
    assert out == pipe(text, **kw)[0]["generated_text"]
    assert a.last_stats.new_tokens == NEW


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"num_beams": 2}, "beam search"),
        ({"penalty_alpha": 0.6, "top_k": 4}, "greedy decoding and sampling"),
        ({"prompt_lookup_num_tokens": 3}, "draft source"),
        ({"cache_implementation": "offloaded"}, "dynamic or a static cache"),
        ({"num_return_sequences": 2, "do_sample": True}, "num_return_sequences"),
        ({"synced_gpus": True}, "synced_gpus"),
    ],
)
def test_settings_the_assistants_cannot_honour_fail_clearly(target, no_assisted_loop, kw, match):
    kw = {"do_sample": False, "max_new_tokens": 5, **kw}
    with pytest.raises(ValueError, match=match):
        target.generate(PROMPT, **kw, **RUN)


def test_bad_assistants_and_inputs_fail_clearly(target, no_assisted_loop, tmp_path):
    for bad in (tm.truncated_copy(target), str(tmp_path)):  # an ordinary draft model; a folder with no checkpoint
        with pytest.raises(ValueError, match="neither an hf_cascade assistant nor an hf_cascade checkpoint"):
            target.generate(PROMPT, max_new_tokens=5, assistant_model=bad, **RUN)
    input_ids, mask = left_pad([[5, 6, 7], [9, 10]])
    with pytest.raises(ValueError, match="left padding"):
        target.generate(input_ids=input_ids, attention_mask=mask.flip(1), max_new_tokens=5, **RUN)
    with pytest.raises(ValueError, match="streamers support batch size 1"):
        target.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=5, streamer=Chunks(), **RUN)


# -- the real Gemma-3-270M ------------------------------------------------------------------------

REAL_NEW = 32
REAL_PROMPTS = [
    "A list of fruits: apple, banana, cherry, apple, banana,",
    "def fib(n):\n    if n < 2:\n        return n\n    return",
    "Paris is the capital of",
    "The three primary colors are red, yellow and blue. The three primary colors are",
]


@pytest.fixture(scope="module")
def real_plain(gemma):
    """Plain greedy ``generate`` of the first prompt: ``(inputs, ids, streamed text)``."""
    model, tok = gemma
    enc = tok(REAL_PROMPTS[0], return_tensors="pt")
    ref = TextCollect(tok)
    out = model.generate(**enc, do_sample=False, max_new_tokens=REAL_NEW, streamer=ref)
    return enc, out, ref.text


@pytest.mark.real_model
def test_real_maxgram(gemma, real_plain, no_assisted_loop):
    model, _ = gemma
    enc, plain, _ = real_plain
    a = CascadeAssistant([MaxGram()], cpu_kernels=False)  # the kernels' one-time setup for 262k rows: ~15 s
    out = model.generate(**enc, do_sample=False, max_new_tokens=REAL_NEW, assistant_model=a, **RUN)
    assert out.tolist() == plain.tolist()
    assert a.last_stats.target_calls < REAL_NEW


@pytest.mark.real_model
def test_real_glide_cape(gemma, real_plain, no_assisted_loop):
    model, _ = gemma
    enc, plain, _ = real_plain
    g = GlideAssistant(str(GLIDE_CARD), cpu_kernels=False)
    assert g.settings.cape is not None  # GLIDE + CAPE (the default)
    out = model.generate(**enc, do_sample=False, max_new_tokens=REAL_NEW, assistant_model=g, **RUN)
    assert out.tolist() == plain.tolist()
    assert g.last_stats.new_tokens == REAL_NEW


@pytest.mark.real_model
def test_real_left_padded_batch(gemma, no_assisted_loop):
    model, tok = gemma
    assert tok.padding_side == "left"
    enc = tok(REAL_PROMPTS, return_tensors="pt", padding=True)
    assert len(set(enc.attention_mask.sum(1).tolist())) > 1  # padded
    plain = model.generate(**enc, do_sample=False, max_new_tokens=REAL_NEW)
    a = CascadeAssistant([MaxGram()], cpu_kernels=False)
    out = model.generate(**enc, do_sample=False, max_new_tokens=REAL_NEW, assistant_model=a, **RUN)
    assert out.tolist() == plain.tolist()


@pytest.mark.real_model
def test_real_text_streamer(gemma, real_plain, no_assisted_loop):
    model, tok = gemma
    enc, plain, text = real_plain
    s = TextCollect(tok)
    out = model.generate(
        **enc,
        do_sample=False,
        max_new_tokens=REAL_NEW,
        streamer=s,
        assistant_model=CascadeAssistant([MaxGram()], cpu_kernels=False),
        **RUN,
    )
    assert out.tolist() == plain.tolist()
    assert s.text == text and s.text.strip()


@pytest.mark.real_model
def test_real_stop_strings(gemma, real_plain):
    model, tok = gemma
    enc, plain, text = real_plain
    stop = text.split()[3]  # a word the continuation reaches
    kw = {"do_sample": False, "max_new_tokens": REAL_NEW, "tokenizer": tok, "stop_strings": [stop]}
    expected = model.generate(**enc, **kw)
    assert expected.shape[1] < plain.shape[1]  # it stopped early
    out = model.generate(**enc, **kw, assistant_model=CascadeAssistant([MaxGram()], cpu_kernels=False), **RUN)
    assert out.tolist() == expected.tolist()


@pytest.mark.real_model
def test_real_bad_inputs_fail_before_any_forward(gemma):
    model, tok = gemma
    ran = []
    handle = model.get_input_embeddings().register_forward_pre_hook(lambda module, args: ran.append(1))
    try:
        _refused_on_the_real_target(model, tok)
    finally:
        handle.remove()
    assert not ran  # refused before the target's first forward


def _refused_on_the_real_target(model, tok):
    tok_right = tok(REAL_PROMPTS[:2], return_tensors="pt", padding=True)
    right = {"input_ids": tok_right.input_ids.flip(1), "attention_mask": tok_right.attention_mask.flip(1)}
    with pytest.raises(ValueError, match="left padding"):
        model.generate(**right, max_new_tokens=REAL_NEW, **RUN)
    enc = tok(REAL_PROMPTS[2], return_tensors="pt")
    with pytest.raises(ValueError, match="neither an hf_cascade assistant nor an hf_cascade checkpoint"):
        model.generate(**enc, max_new_tokens=REAL_NEW, assistant_model=model, **RUN)
    with pytest.raises(ValueError, match="beam search"):
        model.generate(
            **enc, max_new_tokens=REAL_NEW, num_beams=2, assistant_model=GlideAssistant(str(GLIDE_CARD)), **RUN
        )


@pytest.mark.real_model
def test_the_recipe_readme_runs_as_written(card_hub, tmp_path):
    """The recipe README's example (marked as needing the network), in a fresh interpreter, offline: the recipe's
    ``<your-org>/<name>`` is this folder's path, the GLIDE head's ``<your-org>/...`` the repo id the local Hub cache
    holds it under. Each greedy call the example makes (recorded as it runs) gives plain ``generate``'s output."""
    import re
    import subprocess
    import sys

    from tests.hub_cache import hub_env, other_repo

    block = re.findall(r"```python\n(.*?)```", (RECIPE / "README.md").read_text(), re.S)[0]
    assert block.startswith("# needs the network")
    block = block.replace("<your-org>/<name>", str(RECIPE))
    block = re.sub(r"<your-org>/([\w.-]+)", lambda m: other_repo(m.group(1)), block)
    assert "<your-org>" not in block
    record = """
import functools as _functools
import transformers.generation.utils as _generation
_CALLS = []
_generate = _generation.GenerationMixin.generate


@_functools.wraps(_generate)                    # hf_cascade's hook reads generate's signature
def _recording(self, *args, **kwargs):
    out = _generate(self, *args, **kwargs)
    _CALLS.append((dict(kwargs), out))
    return out


_generation.GenerationMixin.generate = _recording
"""
    check = """
greedy = [(kw, out) for kw, out in _CALLS                   # the example's calls (the recipe calls generate again)
          if kw.get("trust_remote_code") and kw.get("custom_generate") and kw.get("do_sample") is False]
assert len(greedy) == 2 and sum("assistant_model" in kw for kw, _ in greedy) == 1, [sorted(kw) for kw, _ in _CALLS]
plain = _generate(model, **inputs, do_sample=False, max_new_tokens=64)
for kw, again in greedy:
    assert again.tolist() == plain.tolist(), sorted(kw)
print("README" + "-OK", out.shape[1])
"""
    res = subprocess.run(
        [sys.executable, "-c", record + block + check],
        cwd=ROOT,
        env=hub_env(card_hub, tmp_path),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    assert "README-OK" in res.stdout
