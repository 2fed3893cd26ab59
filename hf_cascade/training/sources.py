"""Where ``hf-cascade distill`` finds its prompts: JSONL files (:func:`training_prompts`, by default the
repository's ``shared/data/train_prompts``) or a Hugging Face ``datasets`` dataset (:func:`dataset_prompts`,
``--dataset ID_OR_PATH``); :func:`distill_prompts` chooses between them as the command line does. For teacher
forcing (``--teacher-forced``), :func:`training_texts` reads the same files with their own answers.

A dataset is a Hub id (``HuggingFaceH4/ultrachat_200k``), a folder written by ``Dataset.save_to_disk``,
a folder of data files, or one data file (``.jsonl``/``.json``/``.parquet``/``.csv``). Each row gives
one prompt, read from ``field`` or, when no field is named, from the first layout that fits:

* chats: ``messages`` (OpenAI/UltraChat ``{"role", "content"}``) or ``conversations`` /
  ``conversation`` (ShareGPT ``{"from": "human"|"gpt"|"system", "value"}``);
* instructions: ``instruction`` with an optional ``input`` (Alpaca);
* text: ``turns`` (first turn), ``question``, ``prompt``, ``text``, ``input``.

A prompt is what the target is asked, never what the dataset answered: a chat keeps its system
messages and its first user turn and drops the rest. Distillation trains drafters on the *target's*
responses (sequence-level distillation, Kim & Rush 2016), so the dataset's own answers, and the later
turns that follow them, would be text the target never wrote. Chats are then formatted with the target
tokenizer's chat template (:data:`CHAT`), as the users' prompts will be.

Hub datasets are streamed, so ``limit`` prompts cost ``limit`` rows, not the whole download. Ids are
``"<dataset>:<split>:<row>"``, stable for one revision of a dataset, which a resumed distillation
relies on. Spec-Bench questions are dropped, as for the JSONL prompts.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..data import find_shared_data, load_specbench, read_prompts_jsonl

__all__ = [
    "CHAT",
    "DEFAULT_FILES",
    "TEXT_FILES",
    "Prompt",
    "Text",
    "training_prompts",
    "training_texts",
    "DEFAULT_DATASET",
    "DEFAULT_SPLIT",
    "dataset_prompts",
    "distill_prompts",
    "prompt_messages",
]

#: ``DistillConfig.prompt_format`` value meaning "the target tokenizer's chat template".
CHAT = "chat"

#: What ``hf-cascade distill`` reads when neither ``--prompts`` nor ``--dataset`` is given and the
#: repository's ``shared/data/train_prompts`` is not beside the checkout: public multi-turn chats
#: (the first user turn of each), the data family EAGLE and Medusa distil on.
DEFAULT_DATASET = "HuggingFaceH4/ultrachat_200k"
DEFAULT_SPLIT = "train_sft"

_DATA_FILES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_CHAT_KEYS = ("messages", "conversations", "conversation")
_TEXT_KEYS = ("question", "prompt", "text", "input")
_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "bot": "assistant",
    "model": "assistant",
    "system": "system",
}


DEFAULT_FILES = ("alpaca_seed_tasks.jsonl", "vicuna_bench_question.jsonl", "gsm8k_train.jsonl")


@dataclass(frozen=True)
class Prompt:
    id: str  # "<source>:<line index>", stable across runs (resuming relies on it)
    source: str
    text: str  # raw question; templated with the prompt format before tokenizing
    messages: tuple[dict[str, str], ...] | None = None  # a chat's system turns + first user turn (text is its last)


#: What ``hf-cascade distill --teacher-forced`` reads by default: every file of ``shared/data/train_prompts``.
TEXT_FILES = (
    "gsm8k_train.jsonl",
    "t0_mixture.jsonl",
    "alpaca_seed_tasks.jsonl",
    "user_oriented_instructions.jsonl",
    "vicuna_bench_question.jsonl",
)

#: A text sharing a run of this many words with a Spec-Bench turn is dropped (the rule t0_mixture was filtered by).
BENCHMARK_RUN = 12


@dataclass(frozen=True)
class Text:
    """Existing text for teacher-forced features: a prompt and the file's own answer to it (``None`` when the file
    has none: a T0 prompt is itself a long context, an article or a passage with its question)."""

    id: str  # "text:<source>:<line index>", stable across runs, apart from the prompts' ids
    source: str
    prompt: str
    answer: str | None


def _normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def _benchmark_questions(exclude: bool) -> set[str]:
    """Spec-Bench's questions, normalised (empty when not excluding, or when Spec-Bench is not beside
    the checkout: a user's machine has no benchmark to leak)."""
    if not exclude:
        return set()
    try:
        return {_normalize(item["turns"][0]) for item in load_specbench(per_category=None)}
    except FileNotFoundError:
        return set()


