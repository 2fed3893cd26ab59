"""``hf-cascade distill``: the target's own greedy responses to training prompts, stored on disk.

Drafters are trained to predict what the *target* says, not what a dataset says, so the data is
sequence-level distillation (Kim & Rush, 2016; the recipe of Medusa-2, EAGLE and ReDrafter's
self-distillation): each prompt is templated like the benchmark's prompts, the frozen target
generates greedily (batched, left padding), and prompt + response go into a
:class:`~hf_cascade.training.store.DistillStore`. Optionally the target's last hidden state at every
position is stored too (one extra teacher-forced forward per batch). Existing text instead of generated
responses, at a prefill's cost: :mod:`.teacher` (``hf-cascade distill --teacher-forced``).

With ``assistant`` (a function returning an assistant; ``hf-cascade distill`` gives
``CascadeAssistant([MaxGram()])`` unless ``--no-speculative``) the batches run through the package's batched
speculative decoding: greedy, so the responses are the target's own (the contract the core is tested to), and
the batch core drafts only at the steps where its gate expects drafting to pay (:mod:`hf_cascade.core.batch`),
so a batch whose rows repeat nothing decodes as plain ``generate`` would. Without one, plain batched
``generate``. (A function, not a default here: training sits below the strategies and imports none of them.)

Spec-Bench, the benchmark, is never used: prompts whose text is one of its questions are dropped.
Batching changes the target's floating-point sums slightly (padding, and the number of rows a forward
verifies), so a rare response may differ from an unbatched greedy ``generate``; that does not matter for
training data.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..data import PROMPT_FORMAT, chat_prompt_ids, format_prompt
from .sources import Prompt, training_prompts
from .store import DistillStore
from .teacher import rate_line

__all__ = ["DistillConfig", "Prompt", "distill", "prompt_ids", "training_prompts"]


@dataclass
class DistillConfig:
    out: Path
    max_new_tokens: int = 128
    batch_size: int = 16
    prompt_format: str = PROMPT_FORMAT  # a template with {question}, or "chat": the tokenizer's chat template
    hidden_states: bool = False
    limit: int | None = None  # stop after this many stored prompts in total
    assistant: Callable[[], Any] | None = None  # a new assistant per batch (speculative batches); None: plain


def prompt_ids(prompt: Prompt, tokenizer, prompt_format: str) -> list[int]:
    """Token ids of a prompt: ``prompt_format`` filled with its text, or, for ``"chat"``
    (:data:`~.sources.CHAT`), its messages (a user turn of its text if it has none) through the
    tokenizer's chat template with the generation prompt (the template writes the special tokens)."""
    if prompt_format != "chat":
        return tokenizer(format_prompt(prompt.text, prompt_format)).input_ids
    return chat_prompt_ids(tokenizer, prompt.messages or ({"role": "user", "content": prompt.text},))


def _batches(todo: list[Prompt], tokenizer, cfg: DistillConfig) -> Iterator[tuple[list[Prompt], list[list[int]]]]:
    """Batches of prompts of similar length (sorted within windows of 8 batches: little padding)."""
    window = cfg.batch_size * 8
    for start in range(0, len(todo), window):
        chunk = todo[start : start + window]
        ids = [prompt_ids(p, tokenizer, cfg.prompt_format) for p in chunk]
        order = sorted(range(len(chunk)), key=lambda i: len(ids[i]))
        for b in range(0, len(order), cfg.batch_size):
            sel = order[b : b + cfg.batch_size]
            yield [chunk[i] for i in sel], [ids[i] for i in sel]


def _left_pad(ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, width - len(x) :] = torch.tensor(x)
        mask[i, width - len(x) :] = 1
    return input_ids, mask


@torch.no_grad()
def _generate(target, input_ids, mask, cfg: DistillConfig, eos_ids: set[int]):
    """Greedy responses ``list[list[int]]`` (cut after the first EOS) and EOS flags."""
    assisted = {} if cfg.assistant is None else {"assistant_model": cfg.assistant()}
    out = target.generate(
        input_ids=input_ids,
        attention_mask=mask,
        max_new_tokens=cfg.max_new_tokens,
        do_sample=False,
        pad_token_id=int(target.generation_config.pad_token_id or 0),
        **assisted,
    )
    responses, eos = [], []
    for row in out[:, input_ids.shape[1] :].tolist():
        cut = next((i for i, t in enumerate(row) if t in eos_ids), None)
        responses.append(row if cut is None else row[: cut + 1])
        eos.append(cut is not None)
    return responses, eos


@torch.no_grad()
def _hidden_states(target, seqs: list[list[int]], pad_id: int) -> list[np.ndarray]:
    """The target's last hidden state at every position of each sequence (teacher forcing)."""
    input_ids, mask = _left_pad(seqs, pad_id)
    device = target.get_input_embeddings().weight.device
    out = target(
        input_ids=input_ids.to(device), attention_mask=mask.to(device), output_hidden_states=True, logits_to_keep=1
    )
    last = out.hidden_states[-1].float().cpu()  # [B, T, H]
    return [last[i, input_ids.shape[1] - len(s) :].numpy() for i, s in enumerate(seqs)]


