"""Prompt sets for benchmarks and drafter training.

* :func:`load_specbench` reads Spec-Bench (``question.jsonl``: 480 questions in
  13 categories; fields ``question_id``, ``category``, ``turns`` and sometimes
  ``reference``) and keeps the first ``per_category`` questions of each
  category in file order, so the subset is deterministic.
* :func:`load_train_prompts` reads the training prompt files (GSM8K train,
  Alpaca seed tasks, Vicuna bench questions) or any JSONL of prompts.
* :func:`format_prompt` turns a question into the text fed to the model;
  :func:`chat_prompt_ids` a chat (an instruct model's prompt) into its token ids.

The data lives outside the package, in ``shared/data`` next to the checkout
(``../shared/data`` seen from the repository root). It is located through
``$HF_CASCADE_SPECBENCH`` / ``$HF_CASCADE_TRAIN_PROMPTS`` or by walking up from
the working directory and from this package's directory.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = [
    "PROMPT_FORMAT",
    "SPECBENCH_CATEGORIES",
    "find_shared_data",
    "format_prompt",
    "load_specbench",
    "load_train_prompts",
    "read_prompts_jsonl",
]

#: Spec-Bench categories in file order (8 MT-Bench ones, then 5 Spec-Bench tasks).
SPECBENCH_CATEGORIES: tuple[str, ...] = (
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
    "translation",
    "summarization",
    "qa",
    "math_reasoning",
    "rag",
)

#: Completion template for the default (base, non-chat) target, Gemma-3-270M.
#: Chosen by greedy-generating 64 tokens for the first question of 8 Spec-Bench
#: categories (writing, reasoning, coding, stem, translation, qa, math_reasoning,
#: summarization) with four templates:
#:
#: * ``"Question: {q}\n\nAnswer:"`` (chosen): on-topic answers for writing
#:   (a travel post), coding (Python code), stem and summarization.
#: * ``"Question: {q}\nAnswer:"``: looped ``"Answer:\nAnswer:..."`` on
#:   reasoning and wrote only ``import`` lines for coding.
#: * ``"### Instruction:\n{q}\n\n### Response:\n"``: comparable content but
#:   kept opening ``### Explanation:`` sections, and its template is longer.
#: * ``"User: {q}\nAssistant:"``: mostly echoed the question back.
#:
#: A 270M base model is weak at reasoning and translation with any template;
#: what matters for speculative decoding is natural text to draft against.
PROMPT_FORMAT = "Question: {question}\n\nAnswer:"

_SPECBENCH_REL = Path("shared/data/specbench/question.jsonl")
_TRAIN_REL = Path("shared/data/train_prompts")
_TRAIN_FILES = ("gsm8k_train.jsonl", "alpaca_seed_tasks.jsonl", "vicuna_bench_question.jsonl")


def find_shared_data(rel: str | Path, env: str | None = None) -> Path:
    """Find ``rel`` (e.g. ``shared/data/specbench/question.jsonl``).

    Order: ``$env`` if set; else for the working directory and this package's
    directory and each of their parents ``D``, try ``D/rel``. (The repository
    root's parent holds ``shared/``, so this covers ``../shared/...`` too.)
    Raises :class:`FileNotFoundError` naming everything tried.
    """
    rel = Path(rel)
    if env and os.environ.get(env):
        p = Path(os.environ[env]).expanduser()
        if p.exists():
            return p
        raise FileNotFoundError(f"${env} points to {p}, which does not exist")
    tried: list[str] = []
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for d in (start, *start.parents):
            cand = d / rel
            if cand.exists():
                return cand
            tried.append(str(cand))
    hint = f"set ${env} to its path, or " if env else ""
    raise FileNotFoundError(
        f"could not find {rel}: {hint}run from inside a checkout that has "
        f"shared/ next to it (looked in {len(tried)} places, e.g. {tried[0]})"
    )


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_specbench(path: str | Path | None = None, per_category: int | None = 3, seed: int = 0) -> list[dict]:
    """Load Spec-Bench questions, the first ``per_category`` of each category.

    With ``seed=0`` (default) the first ``per_category`` questions of each
    category are taken; any other ``seed`` takes a seeded random sample of
    ``per_category`` per category instead. Either way the result is in file
    order and the same on every machine. ``per_category=None`` keeps all 480.
    Each item is the JSON record (``question_id``, ``category``, ``turns``,
    maybe ``reference``) plus ``"prompt"``: :func:`format_prompt` of the first turn.
    """
    p = Path(path) if path is not None else find_shared_data(_SPECBENCH_REL, "HF_CASCADE_SPECBENCH")
    rows = _read_jsonl(p)
    by_cat: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_cat.setdefault(row.get("category", ""), []).append(i)
    keep: set[int] = set()
    rng = random.Random(seed)
    for idx in by_cat.values():
        if per_category is None or per_category >= len(idx):
            keep.update(idx)
        elif seed == 0:
            keep.update(idx[:per_category])
        else:
            keep.update(rng.sample(idx, per_category))
    out: list[dict] = []
    for i in sorted(keep):
        item = dict(rows[i])
        item["prompt"] = format_prompt(item["turns"])
        out.append(item)
    return out


def chat_prompt_ids(tokenizer, messages: Sequence[dict]) -> list[int]:
    """Token ids of ``messages`` (``{"role", "content"}`` turns) through ``tokenizer``'s chat template with the
    generation prompt, as ``pipeline("text-generation")`` feeds a chat to an instruct model (the template writes the
    special tokens). ``ValueError`` for a tokenizer without a chat template (a base model's)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"prompt format 'chat' needs a tokenizer with a chat template; {type(tokenizer).__name__} "
            "has none (a base model's): use the plain template (--prompt-format plain)"
        )
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False).input_ids


