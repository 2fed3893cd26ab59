"""Self-generated training questions: more varied prompts for distillation, from the target itself.

The shared training prompts are 7473 GSM8K problems and only 255 general ones (Alpaca seed tasks,
Vicuna bench), so drafters distilled on them learn grade-school arithmetic far better than the
writing, coding, QA and extraction that make up most of Spec-Bench. :func:`sample_questions` asks
the frozen target for new questions in the style of the general ones: two seed questions in the
completion template's ``Question:`` format, then the target *samples* a third
(``temperature``, ``top_p``), and the first line of it is kept. Seeds are two random general
prompts, or (with probability ``gsm8k_share``) a GSM8K problem and a general prompt.

Kept: at least ``min_words`` words, not a seed, not seen before (case-insensitive), no
``"Answer"``. The questions then go through ``hf-cascade distill --prompts FILE`` like any prompt
file, which removes Spec-Bench questions and stores the target's greedy answers.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class QuestionConfig:
    """Settings of :func:`sample_questions`."""

    n: int = 600
    batch_size: int = 32
    max_new_tokens: int = 40
    temperature: float = 1.0
    top_p: float = 0.95
    gsm8k_share: float = 0.15
    min_words: int = 4
    #: seeds longer than this are not used: the batch is left-padded to its longest prompt, so one long
    #: Vicuna/Alpaca seed makes every row of its batch prefill that many tokens
    max_seed_chars: int = 600
    seed: int = 0


def seed_prompt(first: str, second: str) -> str:
    """The few-shot prompt whose continuation is a new question."""
    return f"Question: {first}\n\nQuestion: {second}\n\nQuestion:"


@torch.no_grad()
def sample_questions(
    target,
    tokenizer,
    general: Sequence[str],
    gsm8k: Sequence[str],
    cfg: QuestionConfig,
    exclude: Sequence[str] = (),
    progress: bool = True,
) -> list[str]:
    """``cfg.n`` new questions sampled by ``target`` (see the module docstring); ``exclude``: texts
    that must not be returned (e.g. questions already written)."""
    from ..backends import verification_session  # the CPU kernels only where the switch engages them

    general = [g for g in general if len(g) <= cfg.max_seed_chars]
    gsm8k = [g for g in gsm8k if len(g) <= cfg.max_seed_chars]
    if len(general) < 2:
        raise ValueError(
            f"sample_questions needs at least two general seed prompts of at most {cfg.max_seed_chars} characters"
        )
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    general = [g.strip().replace("\n", " ") for g in general]
    seeds = set(general)
    seen = {q.lower() for q in exclude}
    out: list[str] = []
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.n, desc="questions", unit="q")
    try:
        while len(out) < cfg.n:
            batch = []
            for _ in range(cfg.batch_size):
                pair = (
                    [rng.choice(list(gsm8k)), rng.choice(general)]
                    if gsm8k and rng.random() < cfg.gsm8k_share
                    else rng.sample(general, 2)
                )
                batch.append(seed_prompt(*pair))
            enc = tokenizer(batch, return_tensors="pt", padding=True).to(target.device)
            with verification_session(target):  # batched rows: the CPU kernels where the switch engages them
                gen = target.generate(
                    input_ids=enc["input_ids"],
                    attention_mask=enc["attention_mask"],
                    max_new_tokens=cfg.max_new_tokens,
                    do_sample=True,
                    temperature=cfg.temperature,
                    top_p=cfg.top_p,
                )  # [B, T + new]
            for row in gen[:, enc["input_ids"].shape[1] :]:
                text = tokenizer.decode(row, skip_special_tokens=True).split("\n")[0].strip()
                if len(text.split()) < cfg.min_words or text in seeds or text.lower() in seen or "Answer" in text:
                    continue
                seen.add(text.lower())
                out.append(text)
                if bar is not None:
                    bar.update(1)
                if len(out) == cfg.n:
                    break
    finally:
        tokenizer.padding_side = side
        if bar is not None:
            bar.close()
    return out


def read_questions(path: str | Path) -> list[str]:
    p = Path(path)
    if not p.is_file():
        return []
    return [json.loads(line)["question"] for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


def append_questions(path: str | Path, questions: Sequence[str]) -> None:
    """Append ``{"question": ...}`` lines (the layout ``hf-cascade distill --prompts`` reads)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a", encoding="utf-8") as f:
        for q in questions:
            f.write(json.dumps({"question": q}) + "\n")


__all__ = ["QuestionConfig", "append_questions", "read_questions", "sample_questions", "seed_prompt"]
