"""The model cards of model_cards/ (issue 26): front matter (licence, base model, Hub datasets, no pipeline tag
on heads that cannot generate alone), the same metadata and usage section as the training code writes
(:mod:`hf_cascade.heads.cards`), and every card's python snippet run verbatim but for the line naming the checkpoint
(``repo = "<your-org>/<folder>"``, which a user fills in) in a fresh interpreter, against a local Hub cache holding
a saved copy of the real target as ``google/gemma-3-270m``: once with the folder uploaded under another org and name
(``someone/my-glide-xs``: nothing is published as ``hf-cascade/...``), once with the folder's path. The snippet of
model_cards/README.md runs as written from the repository's root. SmolLM2-135M-Instruct's heads have the same
metadata checks, with their target's licence and Hub id. The remote code of every folder
(``configuration_*.py``, ``modeling_*.py``) is, byte for byte, what ``hf-cascade cards --sync`` writes from
``hf_cascade/heads/`` (issue 56)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
import yaml

from hf_cascade.cli import main as cli_main
from hf_cascade.heads.cards import (
    REPO_LINE,
    card_code,
    front_matter,
    hub_datasets,
    hub_repo_id,
    license_section,
    sync_cards,
    usage_section,
)
from hf_cascade.heads.hub import CARD_TAGS
from tests.hub_cache import CARDS, TARGET, hub_env, other_repo

THREE = ("alpaca_seed_tasks", "vicuna_bench_question", "gsm8k_train")
#: folder -> (usage kind, distillation sources, pipeline_tag)
CARD_KINDS = {
    "gemma-3-270m-drafter-xs": ("drafter", THREE + ("questions",), "text-generation"),
    "gemma-3-270m-drafter-m": ("drafter", THREE, "text-generation"),
    "gemma-3-270m-glide-xs": ("glide", THREE, None),
    "gemma-3-270m-redrafter-xs": ("redrafter", THREE, None),
    "gemma-3-270m-corpus-ngrams": ("corpus", THREE + ("questions",), None),
    "smollm2-135m-drafter-xs": ("drafter", THREE, "text-generation"),
    "smollm2-135m-glide-xs": ("glide", THREE, None),
    "smollm2-135m-redrafter-xs": ("redrafter", THREE, None),
}
#: folder-name prefix -> (``hf-cascade train --target`` name the card was written with, its Hub id, licence, a phrase
#: of the licence note)
TARGETS = {
    "gemma-3-270m": ("gemma-3-270m", TARGET, "gemma", "Gemma Terms of Use"),
    "smollm2-135m": ("smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0", "Apache License 2.0"),
}
#: folders whose snippets run against the card hub's saved target: one Gemma folder per kind. A kind's snippets are
#: the same text in each of its folders but for the ``repo`` line (test_usage_section_is_the_generated_one), so a
#: second folder of a kind (``gemma-3-270m-drafter-m``) would run the same code on another checkpoint; every shipped
#: checkpoint loads and keeps plain greedy's output in tests/test_shipped_drafters.py, as SmolLM2's heads do there
#: by path and through the pipeline.
SNIPPET_CARDS = [name for name in CARD_KINDS if name.startswith("gemma-3-270m-") and name != "gemma-3-270m-drafter-m"]


def target_of(name: str) -> tuple[str, str, str, str]:
    return TARGETS[name.rsplit("-", 2)[0]]


def read_card(name: str) -> tuple[dict, str]:
    text = (CARDS / name / "README.md").read_text()
    m = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert m, f"{name}: no front matter"
    return yaml.safe_load(m.group(1)), text[m.end() :]


def python_blocks(body: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", body, re.S)


def test_every_card_is_listed():
    assert sorted(CARD_KINDS) == sorted(d.name for d in CARDS.iterdir() if d.is_dir())


@pytest.mark.parametrize("name", list(CARD_KINDS))
def test_front_matter(name):
    kind, sources, pipeline_tag = CARD_KINDS[name]
    front, body = read_card(name)
    spec, hub_id, license_id, phrase = target_of(name)
    assert front["license"] == license_id and front["base_model"] == hub_id
    assert front["datasets"] == ["openai/gsm8k"] == hub_datasets(dict.fromkeys(sources, 1))
    assert "hf-cascade" in front["tags"] and "speculative-decoding" in front["tags"]
    assert front.get("pipeline_tag") == pipeline_tag  # GLIDE / ReDrafter cannot generate alone
    assert front.get("library_name") == (None if kind == "corpus" else "transformers")
    if kind != "corpus":  # exactly what save_hub writes for a retrained head
        meta = {"datasets": front["datasets"], **({"pipeline_tag": pipeline_tag} if pipeline_tag else {})}
        assert front == front_matter(spec, meta, tags=CARD_TAGS)
    assert phrase in body and body.rstrip().endswith(license_section(license_id, sources).rstrip())


def test_smollm2_is_a_known_target():
    """``hf-cascade train --target smollm2`` writes ``target_name_or_path="smollm2"``: its cards name the Hub model,
    its licence and the Hub id in their snippets, not the CLI's name."""
    hub_id = "HuggingFaceTB/SmolLM2-135M-Instruct"
    for spec in ("smollm2", "smollm2-135m-instruct", hub_id):
        front = front_matter(spec, {"datasets": ["openai/gsm8k"]}, tags=CARD_TAGS)
        assert front["license"] == "apache-2.0" and front["base_model"] == hub_id
    assert f'pipeline("text-generation", model="{hub_id}"' in usage_section("glide", "<your-org>/x", "smollm2")
    assert "Apache License 2.0" in license_section("apache-2.0", THREE) and "Gemma" not in license_section(
        "apache-2.0", THREE
    )