def format_prompt(turns_or_text: str | Sequence[str], template: str = PROMPT_FORMAT) -> str:
    """Format a question (a string or a Spec-Bench ``turns`` list) for a base model.

    Only the first turn is used: later turns refer to "your previous response",
    which a base-model completion prompt has no room for. See :data:`PROMPT_FORMAT`
    for why this template. Surrounding whitespace of the question is stripped.
    """
    if isinstance(turns_or_text, str):
        text = turns_or_text
    else:
        if len(turns_or_text) == 0:
            raise ValueError("empty turns list")
        text = turns_or_text[0]
    return template.format(question=text.strip())


def _prompt_of(row: dict) -> str | None:
    """Extract the prompt text from one record of any supported JSONL layout."""
    if "turns" in row:  # Vicuna / MT-Bench / Spec-Bench
        return row["turns"][0] if row["turns"] else None
    if "instruction" in row:  # Alpaca seed tasks: instruction + first instance input
        inst = row.get("instances") or [{}]
        extra = (inst[0].get("input") or "").strip() if isinstance(inst[0], dict) else ""
        return f"{row['instruction'].strip()}\n\n{extra}" if extra else row["instruction"]
    for key in ("question", "prompt", "text", "input"):  # GSM8K and generic files
        if isinstance(row.get(key), str):
            return row[key]
    return None


def read_prompts_jsonl(path: str | Path) -> list[str]:
    """Read prompts from a JSONL file (one JSON object or string per line).

    Objects may have ``turns`` (first turn), ``instruction`` (+ first instance
    ``input``), ``question``, ``prompt``, ``text`` or ``input``. Raises
    :class:`ValueError` for a line with none of these.
    """
    out: list[str] = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            text = row if isinstance(row, str) else _prompt_of(row)
            if not text or not text.strip():
                raise ValueError(f"{path}:{n}: no prompt field found")
            out.append(text.strip())
    return out


def load_train_prompts(
    dir: str | Path | None = None, files: Iterable[str] | None = None, limit: int | None = None
) -> list[str]:
    """Load raw (unformatted) training prompts, de-duplicated, in file order.

    ``dir`` may be a directory (default ``shared/data/train_prompts``; reads
    ``files``, by default GSM8K train, Alpaca seed tasks and Vicuna bench
    questions, 7473 + 175 + 80 prompts) or a single JSONL file of the
    user's. ``limit`` keeps the first ``limit`` prompts of *each* file.
    """
    base = Path(dir) if dir is not None else find_shared_data(_TRAIN_REL, "HF_CASCADE_TRAIN_PROMPTS")
    if base.is_file():
        paths = [base]
    else:
        names = list(files) if files is not None else [f for f in _TRAIN_FILES if (base / f).is_file()]
        if files is None and not names:
            names = sorted(p.name for p in base.glob("*.jsonl"))
        paths = [base / n for n in names]
        if not paths:
            raise FileNotFoundError(f"no prompt files (*.jsonl) in {base}")
    seen: set[str] = set()
    out: list[str] = []
    for p in paths:
        for text in read_prompts_jsonl(p)[:limit]:
            if text not in seen:
                seen.add(text)
                out.append(text)
    return out
