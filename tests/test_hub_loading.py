"""Heads and drafters by Hub repo id (hf_cascade.loading.load_pretrained, issue 26): every assistant and
``CorpusNGrams.load`` resolve ``hf-cascade/...`` repo ids offline from a local Hub cache (built here from the
checkpoints shipped in model_cards/), by ``revision=<sha>``, the ``main`` ref or the default cache; they load
hf_cascade's own classes (never the repositories' remote code, no ``trust_remote_code``), honour ``dtype``,
stay strict about tensors, and fail clearly on a wrong revision or path."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

import hf_cascade
from hf_cascade import (
    CascadeAssistant,
    CorpusNGrams,
    DynamicWindowAssistant,
    GlideAssistant,
    GlideSettings,
    Loading,
    MaxGram,
    ReDrafterAssistant,
    ReDrafterSettings,
    load_pretrained,
)
from hf_cascade.heads.hub import save_hub
from hf_cascade.loading import load_head
from tests import tiny_models as tm
from tests.hub_cache import CARDS, add_repo, hub_env, offline
from tests.test_glide_head import make_glide
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

DRAFTER, GLIDE, REDRAFTER, CORPUS = (
    f"hf-cascade/gemma-3-270m-{n}" for n in ("drafter-xs", "glide-xs", "redrafter-xs", "corpus-ngrams")
)
HEADS = {DRAFTER: "CascadeDrafterForCausalLM", GLIDE: "GlideForCausalLM", REDRAFTER: "ReDrafterModel"}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """``(cache dir, {repo id: commit sha})``: the four shipped checkpoints as Hub repos in a local cache."""
    cache = tmp_path_factory.mktemp("hub")
    shas = {
        repo: add_repo(cache, repo, CARDS / repo.split("/")[1], skip=("training_curve.png",))
        for repo in (DRAFTER, GLIDE, REDRAFTER, CORPUS)
    }
    return cache, shas


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    offline(monkeypatch)


def _new_remote_modules(before: set) -> list[str]:
    return [m for m in set(sys.modules) - before if m.startswith("transformers_modules")]


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k].float(), sb[k].float()) for k in sa)


# -- load_pretrained ---------------------------------------------------------------------------------
@pytest.mark.parametrize("repo", list(HEADS))
def test_heads_load_by_repo_id_with_own_classes(hub, repo):
    cache, shas = hub
    before = set(sys.modules)
    model = load_pretrained(repo, revision=shas[repo], cache_dir=cache)
    assert type(model).__name__ == HEADS[repo]
    assert type(model).__module__.startswith("hf_cascade.heads."), type(model).__module__
    assert not _new_remote_modules(before)  # the repo's modeling_*.py never ran
    assert _same_weights(model, load_head(CARDS / repo.split("/")[1]))
    assert next(model.parameters()).dtype == torch.float32
    by_ref = load_pretrained(repo, cache_dir=cache)  # no revision: refs/main
    assert _same_weights(model, by_ref)


@pytest.mark.parametrize("repo", list(HEADS))
def test_dtype_is_honoured(hub, repo):
    cache, shas = hub
    model = load_pretrained(repo, revision=shas[repo], cache_dir=cache, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    old_name = load_pretrained(repo, revision=shas[repo], cache_dir=cache, torch_dtype=torch.bfloat16)
    assert {p.dtype for p in old_name.parameters()} == {torch.bfloat16}
    with pytest.raises(ValueError, match="disagree"):
        load_pretrained(repo, revision=shas[repo], cache_dir=cache, dtype=torch.float16, torch_dtype=torch.bfloat16)


def test_wrong_revision_fails_clearly(hub):
    cache, _ = hub
    for revision in ("0" * 40, "no-such-branch"):
        with pytest.raises(OSError, match=f"{GLIDE}.*revision '{revision}'"):
            load_pretrained(GLIDE, revision=revision, cache_dir=cache, kind="glide_model")
        with pytest.raises(OSError, match=f"revision '{revision}'"):
            GlideAssistant(GLIDE, loading=Loading(revision=revision, cache_dir=cache))


def test_unknown_repo_and_bad_paths(hub, tmp_path):
    cache, _ = hub
    with pytest.raises(OSError, match="no-org/no-model"):
        load_pretrained("no-org/no-model", cache_dir=cache)
    with pytest.raises(OSError, match=r"drafters\[0\] 'gpt2'"):  # a bare name is a Hub id too
        CascadeAssistant(["gpt2", MaxGram()], loading=Loading(cache_dir=cache))
    with pytest.raises(FileNotFoundError, match="no such directory"):
        load_pretrained(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="not a Hub repo id"):
        load_pretrained("./a/b/c")
    (tmp_path / "f.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="is a file"):
        load_pretrained(tmp_path / "f.bin")
    with pytest.raises(TypeError, match="Hub repo id"):
        load_pretrained(3)
    from hf_cascade.bench.loading import load_model

    (tmp_path / "card").mkdir()  # a model card without weights (the CLI's specs)
    (tmp_path / "card" / "README.md").write_text("# a card")
    with pytest.raises(FileNotFoundError, match="holds no model \\(no config.json\\)"):
        load_model(str(tmp_path / "card"))


def test_loaded_model_passes_through_and_rejects_placement(hub):
    model = tm.llama()
    assert load_pretrained(model) is model
    assert load_pretrained(model, revision="x", cache_dir="y") is model  # download options: nothing to do
    for kw in (dict(dtype=torch.bfloat16), dict(device_map="cpu"), dict(max_memory={"cpu": 1 << 30})):
        with pytest.raises(ValueError, match="only to a draft_model given as a local path or Hub repo id"):
            load_pretrained(model, kind="draft_model", **kw)
    with pytest.raises(ValueError, match="already loaded"):
        CascadeAssistant([model, MaxGram()], loading=Loading(dtype=torch.bfloat16))


def test_remote_code_is_never_run(hub, tmp_path):
    """A head repo whose shipped modeling file would fail if executed loads with hf_cascade's classes, with
    and without trust_remote_code."""
    cache, _ = hub
    glide = make_glide(tm.llama(layers=3, seed=0, block_scale=0.3))
    save_hub(glide, tmp_path / "repo", "")
    config = json.loads((tmp_path / "repo" / "config.json").read_text())
    for ref in config["auto_map"].values():
        module = ref.split(".")[0]
        (tmp_path / "repo" / f"{module}.py").write_text("raise RuntimeError('remote code ran')\n")
    sha = add_repo(cache, "someone/poisoned-glide", tmp_path / "repo")
    before = set(sys.modules)
    for trust in (None, False, True):
        model = load_pretrained("someone/poisoned-glide", revision=sha, cache_dir=cache, trust_remote_code=trust)
        assert type(model) is hf_cascade.GlideForCausalLM and _same_weights(model, glide)
    assert not _new_remote_modules(before)


def test_strict_by_repo_id(hub, tmp_path):
    cache, _ = hub
    glide = make_glide(tm.llama(layers=3, seed=0, block_scale=0.3))
    save_hub(glide, tmp_path / "repo", "")
    weights = load_file(tmp_path / "repo" / "model.safetensors")
    weights.pop(next(k for k in weights if "cross_attn" in k))
    save_file(weights, tmp_path / "repo" / "model.safetensors", metadata={"format": "pt"})
    sha = add_repo(cache, "someone/truncated-glide", tmp_path / "repo")
    with pytest.raises(ValueError, match="missing_keys"):
        load_pretrained("someone/truncated-glide", revision=sha, cache_dir=cache)


def test_default_cache_in_fresh_interpreter(hub, tmp_path):
    """HF_HUB_CACHE + HF_HUB_OFFLINE in the environment, no cache_dir: how a user's downloads resolve (the
    assistants, and the bench's ``--draft`` by repo id)."""
    cache, shas = hub
    script = f"""
import sys, torch
from hf_cascade import GlideAssistant, ReDrafterAssistant, CascadeAssistant, CorpusNGrams, Loading, MaxGram
g = GlideAssistant({GLIDE!r}, loading=Loading(revision={shas[GLIDE]!r}, dtype=torch.bfloat16))
r = ReDrafterAssistant({REDRAFTER!r})
c = CascadeAssistant([{DRAFTER!r}, MaxGram(corpus=CorpusNGrams.load({CORPUS!r}))])
from hf_cascade.bench.loading import load_drafts             # hf-cascade bench --draft <repo id>
b = load_drafts([{GLIDE!r}, {DRAFTER!r}])
assert not [m for m in sys.modules if m.startswith("transformers_modules")]
assert [type(m).__name__ for m in b] == ["GlideForCausalLM", "CascadeDrafterForCausalLM"]
assert {{p.dtype for m in b for p in m.parameters()}} == {{torch.float32}}
print(type(g.glide).__module__, next(g.glide.parameters()).dtype, type(r.head).__module__,
      type(c.drafters[0]).__module__, len(c.drafters[1].corpus) > 0)
"""
    res = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=hub_env(cache, tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    glide_mod, dtype, red_mod, drafter_mod, corpus_ok = res.stdout.split()
    assert all(m.startswith("hf_cascade.") for m in (glide_mod, red_mod, drafter_mod))
    assert dtype == "torch.bfloat16" and corpus_ok == "True"


# -- the assistants ------------------------------------------------------------------------------------
def test_assistants_load_by_repo_id(hub):
    cache, shas = hub
    kw = dict(cache_dir=cache, dtype=torch.bfloat16)
    glide = GlideAssistant(GLIDE, settings=GlideSettings.chain(), loading=Loading(revision=shas[GLIDE], **kw)).glide
    head = ReDrafterAssistant(
        REDRAFTER, settings=ReDrafterSettings(beam_width=1), loading=Loading(revision=shas[REDRAFTER], **kw)
    ).head
    cascade = CascadeAssistant([DRAFTER, MaxGram()], loading=Loading(revision=shas[DRAFTER], **kw))
    hsddw = DynamicWindowAssistant(DRAFTER, loading=Loading(revision=shas[DRAFTER], **kw))
    for model, name in (
        (glide, "GlideForCausalLM"),
        (head, "ReDrafterModel"),
        (cascade.drafters[0], "CascadeDrafterForCausalLM"),
        (hsddw.draft_model, "CascadeDrafterForCausalLM"),
    ):
        assert type(model).__name__ == name and type(model).__module__.startswith("hf_cascade.heads.")
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert isinstance(cascade.drafters[1], MaxGram)
    with pytest.raises(ValueError, match="different"):
        DynamicWindowAssistant(
            DRAFTER, verifier_model=DRAFTER, loading=Loading(revision=shas[DRAFTER], cache_dir=cache)
        )


def test_corpus_by_repo_id_directory_and_file(hub):
    cache, shas = hub
    local = CARDS / "gemma-3-270m-corpus-ngrams"
    expected = CorpusNGrams.load(local / "corpus.safetensors")
    for got in (
        CorpusNGrams.load(CORPUS, revision=shas[CORPUS], cache_dir=cache),
        CorpusNGrams.load(CORPUS, cache_dir=cache),
        CorpusNGrams.load(local),
        CorpusNGrams.load(str(local), filename="corpus.safetensors"),
    ):
        assert got.table == expected.table and got.vocab_size == expected.vocab_size
    with pytest.raises(OSError, match="revision '" + "1" * 40):
        CorpusNGrams.load(CORPUS, revision="1" * 40, cache_dir=cache)
    with pytest.raises(OSError, match="other.safetensors"):
        CorpusNGrams.load(CORPUS, filename="other.safetensors", cache_dir=cache)
    with pytest.raises(FileNotFoundError, match="no corpus.safetensors"):
        CorpusNGrams.load(CARDS / "gemma-3-270m-glide-xs")


def test_tiny_glide_and_drafter_by_repo_id_generate_like_plain(hub, tmp_path):
    """End to end on tiny targets: a GLIDE head and an ordinary causal LM drafter (AutoModelForCausalLM's
    path) loaded by repo id give plain greedy outputs."""
    cache, _ = hub
    target = tm.llama(layers=3, seed=0, block_scale=0.3)
    save_hub(make_glide(target), tmp_path / "glide", "")
    glide_sha = add_repo(cache, "someone/tiny-glide", tmp_path / "glide")
    tm.truncated_copy(target, layers=2).save_pretrained(tmp_path / "drafter")
    drafter_sha = add_repo(cache, "someone/tiny-llama", tmp_path / "drafter")
    prompt = ids(5, 9, 3, 17, 5, 9)
    plain = target.generate(prompt, do_sample=False, max_new_tokens=20)
    glide = GlideAssistant("someone/tiny-glide", loading=Loading(revision=glide_sha, cache_dir=cache))
    cascade = CascadeAssistant(
        ["someone/tiny-llama", MaxGram()], loading=Loading(revision=drafter_sha, cache_dir=cache)
    )
    assert type(cascade.drafters[0]).__module__.startswith("transformers.models.llama")
    for assistant in (glide, cascade):
        out = target.generate(prompt, do_sample=False, max_new_tokens=20, assistant_model=assistant)
        assert out.tolist() == plain.tolist(), repr(assistant)


@pytest.mark.real_model
def test_glide_by_repo_id_on_the_real_target(hub, gemma):
    cache, shas = hub
    model, tok = gemma
    prompt = tok(
        "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
        "in May. How many clips did Natalia sell altogether?\n\nAnswer:",
        return_tensors="pt",
    ).input_ids
    plain = model.generate(prompt, do_sample=False, max_new_tokens=16)
    assistant = GlideAssistant(
        GLIDE, settings=GlideSettings.chain(min_confidence=0.3), loading=Loading(revision=shas[GLIDE], cache_dir=cache)
    )
    out = model.generate(prompt, do_sample=False, max_new_tokens=16, assistant_model=assistant)
    assert out.tolist() == plain.tolist()
    assert assistant.last_stats.target_calls < 16