@pytest.mark.parametrize("name", list(CARD_KINDS))
def test_usage_section_is_the_generated_one(name):
    kind = CARD_KINDS[name][0]
    _, body = read_card(name)
    blocks = python_blocks(body)  # the examples the real-model test runs
    assert hub_repo_id(CARDS / name) == f"<your-org>/{name}"  # a placeholder: nothing is published under our org
    spec, hub_id, _, _ = target_of(name)
    assert usage_section(kind, f"<your-org>/{name}", spec) in body
    explicit = blocks[-1]
    line = REPO_LINE.format(repo=f"<your-org>/{name}")
    assert all(b.count(line) == 1 and b.count("repo = ") == 1 for b in blocks)  # named once, in the line to fill in
    assert f'from_pretrained("{hub_id}", device_map="auto")' in explicit
    if kind != "corpus":  # the one-line use comes first (issue 30)
        assert len(blocks) == 2 and body.index(blocks[0]) < body.index(explicit)
        assert "assistant_model=repo," in blocks[0] and "import hf_cascade" in blocks[0]
    else:
        assert len(blocks) == 1
    assert not [b for b in blocks if "model_cards" in b or "trust_remote_code" in b or "hf-cascade/" in b]
    assert "hf-cascade/" not in body  # no Hub id of ours anywhere in the card


def with_repo(snippet: str, name: str, repo: str) -> str:
    """The snippet with its one ``repo = ...`` line (:data:`REPO_LINE`) naming ``repo`` instead of the placeholder."""
    line = REPO_LINE.format(repo=f"<your-org>/{name}")
    assert snippet.count(line) == 1, snippet
    return snippet.replace(line, f"repo = {repo!r}")


