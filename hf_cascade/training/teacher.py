"""``hf-cascade distill --teacher-forced``: the target's features over existing text, one forward per sequence.

EAGLE (Li et al., 2024) trains its head on fixed dialogues: the target reads a text once, teacher forced, and its
features at every position are the head's input; nothing is generated. The same costs one batched prefill per
sequence here, where :func:`~.distill.distill` decodes a response token by token, so the data a CPU can afford
grows by the ratio of the two rates (``distill`` reports both in tokens per second).

Each :class:`~.sources.Text` (a training file's prompt with the file's own answer, or a long context with none;
:func:`~.sources.training_texts`) becomes one record, ``prompt_len`` its templated prompt:

* completion format: the prompt through the template (:func:`~hf_cascade.data.format_prompt`), then the answer
  after a space, as the target would write it after ``Answer:``;
* ``"chat"``: a user turn and the answer as the assistant's turn through the tokenizer's chat template (the
  template writes the special tokens and the end of the turn); the prompt part is exactly what
  :func:`~hf_cascade.data.chat_prompt_ids` gives a generation.

Sequences are cut to ``max_len`` tokens and stored with the target's last hidden state at every position (what a
ReDrafter head reads, :mod:`.run_redrafter`) into a sharded store (:class:`~.store.ShardWriter`), which training
opens as one store and reads from disk.

Resuming: the texts are taken in windows of ``window`` (in :func:`~.sources.training_texts`' order), each window
sorted by length and cut into batches of at most ``batch_tokens`` padded tokens; the batches depend on the texts
alone, never on what is stored, and a resumed run recomputes only the batches holding a text not stored yet, so an
interrupted run, resumed, writes the store an uninterrupted one writes, byte for byte.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..data import PROMPT_FORMAT, chat_prompt_ids, format_prompt
from .sources import CHAT, Text
from .store import DistillStore, ShardWriter


@dataclass
class TeacherConfig:
    out: Path
    prompt_format: str = PROMPT_FORMAT  # a template with {question}, or "chat": the tokenizer's chat template
    max_len: int = 512  # tokens per record (longer texts are cut at the end)
    batch_tokens: int = 4096  # padded tokens per forward (rows x the longest row)
    window: int = 256  # texts sorted by length together (see the module docstring)
    shard_tokens: int = 1 << 20  # a new shard once the last holds this many tokens
    limit: int | None = None  # stop once this many records are stored
    max_tokens: int | None = None  # stop once this many tokens are stored


def text_ids(text: Text, tokenizer, prompt_format: str) -> tuple[list[int], int]:
    """``(ids, prompt_len)`` of one text in ``prompt_format`` (see the module docstring), not cut."""
    if prompt_format != CHAT:
        prompt = tokenizer(format_prompt(text.prompt, prompt_format)).input_ids
        answer = tokenizer(" " + text.answer, add_special_tokens=False).input_ids if text.answer else []
        return prompt + answer, len(prompt)
    user = [{"role": "user", "content": text.prompt}]
    prompt = chat_prompt_ids(tokenizer, user)
    if not text.answer:
        return prompt, len(prompt)
    asked = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    whole = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": text.answer}], tokenize=False)
    if not whole.startswith(asked):
        raise ValueError(
            "the chat template does not write a conversation as its prompt (with the generation "
            "prompt) followed by the answer; teacher-forced chat records need one that does"
        )
    return prompt + tokenizer(whole[len(asked) :], add_special_tokens=False).input_ids, len(prompt)


def _batches(
    texts: list[Text], tokenizer, cfg: TeacherConfig, done: set[str]
) -> Iterator[tuple[list[Text], list[list[int]], list[int]]]:
    """Batches ``(texts, ids, prompt_lens)`` that hold a text not in ``done``, in the fixed order of the module
    docstring."""
    for start in range(0, len(texts), cfg.window):
        chunk = texts[start : start + cfg.window]
        if all(t.id in done for t in chunk):
            continue
        made = [text_ids(t, tokenizer, cfg.prompt_format) for t in chunk]
        ids = [x[: cfg.max_len] for x, _ in made]
        order = sorted(range(len(chunk)), key=lambda i: (len(ids[i]), i))
        batch: list[int] = []
        for i in order + [None]:
            if batch and (i is None or (len(batch) + 1) * len(ids[i]) > cfg.batch_tokens):
                if any(chunk[b].id not in done for b in batch):
                    plens = [min(made[b][1], cfg.max_len) for b in batch]
                    yield [chunk[b] for b in batch], [ids[b] for b in batch], plens
                batch = []
            if i is not None:
                batch.append(i)


@torch.no_grad()
def last_hidden_states(target, seqs: list[list[int]], pad_id: int) -> list[np.ndarray]:
    """The target's last hidden state at every position of each sequence, ``[len, H]`` float32: one forward over the
    right-padded batch (causal attention: a row's padding comes after it and changes nothing it reads), no logits."""
    width = max(len(s) for s in seqs)
    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        input_ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    device = target.get_input_embeddings().weight.device
    out = target(
        input_ids=input_ids.to(device),
        attention_mask=mask.to(device),
        output_hidden_states=True,
        logits_to_keep=1,
        use_cache=False,
    )
    last = out.hidden_states[-1].float().cpu()  # [B, T, H]
    return [last[i, : len(s)].numpy() for i, s in enumerate(seqs)]


def rate_line(tokens: int, seconds: float, what: str = "stored") -> str:
    return f"{tokens} tokens {what} in {seconds:.0f} s: {tokens / max(seconds, 1e-9):.1f} tokens/s"


def teacher_forced(
    target, tokenizer, cfg: TeacherConfig, texts: list[Text], target_name: str = "", progress: bool = True
) -> DistillStore:
    """Run (or resume) a teacher-forced extraction of ``texts`` into the sharded store ``cfg.out``; returns the
    store (:meth:`DistillStore.open` of it). One process: several would each need their own shards."""
    from .accel import num_processes

    if num_processes() > 1:
        raise ValueError("distill --teacher-forced runs in one process (its shards are written in order)")
    tc = target.config.get_text_config()
    meta = {
        "target": target_name,
        "prompt_format": cfg.prompt_format,
        "max_new_tokens": None,
        "teacher_forced": True,
        "max_len": cfg.max_len,
        "hidden_size": int(tc.hidden_size),
        "vocab_size": int(tc.vocab_size),
    }
    writer = ShardWriter.create_or_resume(cfg.out, meta, cfg.shard_tokens)
    done = writer.done_ids()
    eos = target.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    pad_id = int(target.generation_config.pad_token_id or 0)

    def full() -> bool:
        return (cfg.limit is not None and len(writer) >= cfg.limit) or (
            cfg.max_tokens is not None and writer.num_tokens >= cfg.max_tokens
        )

    bar = tqdm(
        total=len(texts),
        initial=sum(t.id in done for t in texts),
        desc="distill (teacher forced)",
        unit="seq",
        disable=not progress,
    )
    new_tokens, start = 0, time.perf_counter()
    for batch, ids, plens in _batches(texts, tokenizer, cfg, done):
        if full():
            break
        hidden = last_hidden_states(target, ids, pad_id)  # plain forward: the CPU kernels serve decoding
        for t, x, plen, h in zip(batch, ids, plens, hidden):
            if t.id in done or full():
                continue
            writer.append(t.id, t.source, x[:plen], x[plen:], bool(x) and x[-1] in eos_ids, h)
            new_tokens += len(x)
            bar.update(1)
        bar.set_postfix(tokens=writer.num_tokens, tok_s=f"{new_tokens / (time.perf_counter() - start):.0f}")
    bar.close()
    if progress:
        print(f"distill: {rate_line(new_tokens, time.perf_counter() - start)} (teacher forced)", file=sys.stderr)
    return DistillStore.open(cfg.out)


__all__ = ["TeacherConfig", "last_hidden_states", "rate_line", "teacher_forced", "text_ids"]
