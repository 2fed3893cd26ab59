"""hf_cascade checkpoints where transformers takes an assistant (issue 30): ``generate(assistant_model=<head>)``
and ``pipeline(..., assistant_model=<repo id>)`` run the strategy the checkpoint was made for, with output
identical to plain greedy; an ordinary HF draft model keeps transformers' assisted generation. The pipeline by the
repo id of each shipped kind's upload, on the real target in a fresh interpreter, is the first snippet of each
model card (tests/test_model_cards.py runs it from a local Hub cache, under another org and name)."""

from __future__ import annotations

import pytest

import hf_cascade  # noqa: F401  (installs the generate() hook)
from hf_cascade import CascadeAssistant, GlideAssistant, ReDrafterAssistant, assistant_for
from hf_cascade.assistant import Assistant
from hf_cascade.auto import checkpoint_kind
from tests import tiny_models as tm
from tests.hub_cache import CARDS, add_repo
from tests.redrafter_helpers import fit_head
from tests.test_drafter_head import restricted_copy
from tests.test_glide_decode import echo_glide
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

PROMPT = ids(1, 5, 6, 7, 5, 6, 7, 5, 6)
NEW = 20


@pytest.fixture(scope="module")
def target():
    return tm.llama_target()


def _heads(target):
    return {
        "glide": (echo_glide(target), GlideAssistant),
        "redrafter": (fit_head(target, "auto"), ReDrafterAssistant),
        "cascade": (restricted_copy(target), CascadeAssistant),
    }


@pytest.mark.parametrize("kind", ["glide", "redrafter", "cascade"])
def test_generate_with_a_loaded_head_runs_its_strategy(target, kind):
    head, cls = _heads(target)[kind]
    assert checkpoint_kind(head) == kind
    plain = target.generate(PROMPT, do_sample=False, max_new_tokens=NEW)
    out = target.generate(PROMPT, do_sample=False, max_new_tokens=NEW, assistant_model=head)
    assert out.tolist() == plain.tolist()
    assistant = assistant_for(head)
    assert type(assistant) is cls and assistant_for(head) is assistant  # one assistant per head object
    stats = assistant.last_stats
    assert stats is not None and stats.new_tokens == NEW and stats.target_calls <= NEW
    assert "_hf_cascade_assistant" not in str(list(head.state_dict()))


def test_an_ordinary_draft_model_keeps_transformers_assisted_generation(target, monkeypatch):
    drafter = tm.truncated_copy(target, layers=1)
    assert checkpoint_kind(drafter) is None
    monkeypatch.setattr(Assistant, "decode", lambda *a, **k: pytest.fail("an hf_cascade assistant ran"))
    plain = target.generate(PROMPT, do_sample=False, max_new_tokens=NEW)
    out = target.generate(PROMPT, do_sample=False, max_new_tokens=NEW, assistant_model=drafter)
    assert out.tolist() == plain.tolist()
    assert not hasattr(drafter, "_hf_cascade_assistant")


def test_a_head_for_another_target_fails_clearly(target):
    other = tm.llama(hidden=48, layers=3, seed=1)
    head, _ = _heads(target)["glide"]
    with pytest.raises(ValueError, match=r"(?i)hidden|vocab|layer"):
        other.generate(PROMPT, do_sample=False, max_new_tokens=NEW, assistant_model=head)


@pytest.mark.real_model
@pytest.mark.parametrize(
    "name, cls",
    [
        ("gemma-3-270m-glide-xs", GlideAssistant),
        ("gemma-3-270m-redrafter-xs", ReDrafterAssistant),
        ("gemma-3-270m-drafter-xs", CascadeAssistant),
    ],
)
def test_generate_with_a_shipped_checkpoint_loaded_by_auto_class(gemma, name, cls, free_drafts):
    """The shipped checkpoint loaded as a user loads it (``AutoModelForCausalLM``, remote code) and given to
    ``generate``: the real target's greedy text, made by the checkpoint's strategy (draft forwards counted free:
    under load the measured default may rightly stop drafting, and this test is about which strategy runs)."""
    from transformers import AutoModelForCausalLM

    model, tok = gemma
    head = AutoModelForCausalLM.from_pretrained(CARDS / name, trust_remote_code=True).eval()
    ids = tok(
        "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
        "in May. How many clips did Natalia sell altogether in April and May?\n\nAnswer:",
        return_tensors="pt",
    ).input_ids
    plain = model.generate(ids, do_sample=False, max_new_tokens=24)
    out = model.generate(ids, do_sample=False, max_new_tokens=24, assistant_model=head)
    assert out.tolist() == plain.tolist()
    assistant = assistant_for(head)
    assert type(assistant) is cls
    assert assistant.last_stats.new_tokens == 24 and assistant.last_stats.target_calls < 24


# -- pipeline(..., assistant_model="<repo id>", token=..., revision=...) (issue 54) ---------------------------------
TINY_TARGET, TINY_HEAD = "someone/tiny-target", "someone/my-glide"