def training_prompts(paths: Sequence[str | Path] | None = None, exclude_benchmark: bool = True) -> list[Prompt]:
    """Prompts from JSONL files (default: Alpaca seed tasks, Vicuna bench, GSM8K train in
    ``shared/data/train_prompts``), interleaved round-robin across files so that any prefix of a
    distillation run covers every source; Spec-Bench questions removed."""
    if paths is None:
        base = find_shared_data("shared/data/train_prompts", "HF_CASCADE_TRAIN_PROMPTS")
        paths = [base / f for f in DEFAULT_FILES if (base / f).is_file()]
    per_file = []
    for p in paths:
        p = Path(p)
        per_file.append([Prompt(f"{p.stem}:{i}", p.stem, t) for i, t in enumerate(read_prompts_jsonl(p))])
    banned = _benchmark_questions(exclude_benchmark)
    out, seen = [], set()
    for i in range(max((len(f) for f in per_file), default=0)):
        for prompts in per_file:
            if i < len(prompts):
                key = _normalize(prompts[i].text)
                if key not in banned and key not in seen:
                    seen.add(key)
                    out.append(prompts[i])
    return out


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def _runs(text: str) -> set[tuple[str, ...]]:
    words = _words(text)
    return {tuple(words[i : i + BENCHMARK_RUN]) for i in range(len(words) - BENCHMARK_RUN + 1)}


def _benchmark_runs(exclude: bool) -> set[tuple[str, ...]]:
    """Every run of :data:`BENCHMARK_RUN` words of every Spec-Bench turn (empty as :func:`_benchmark_questions`)."""
    if not exclude:
        return set()
    try:
        items = load_specbench(per_category=None)
    except FileNotFoundError:
        return set()
    return set().union(*(_runs(turn) for item in items for turn in item["turns"]))


_GSM8K_CALCULATOR = re.compile(r"<<[^>]*>>")


def _text_of(row: dict) -> tuple[str, str | None] | None:
    """``(prompt, answer)`` of one JSONL row: ``question`` + ``answer`` (GSM8K, its calculator annotations
    ``<<48/2=24>>`` removed: text the target never writes), ``instruction`` + the first instance's ``input`` and
    ``output`` (Self-Instruct), ``turns`` (first turn) or ``prompt`` / ``text`` (no answer; ``answer`` / ``output``
    when the row has one)."""
    if isinstance(row.get("instruction"), str):
        inst = (row.get("instances") or [{}])[0]
        extra = (inst.get("input") or "").strip()
        prompt = f"{row['instruction'].strip()}\n\n{extra}" if extra else row["instruction"]
        return prompt, inst.get("output")
    if isinstance(row.get("turns"), list) and row["turns"]:
        return row["turns"][0], None
    prompt = next((row[k] for k in ("question", "prompt", "text") if isinstance(row.get(k), str)), None)
    if prompt is None:
        return None
    answer = next((row[k] for k in ("answer", "output") if isinstance(row.get(k), str)), None)
    return prompt, None if answer is None else _GSM8K_CALCULATOR.sub("", answer)


