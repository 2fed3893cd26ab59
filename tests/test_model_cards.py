"""The model cards of model_cards/ (issue 26): front matter (licence, base model, Hub datasets, no pipeline tag
on heads that cannot generate alone), the same metadata and usage section as the training code writes
(:mod:`hf_cascade.heads.cards`), and every card's python snippet run verbatim in a fresh interpreter against a
local Hub cache holding the shipped repos and a saved copy of the real target as ``google/gemma-3-270m``."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from hf_cascade.heads.cards import front_matter, hub_datasets, license_section, usage_section
from hf_cascade.heads.hub import CARD_TAGS
from tests.hub_cache import CARDS, SHIPPED_REPOS, add_repo, hub_env

TARGET = "google/gemma-3-270m"
THREE = ("alpaca_seed_tasks", "vicuna_bench_question", "gsm8k_train")
#: folder -> (usage kind, distillation sources, pipeline_tag)
CARD_KINDS = {
    "gemma-3-270m-drafter-xs": ("drafter", THREE + ("questions",), "text-generation"),
    "gemma-3-270m-drafter-m": ("drafter", THREE, "text-generation"),
    "gemma-3-270m-glide-xs": ("glide", THREE, None),
    "gemma-3-270m-redrafter-xs": ("redrafter", THREE, None),
    "gemma-3-270m-corpus-ngrams": ("corpus", THREE + ("questions",), None),
}


def read_card(name: str) -> tuple[dict, str]:
    text = (CARDS / name / "README.md").read_text()
    m = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert m, f"{name}: no front matter"
    return yaml.safe_load(m.group(1)), text[m.end():]


def python_blocks(body: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", body, re.S)


def test_every_card_is_listed():
    assert sorted(CARD_KINDS) == sorted(d.name for d in CARDS.iterdir() if d.is_dir())


@pytest.mark.parametrize("name", list(CARD_KINDS))
def test_front_matter(name):
    kind, sources, pipeline_tag = CARD_KINDS[name]
    front, body = read_card(name)
    assert front["license"] == "gemma" and front["base_model"] == TARGET
    assert front["datasets"] == ["openai/gsm8k"] == hub_datasets(dict.fromkeys(sources, 1))
    assert "hf-cascade" in front["tags"] and "speculative-decoding" in front["tags"]
    assert front.get("pipeline_tag") == pipeline_tag           # GLIDE / ReDrafter cannot generate alone
    assert front.get("library_name") == (None if kind == "corpus" else "transformers")
    if kind != "corpus":                                       # exactly what save_hub writes for a retrained head
        meta = {"datasets": front["datasets"], **({"pipeline_tag": pipeline_tag} if pipeline_tag else {})}
        assert front == front_matter("gemma-3-270m", meta, tags=CARD_TAGS)
    assert "Gemma Terms of Use" in body and body.rstrip().endswith(license_section("gemma", sources).rstrip())


@pytest.mark.parametrize("name", list(CARD_KINDS))
def test_usage_section_is_the_generated_one(name):
    kind = CARD_KINDS[name][0]
    _, body = read_card(name)
    blocks = python_blocks(body)                               # the examples the real-model test runs
    assert usage_section(kind, f"hf-cascade/{name}", "gemma-3-270m") in body
    explicit = blocks[-1]
    assert f'"hf-cascade/{name}"' in explicit and f'from_pretrained("{TARGET}", device_map="auto")' in explicit
    if kind != "corpus":                                       # the one-line use comes first (issue 30)
        assert len(blocks) == 2 and body.index(blocks[0]) < body.index(explicit)
        assert f'assistant_model="hf-cascade/{name}"' in blocks[0] and "import hf_cascade" in blocks[0]
    else:
        assert len(blocks) == 1
    assert not [b for b in blocks if "model_cards" in b or "trust_remote_code" in b]


@pytest.fixture(scope="session")
def card_hub(tmp_path_factory):
    """A Hub cache with the shipped repos and, as ``google/gemma-3-270m``, the embedded Gemma-3-270M saved
    in bfloat16 with its tokenizer (built once per session)."""
    pytest.importorskip("gguf", reason="the real model needs: pip install 'hf-cascade[test]'")
    import torch

    from hf_cascade.models import load_default_target

    cache = tmp_path_factory.mktemp("card_hub")
    saved = tmp_path_factory.mktemp("gemma_bf16")
    model, tok = load_default_target(dtype=torch.bfloat16)
    model.save_pretrained(saved)
    tok.save_pretrained(saved)
    del model
    add_repo(cache, TARGET, saved)
    for repo, src in SHIPPED_REPOS.items():
        add_repo(cache, repo, src, skip=("training_curve.png",))
    return cache


#: appended to a card's snippet: the output is plain greedy's, no remote code ran, the assistant ran
CHECKS = {
    "explicit": """
import sys
assert not [m for m in sys.modules if m.startswith("transformers_modules")], "remote code ran"
plain = target.generate(ids, do_sample=False, max_new_tokens=64)
assert out.tolist() == plain.tolist(), "output differs from plain greedy decoding"
print("CARD-OK", target.device, target.dtype, assistant.last_stats.target_calls)
""",
    "pipeline": """
import sys
assert not [m for m in sys.modules if m.startswith("transformers_modules")], "remote code ran"
assert isinstance(pipe.assistant_model, hf_cascade.Assistant), type(pipe.assistant_model)
kw = dict(do_sample=False, max_new_tokens=64, return_full_text=False)
text = pipe(PROMPT, **kw)[0]["generated_text"]
plain = pipeline("text-generation", model=pipe.model, tokenizer=pipe.tokenizer)(PROMPT, **kw)[0]["generated_text"]
assert text == plain, ("output differs from plain greedy decoding", text, plain)
print("CARD-OK", pipe.model.device, pipe.model.dtype, pipe.assistant_model.last_stats.target_calls)
""".replace("PROMPT", repr("Question: What is the capital of France?\n\nAnswer:")),
}


def _snippets() -> list[tuple[str, int]]:
    return [(name, i) for name in CARD_KINDS for i in range(1 if CARD_KINDS[name][0] == "corpus" else 2)]


@pytest.mark.real_model
@pytest.mark.parametrize("name, block", _snippets())
def test_card_snippet_runs_verbatim(name, block, card_hub, tmp_path):
    _, body = read_card(name)
    snippet = python_blocks(body)[block]
    check = CHECKS["pipeline" if "pipeline(" in snippet else "explicit"]
    res = subprocess.run([sys.executable, "-c", snippet + check], cwd=tmp_path, env=hub_env(card_hub, tmp_path),
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    text, status = res.stdout.rsplit("CARD-OK", 1)
    assert text.strip(), "the snippet printed no text"
    device, dtype, calls = status.split()
    assert device == "cpu" and int(calls) < 64