#: appended to a card's snippet: the output is plain greedy's, no remote code ran, the assistant ran. Plain greedy
#: decoding of the prompt is run once per loaded target in the interpreter (``PLAIN`` of :data:`RUNNER`) and kept,
#: with the target, for the later snippets given that same target: the same model, the same prompt, the same tokens.
CHECKS = {
    "explicit": """
import sys
assert not [m for m in sys.modules if m.startswith("transformers_modules")], "remote code ran"
key = ("generate", id(target), tuple(ids[0].tolist()))
if key not in sys.modules["__main__"].PLAIN:
    sys.modules["__main__"].PLAIN[key] = (target, target.generate(ids, do_sample=False, max_new_tokens=64).tolist())
plain = sys.modules["__main__"].PLAIN[key][1]
assert out.tolist() == plain, "output differs from plain greedy decoding"
print("CARD-OK", target.device, target.dtype, assistant.last_stats.target_calls)
""",
    "pipeline": """
import sys
assert not [m for m in sys.modules if m.startswith("transformers_modules")], "remote code ran"
assert isinstance(pipe.assistant_model, hf_cascade.Assistant), type(pipe.assistant_model)
kw = dict(do_sample=False, max_new_tokens=64, return_full_text=False)
text = pipe(PROMPT, **kw)[0]["generated_text"]
key = ("pipeline", id(pipe.model), PROMPT)
if key not in sys.modules["__main__"].PLAIN:
    plain = pipeline("text-generation", model=pipe.model, tokenizer=pipe.tokenizer)(PROMPT, **kw)[0]["generated_text"]
    sys.modules["__main__"].PLAIN[key] = (pipe.model, plain)
plain = sys.modules["__main__"].PLAIN[key][1]
assert text == plain, ("output differs from plain greedy decoding", text, plain)
print("CARD-OK", pipe.model.device, pipe.model.dtype, pipe.assistant_model.last_stats.target_calls)
""".replace("PROMPT", repr("Question: What is the capital of France?\n\nAnswer:")),
}

#: runs each variant of a card's snippets in its own namespace, in one interpreter: the imports are paid once, and
#: the target and its tokenizer are loaded once per distinct call (a call of ``AutoModelForCausalLM.from_pretrained``
#: or ``AutoTokenizer.from_pretrained`` for the target with the same arguments as an earlier one, as the hub and
#: folder variants of one snippet make, gets that call's object; a pipeline's model load passes other arguments than
#: the explicit snippet's, and loads its own)
RUNNER = """
import transformers

PLAIN = {}
LOADED = {}
TOKENIZERS = {}


def _shared(auto, kept):
    load = auto.from_pretrained.__func__

    def shared_load(cls, name, *args, **kwargs):
        if cls is not auto or name != TARGET:
            return load(cls, name, *args, **kwargs)
        key = repr((name, args, sorted(kwargs.items())))
        if key not in kept:
            kept[key] = load(cls, name, *args, **kwargs)
        return kept[key]

    auto.from_pretrained = classmethod(shared_load)


_shared(transformers.AutoModelForCausalLM, LOADED)
_shared(transformers.AutoTokenizer, TOKENIZERS)
for label, code in VARIANTS:
    print("VARIANT", label, flush=True)
    exec(compile(code, "<card snippet: " + label + ">", "exec"), {"__name__": "__main__"})
print("TARGET-LOADS", len(LOADED))
"""


@pytest.mark.real_model
@pytest.mark.parametrize("name", SNIPPET_CARDS)
def test_card_snippets_run_under_any_repo_id_and_from_its_folder(name, card_hub, tmp_path):
    """Each of the card's snippets, its ``repo`` line filled in (a) with the id of an upload under another org and
    name, from a local Hub cache, and (b) with the card's folder path; each in a fresh namespace of one fresh
    interpreter per card (the target loaded once per distinct load call): the output is plain greedy decoding's, no
    remote code ran, the model is on the CPU, and the assistant's drafts were accepted (fewer target calls than
    tokens)."""
    _, body = read_card(name)
    blocks = python_blocks(body)
    assert len(blocks) == (1 if CARD_KINDS[name][0] == "corpus" else 2)
    variants = []
    for i, snippet in enumerate(blocks):
        check = CHECKS["pipeline" if "pipeline(" in snippet else "explicit"]
        variants += [
            (f"snippet {i} hub {other_repo(name)}", with_repo(snippet, name, other_repo(name)) + check),
            (f"snippet {i} folder {name}", with_repo(snippet, name, str(CARDS / name)) + check),
        ]
    script = f"VARIANTS = {variants!r}\nTARGET = {TARGET!r}\n" + RUNNER
    res = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=hub_env(card_hub, tmp_path),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    body_out, loads = res.stdout.rsplit("TARGET-LOADS", 1)
    assert 1 <= int(loads) <= len(blocks), f"the target loaded {loads.strip()} times for {len(blocks)} snippets"
    outputs = body_out.split("VARIANT ")[1:]
    assert len(outputs) == len(variants), res.stdout
    for variant in outputs:
        text, status = variant.rsplit("CARD-OK", 1)
        assert text.split("\n", 1)[1].strip(), f"the snippet printed no text: {variant}"
        device, _dtype, calls = status.split()
        assert device == "cpu" and int(calls) < 64


