"""The training loop shared by every drafter head (``hf-cascade train vanilla|glide|redrafter``).

A head supplies three functions; the loop does the rest (batches from a
:class:`~hf_cascade.training.store.DistillStore`, AdamW with warmup + cosine decay, gradient
clipping, a progress bar, periodic held-out evaluation, Hub-layout checkpoints, a training curve)::

    loss_fn(model, batch)  -> (loss, {"name": float, ...})     one optimisation step's loss
    eval_fn(model)         -> {"alpha": float, ...}           held-out acceptance metrics
    save_fn(model, state)  -> None                            write the checkpoint (Hub layout)

The target is frozen: heads that need it close over it in ``loss_fn`` and never hand its
parameters to the optimizer.
"""

from __future__ import annotations

import json
import math
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
from tqdm.auto import tqdm

from .store import DistillStore


@dataclass
class TrainConfig:
    out: Path
    steps: int = 600
    batch_size: int = 16          # sequences per step
    max_len: int = 256            # tokens per sequence (longer ones are cut at the end)
    lr: float = 2e-3
    warmup: int = 30
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_records: int = 48        # held-out sequences (never trained on)
    prompt_weight: float = 0.1    # loss weight of prompt positions (responses weigh 1)
    seed: int = 0


@dataclass
class Batch:
    """Right-padded sequences. ``input_ids``: ``[B, T]``; ``weights``: ``[B, T]``, the loss weight of
    predicting ``input_ids[:, t]`` from the tokens before it (0 at padding and at t = 0);
    ``attention_mask``: ``[B, T]``; ``index``: the store records, for heads that read hidden states;
    ``response``: ``[B, T]`` bool, True where ``input_ids[:, t]`` is a token of the target's response."""

    input_ids: torch.Tensor
    weights: torch.Tensor
    attention_mask: torch.Tensor
    index: list[int]
    response: torch.Tensor | None = None


@dataclass
class TrainState:
    step: int = 0
    seconds: float = 0.0
    history: list[dict] = field(default_factory=list)   # {"step", "loss", ...} and {"step", "eval": {...}}
    best: dict | None = None


def split_records(store: DistillStore, eval_records: int) -> tuple[list[int], list[int]]:
    """Deterministic train / held-out split by a hash of the record ids: the same set of records
    gives the same split whatever their order in the store (a resumed distillation splits like an
    uninterrupted one). Adding records may move earlier held-out records into training."""
    keyed = sorted(range(len(store)), key=lambda i: zlib.crc32(store.records[i].id.encode()))
    held = set(keyed[: min(eval_records, max(0, len(store) - 1))])
    return [i for i in range(len(store)) if i not in held], sorted(held)


def make_batch(store: DistillStore, index: list[int], max_len: int, prompt_weight: float, pad_id: int = 0) -> Batch:
    seqs = [store.sequence(i) for i in index]
    width = min(max_len, max(len(s) for s, _ in seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    weights = torch.zeros(len(seqs), width)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    response = torch.zeros(len(seqs), width, dtype=torch.bool)
    for b, (s, plen) in enumerate(seqs):
        n = min(width, len(s))
        ids[b, :n] = torch.from_numpy(s[:n].astype(np.int64))
        mask[b, :n] = 1
        weights[b, 1:n] = prompt_weight
        weights[b, max(1, plen):n] = 1.0
        response[b, max(1, plen):n] = True
    return Batch(ids, weights, mask, list(index), response)


def iterate_batches(store: DistillStore, train_idx: list[int], cfg: TrainConfig) -> Iterator[Batch]:
    """Endless shuffled batches (epoch after epoch)."""
    rng = np.random.default_rng(cfg.seed)
    while True:
        order = rng.permutation(train_idx)
        for s in range(0, len(order) - cfg.batch_size + 1, cfg.batch_size):
            yield make_batch(store, order[s : s + cfg.batch_size].tolist(), cfg.max_len, cfg.prompt_weight)


def _lr_factor(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train(
    model: torch.nn.Module,
    batches: Iterator[Batch],
    loss_fn: Callable[[torch.nn.Module, Batch], tuple[torch.Tensor, dict]],
    eval_fn: Callable[[torch.nn.Module], dict],
    save_fn: Callable[[torch.nn.Module, TrainState], None],
    cfg: TrainConfig,
    progress: bool = True,
) -> TrainState:
    """Train ``model`` for ``cfg.steps`` steps; evaluate and save every ``cfg.eval_every`` steps and
    at the end (the saved checkpoint is always the latest one; ``state.best`` records the best eval)."""
    torch.manual_seed(cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, cfg))
    state = TrainState()
    bar = tqdm(total=cfg.steps, desc="train", unit="step", disable=not progress)
    t0 = time.perf_counter()
    for step in range(1, cfg.steps + 1):
        model.train()
        loss, metrics = loss_fn(model, next(batches))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        sched.step()
        state.step = step
        loss_value = loss.item()
        state.history.append({"step": step, "loss": loss_value, "lr": sched.get_last_lr()[0], **metrics})
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.3f}")
        if step % cfg.eval_every == 0 or step == cfg.steps:
            model.eval()
            with torch.no_grad():
                ev = eval_fn(model)
            state.history.append({"step": step, "eval": ev})
            if state.best is None or ev.get("alpha", 0) >= state.best.get("alpha", 0):
                state.best = {"step": step, **ev}
            state.seconds = time.perf_counter() - t0
            save_fn(model, state)
            bar.set_postfix(loss=f"{loss_value:.3f}", alpha=f"{ev.get('alpha', float('nan')):.3f}")
    bar.close()
    model.eval()
    return state


def write_state(state: TrainState, cfg: TrainConfig, out: Path, extra: dict | None = None) -> None:
    """``trainer_state.json`` and ``training_curve.png`` (if matplotlib is installed) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    cfg_d = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
    doc = {"config": cfg_d, "step": state.step, "seconds": round(state.seconds, 1), "best": state.best,
           "history": state.history, **(extra or {})}
    (out / "trainer_state.json").write_text(json.dumps(doc, indent=1) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    steps = [h["step"] for h in state.history if "loss" in h]
    losses = [h["loss"] for h in state.history if "loss" in h]
    evals = [(h["step"], h["eval"].get("alpha")) for h in state.history if "eval" in h]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, losses, lw=0.8, color="tab:blue", label="train loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    if evals:
        ax2 = ax.twinx()
        ax2.plot([s for s, _ in evals], [a for _, a in evals], "o-", color="tab:orange", label="held-out acceptance")
        ax2.set_ylabel("greedy acceptance (alpha)")
        ax2.set_ylim(0, 1)
    ax.set_title("drafter training")
    fig.tight_layout()
    fig.savefig(out / "training_curve.png", dpi=110)
    plt.close(fig)