@pytest.fixture
def tiny_hub(tmp_path, monkeypatch):
    """``(cache, target)``: a local Hub cache, offline, holding a tiny target with its tokenizer at ``main`` and
    at the branch ``exp``, and a GLIDE head for it whose ``main`` is good and whose ``exp`` is broken (a tensor
    missing: loading it raises). The cache is not the default one: only a ``cache_dir`` that reaches the loader
    finds the head."""
    from safetensors.torch import load_file, save_file

    from hf_cascade.heads.hub import save_hub
    from tests.hub_cache import offline
    from tests.test_glide_head import make_glide

    offline(monkeypatch)
    target = tm.llama(layers=3, seed=0, block_scale=0.3)
    target.save_pretrained(tmp_path / "target")
    tm.word_tokenizer().save_pretrained(tmp_path / "target")
    cache = tmp_path / "hub"
    sha = add_repo(cache, TINY_TARGET, tmp_path / "target")
    (cache / "models--someone--tiny-target" / "refs" / "exp").write_text(sha)  # a branch of the model
    save_hub(make_glide(target), tmp_path / "glide", "")
    add_repo(cache, TINY_HEAD, tmp_path / "glide")
    broken = tmp_path / "glide"
    weights = load_file(broken / "model.safetensors")
    weights.pop(next(k for k in weights if "cross_attn" in k))
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    add_repo(cache, TINY_HEAD, broken, ref="exp")
    return cache, target


@pytest.fixture
def hub_reads(monkeypatch):
    """``[(repo id or path, token, revision, cache_dir)]`` of every file lookup transformers makes."""
    import transformers.utils.hub as th

    reads, original = [], th.cached_files

    def spy(path_or_repo_id, filenames, **kwargs):
        reads.append((str(path_or_repo_id), kwargs.get("token"), kwargs.get("revision"), kwargs.get("cache_dir")))
        return original(path_or_repo_id, filenames, **kwargs)

    monkeypatch.setattr(th, "cached_files", spy)
    return reads


def test_a_repo_id_reads_with_the_download_options(tiny_hub):
    cache, _ = tiny_hub
    assert checkpoint_kind(TINY_HEAD) is None  # not in the default cache
    assert checkpoint_kind(TINY_HEAD, cache_dir=cache) == "glide"
    assert type(assistant_for(TINY_HEAD, cache_dir=cache, revision="main")) is GlideAssistant
    with pytest.raises(ValueError, match="missing_keys"):  # the revision reaches the loader
        assistant_for(TINY_HEAD, cache_dir=cache, revision="exp")


def test_pipeline_passes_its_token_and_cache_dir_to_the_head_not_its_revision(tiny_hub, hub_reads):
    """The call's ``token`` and ``model_kwargs["cache_dir"]`` reach the head's loader (the head is only in that
    cache); its ``revision`` is the model's: the model loads at ``exp``, the head at its default revision, as
    transformers' own ``load_assistant_model`` loads an assistant (the head's ``exp`` would fail to load)."""
    from transformers import pipeline

    cache, target = tiny_hub
    pipe = pipeline(
        "text-generation",
        model=TINY_TARGET,
        revision="exp",
        token="hf_secret",
        model_kwargs={"cache_dir": str(cache)},
        assistant_model=TINY_HEAD,
    )
    assert type(pipe.assistant_model) is GlideAssistant
    head_reads = [r for r in hub_reads if r[0] == TINY_HEAD]
    assert head_reads and all(
        r[1] == "hf_secret" and r[3] == str(cache) and r[2] in (None, "main") for r in head_reads
    ), head_reads
    assert any(r[0] == TINY_TARGET and r[2] not in (None, "main") for r in hub_reads)  # the model's revision: exp
    prompt = "w5 w6 w7 w5 w6 w7 w5 w6"
    kw = dict(do_sample=False, max_new_tokens=NEW, return_full_text=False)
    text = pipe(prompt, **kw)[0]["generated_text"]
    plain = pipeline("text-generation", model=pipe.model, tokenizer=pipe.tokenizer)(prompt, **kw)[0]["generated_text"]
    assert text == plain and pipe.assistant_model.last_stats is not None


def test_pipeline_without_the_cache_dir_does_not_find_the_head(tiny_hub, hub_reads):
    """Outside the call's options nothing is guessed: with the model loaded and no cache_dir, the head repo id is
    not an hf_cascade checkpoint hf_cascade can read, and transformers' own loader reports it missing."""
    from transformers import pipeline

    _, target = tiny_hub
    with pytest.raises(OSError, match="cached files"):
        pipeline(
            "text-generation", model=target, tokenizer=tm.word_tokenizer(), token="hf_secret", assistant_model=TINY_HEAD
        )
    assert any(r[0] == TINY_HEAD and r[1] == "hf_secret" for r in hub_reads)