def test_model_cards_readme_snippet_runs_from_the_repository_root(tmp_path):
    """model_cards/README.md's snippet, as written, from the repository's root (offline, nothing in the Hub cache):
    the shipped folders load by path."""
    blocks = python_blocks((CARDS / "README.md").read_text())
    assert len(blocks) == 1 and "hf-cascade/" not in blocks[0]
    check = "\nprint('SNIPPET-OK', type(glide).__name__, type(redrafter).__name__, type(cascade).__name__)\n"
    res = subprocess.run(
        [sys.executable, "-c", blocks[0] + check],
        cwd=CARDS.parent,
        env=hub_env(tmp_path / "empty-hub", tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert res.stdout.split("SNIPPET-OK", 1)[1].split() == ["GlideAssistant", "ReDrafterAssistant", "CascadeAssistant"]


def test_remote_code_is_what_cards_sync_writes():
    """model_cards/*/*.py are the files of hf_cascade/heads/ that save_pretrained copies; run ``hf-cascade cards
    --sync`` after changing a head's module."""
    differ = sync_cards(CARDS, write=False)
    assert not differ, f"differ from hf_cascade/heads/ (run hf-cascade cards --sync): {[str(p) for p in differ]}"
    kinds = {name: sorted(card_code(CARDS / name)) for name in CARD_KINDS}
    assert kinds["gemma-3-270m-glide-xs"] == ["attention_glide.py", "configuration_glide.py", "modeling_glide.py"]
    assert kinds["gemma-3-270m-corpus-ngrams"] == []  # no remote code: not a model
    shipped = [name for name in CARD_KINDS if (CARDS / name / "config.json").is_file()]  # a card-only folder has none
    assert all(kinds[name] for name in shipped if CARD_KINDS[name][0] != "corpus")
    assert kinds["smollm2-135m-drafter-xs"] == [] and "smollm2-135m-drafter-xs" not in shipped


def test_cards_command_finds_and_fixes_a_differing_copy(tmp_path, capsys):
    """``--check`` fails on an edited copy and on a stray ``.py`` file; ``--sync`` rewrites the copy, removes the
    stray file, and ``--check`` then passes."""
    for name in ("gemma-3-270m-glide-xs", "gemma-3-270m-corpus-ngrams"):
        (tmp_path / name).mkdir()
        for f in (CARDS / name).iterdir():
            if f.suffix in (".py", ".json"):
                shutil.copy(f, tmp_path / name / f.name)
    edited = tmp_path / "gemma-3-270m-glide-xs" / "modeling_glide.py"
    edited.write_text(edited.read_text() + "\n# edited by hand\n")
    stray = tmp_path / "gemma-3-270m-glide-xs" / "modeling_old.py"
    stray.write_text("")
    assert cli_main(["cards", "--check", "--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert str(edited) in out and str(stray) in out
    assert cli_main(["cards", "--sync", "--root", str(tmp_path)]) == 0
    assert not stray.exists() and edited.read_bytes() == (CARDS / "gemma-3-270m-glide-xs" / edited.name).read_bytes()
    assert cli_main(["cards", "--check", "--root", str(tmp_path)]) == 0