def training_texts(paths: Sequence[str | Path] | None = None, exclude_benchmark: bool = True) -> list[Text]:
    """Prompts with the files' own answers (default: :data:`TEXT_FILES` in ``shared/data/train_prompts``),
    interleaved round-robin across files as :func:`training_prompts`, de-duplicated; dropped: rows whose prompt is
    a Spec-Bench question or whose prompt or answer shares a run of :data:`BENCHMARK_RUN` words with a Spec-Bench
    turn, and rows with no text."""
    if paths is None:
        base = find_shared_data("shared/data/train_prompts", "HF_CASCADE_TRAIN_PROMPTS")
        paths = [base / f for f in TEXT_FILES if (base / f).is_file()]
    per_file = []
    for p in map(Path, paths):
        with open(p, encoding="utf-8") as f:  # line by line: texts may hold U+2028, which splitlines cuts
            rows = [json.loads(line) for line in f if line.strip()]
        texts = []
        for i, row in enumerate(rows):
            got = _text_of(row) if isinstance(row, dict) else (row, None)
            if got and got[0].strip():
                answer = got[1].strip() if isinstance(got[1], str) and got[1].strip() else None
                texts.append(Text(f"text:{p.stem}:{i}", p.stem, got[0].strip(), answer))
        per_file.append(texts)
    banned, runs = _benchmark_questions(exclude_benchmark), _benchmark_runs(exclude_benchmark)
    out, seen = [], set()
    for i in range(max((len(f) for f in per_file), default=0)):
        for texts in per_file:
            if i >= len(texts):
                continue
            t = texts[i]
            key = (_normalize(t.prompt), _normalize(t.answer or ""))
            if key[0] in banned or key in seen:
                continue
            if runs and not runs.isdisjoint(_runs(f"{t.prompt}\n{t.answer or ''}")):
                continue
            seen.add(key)
            out.append(t)
    return out


def _message(turn: Any, where: str) -> dict[str, str]:
    if not isinstance(turn, dict):
        raise ValueError(f"{where}: a chat turn must be a dict, got {type(turn).__name__}")
    role = turn.get("role", turn.get("from"))
    content = turn.get("content", turn.get("value"))
    if role not in _ROLES or not isinstance(content, str):
        raise ValueError(
            f"{where}: a chat turn needs role/from in {sorted(_ROLES)} and a text content/value, got "
            f"{ {k: type(v).__name__ for k, v in turn.items()} }"
        )
    return {"role": _ROLES[role], "content": content}


def _chat_prompt(turns: Any, where: str) -> tuple[dict[str, str], ...] | None:
    """System messages and the first user turn of a chat (``None`` if it has no user turn)."""
    if not isinstance(turns, (list, tuple)):
        raise ValueError(f"{where}: a chat must be a list of turns, got {type(turns).__name__}")
    kept = []
    for turn in turns:
        message = _message(turn, where)
        if message["role"] == "system":
            kept.append(message)
        elif message["role"] == "user":
            return tuple(kept) + (message,) if message["content"].strip() else None
        else:
            return None  # the chat opens with an answer: nothing was asked
    return None


def prompt_messages(row: dict, field: str | None = None, where: str = "row") -> tuple[dict[str, str], ...] | None:
    """The prompt of one dataset row as chat messages (``None`` for a row without one; see the module doc)."""
    if field is not None:
        if field not in row:
            raise KeyError(f"{where}: no field {field!r}; the rows have {sorted(row)}")
        value = row[field]
        if isinstance(value, str):
            return ({"role": "user", "content": value},) if value.strip() else None
        return _chat_prompt(value, where)
    for key in _CHAT_KEYS:
        if row.get(key) is not None:
            return _chat_prompt(row[key], where)
    text = None
    if isinstance(row.get("turns"), (list, tuple)) and row["turns"]:
        text = row["turns"][0]
    elif isinstance(row.get("instruction"), str):
        extra = row.get("input") if isinstance(row.get("input"), str) else ""
        text = f"{row['instruction'].strip()}\n\n{extra.strip()}" if extra.strip() else row["instruction"]
    else:
        text = next((row[k] for k in _TEXT_KEYS if isinstance(row.get(k), str)), None)
    if text is None:
        raise ValueError(
            f"{where}: no prompt field found in {sorted(row)}; name one with --field "
            f"(chats: {', '.join(_CHAT_KEYS)}; text: instruction, turns, {', '.join(_TEXT_KEYS)})"
        )
    return ({"role": "user", "content": text},) if text.strip() else None


def _import_datasets():
    try:
        import datasets
    except ImportError as e:
        raise ImportError(
            "--dataset needs the 'datasets' package: pip install 'hf-cascade[train]' "
            f"(or pip install datasets); importing it failed: {e}"
        ) from e
    return datasets


def _pick_split(splits: Iterable[str], split: str | None, spec: str) -> str:
    splits = list(splits)
    if split is not None:
        if split not in splits:
            raise ValueError(f"dataset {spec!r} has no split {split!r}; its splits: {splits}")
        return split
    if len(splits) == 1:
        return splits[0]
    if "train" in splits:
        return "train"
    raise ValueError(f"dataset {spec!r} has the splits {splits}; choose one with --split")