def distill(
    target,
    tokenizer,
    cfg: DistillConfig,
    prompts: list[Prompt] | None = None,
    target_name: str = "",
    progress: bool = True,
) -> DistillStore:
    """Run (or resume) a distillation into ``cfg.out``; returns the store.

    Launched in several processes (``accelerate launch``), each process generates a disjoint share of the
    prompts still to do (every ``N``-th) into ``cfg.out/parts/part-<rank>``, and the main process merges the
    parts into the store, in rank order, when all are done; parts an interrupted run left behind are merged
    first, so a run resumes with any number of processes."""
    from .accel import num_processes

    prompts = training_prompts() if prompts is None else prompts
    hidden_size = int(target.config.get_text_config().hidden_size) if cfg.hidden_states else 0
    meta = {
        "target": target_name,
        "prompt_format": cfg.prompt_format,
        "max_new_tokens": cfg.max_new_tokens,
        "hidden_size": hidden_size,
        "vocab_size": int(target.config.get_text_config().vocab_size),
    }
    if num_processes() > 1:
        return _distill_shared(target, tokenizer, cfg, prompts, meta, progress)
    store = DistillStore.create_or_resume(cfg.out, meta)
    _fill(store, _todo(store, prompts, cfg), target, tokenizer, cfg, progress)
    return store


def _todo(store: DistillStore, prompts: list[Prompt], cfg: DistillConfig) -> list[Prompt]:
    done = store.done_ids()
    todo = [p for p in prompts if p.id not in done]
    return todo if cfg.limit is None else todo[: max(0, cfg.limit - len(store))]


def _distill_shared(
    target, tokenizer, cfg: DistillConfig, prompts: list[Prompt], meta: dict, progress: bool
) -> DistillStore:
    """:func:`distill` in one of several processes (see there)."""
    from .accel import process_state

    state = process_state()
    parts = Path(cfg.out) / "parts"

    def merge() -> None:
        store = DistillStore.create_or_resume(cfg.out, meta)
        for part in sorted(parts.glob("part-*"), key=lambda p: int(p.name.split("-")[1])):
            store.absorb(DistillStore.create_or_resume(part, meta))
            shutil.rmtree(part)
        if parts.is_dir() and not any(parts.iterdir()):
            parts.rmdir()

    if state.is_main_process:
        merge()
    state.wait_for_everyone()
    todo = _todo(DistillStore.open(cfg.out), prompts, cfg)[state.process_index :: state.num_processes]
    part = DistillStore.create_or_resume(parts / f"part-{state.process_index}", meta)
    _fill(part, todo, target, tokenizer, cfg, progress and state.is_main_process)
    state.wait_for_everyone()
    if state.is_main_process:
        merge()
    state.wait_for_everyone()
    return DistillStore.open(cfg.out)


def _fill(store: DistillStore, todo: list[Prompt], target, tokenizer, cfg: DistillConfig, progress: bool) -> None:
    """Generate the target's responses to ``todo`` in batches and append them to ``store``."""
    from ..backends import verification_session  # the CPU kernels only where the switch engages them

    eos = target.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    pad_id = int(target.generation_config.pad_token_id or 0)
    device = target.get_input_embeddings().weight.device
    bar = tqdm(total=len(todo), desc="distill", unit="prompt", disable=not progress)
    new_tokens = stored = 0
    start = time.perf_counter()
    for batch, ids in _batches(todo, tokenizer, cfg):
        input_ids, mask = (t.to(device) for t in _left_pad(ids, pad_id))
        with (
            nullcontext() if cfg.assistant is not None else verification_session(target)
        ):  # an assistant brings its own
            responses, flags = _generate(target, input_ids, mask, cfg, eos_ids)
        hidden = None
        if store.hidden_size:
            with verification_session(target):  # batched rows: faster with the CPU kernels
                hidden = _hidden_states(target, [p + r for p, r in zip(ids, responses)], pad_id)
        for i, (p, r) in enumerate(zip(ids, responses)):
            store.append(batch[i].id, batch[i].source, p, r, flags[i], None if hidden is None else hidden[i])
            new_tokens += len(r)
            stored += len(p) + len(r)
        bar.update(len(batch))
        seconds = time.perf_counter() - start
        bar.set_postfix(stored=len(store), new_tokens=new_tokens, tok_s=f"{stored / seconds:.0f}")
    bar.close()
    if progress and todo:
        seconds = time.perf_counter() - start
        print(f"distill: {rate_line(stored, seconds)}, {new_tokens / seconds:.1f} generated tokens/s", file=sys.stderr)