def _open_rows(spec: str, split: str | None) -> tuple[Iterable[dict], str]:
    """The rows of ``split`` of ``spec`` (streamed where that is cheaper) and the split's name."""
    datasets = _import_datasets()
    path = Path(spec).expanduser()
    if path.is_dir() and ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file()):
        loaded = datasets.load_from_disk(str(path))  # Dataset.save_to_disk
        if isinstance(loaded, datasets.Dataset):
            if split not in (None, "train"):
                raise ValueError(f"{spec} holds one split; --split {split!r} does not apply")
            return loaded, "train"
        name = _pick_split(loaded.keys(), split, spec)
        return loaded[name], name
    if path.is_file():
        kind = _DATA_FILES.get(path.suffix.lower())
        if kind is None:
            raise ValueError(f"{spec}: a data file must end in one of {sorted(_DATA_FILES)}")
        if split not in (None, "train"):
            raise ValueError(f"{spec} is one data file (one split, 'train'); --split {split!r} does not apply")
        return datasets.load_dataset(kind, data_files=str(path), split="train"), "train"
    if path.is_dir():
        loaded = datasets.load_dataset(str(path))
        name = _pick_split(loaded.keys(), split, spec)
        return loaded[name], name
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise FileNotFoundError(f"no dataset at {spec} (not a file or folder)")
    try:  # a Hub id: stream it
        loaded = datasets.load_dataset(spec, streaming=True)
    except Exception as e:  # datasets raises ConnectionError, DatasetNotFoundError, ValueError or OSError offline
        raise ConnectionError(
            f"could not load the dataset {spec!r} from the Hugging Face Hub ({type(e).__name__}: {e}). Offline, "
            "or behind a firewall? Pass a local copy instead: --dataset PATH (a .jsonl/.json/.parquet/.csv file or a "
            "folder from Dataset.save_to_disk), or JSONL prompt files with --prompts FILE"
        ) from e
    name = _pick_split(loaded.keys(), split, spec)
    return loaded[name], name


def dataset_prompts(
    spec: str,
    split: str | None = None,
    field: str | None = None,
    limit: int | None = None,
    exclude_benchmark: bool = True,
) -> list:
    """:class:`~hf_cascade.training.distill.Prompt` s of ``split`` of dataset ``spec`` (a Hub id or a
    local path), in row order, de-duplicated, Spec-Bench questions dropped; at most ``limit``."""
    rows, name = _open_rows(spec, split)
    banned = _benchmark_questions(exclude_benchmark)
    source = Path(spec).stem if Path(spec).expanduser().exists() else spec
    out, seen = [], set()
    for i, row in enumerate(rows):
        if limit is not None and len(out) >= limit:
            break
        messages = prompt_messages(row, field, where=f"{spec}[{name}][{i}]")
        if messages is None:
            continue
        key = _normalize(messages[-1]["content"])
        if key in banned or key in seen:
            continue
        seen.add(key)
        out.append(Prompt(f"{source}:{name}:{i}", source, messages[-1]["content"], messages))
    if not out:
        raise ValueError(f"dataset {spec!r} [{name}] gave no prompts")
    return out


def distill_prompts(
    files=None,
    dataset: str | None = None,
    split: str | None = None,
    field: str | None = None,
    limit: int | None = None,
    log=print,
) -> tuple[list, bool]:
    """The prompts ``hf-cascade distill`` reads and whether they came from a dataset: ``dataset``, else the
    JSONL ``files``, else the repository's ``shared/data/train_prompts``, else :data:`DEFAULT_DATASET`."""
    if dataset is not None and files:
        raise ValueError("--prompts and --dataset are two sources of prompts: give one")
    if dataset is None and (split is not None or field is not None):
        raise ValueError("--split and --field apply to --dataset")
    if dataset is not None:
        return dataset_prompts(dataset, split, field, limit), True
    try:
        return training_prompts(files), False
    except FileNotFoundError:
        if files or os.environ.get("HF_CASCADE_TRAIN_PROMPTS"):  # the user's own files or folder: never replaced
            raise
    log(f"no shared/data/train_prompts beside this checkout: reading {DEFAULT_DATASET} [{DEFAULT_SPLIT}]")
    return dataset_prompts(DEFAULT_DATASET, DEFAULT_SPLIT, None, limit), True
