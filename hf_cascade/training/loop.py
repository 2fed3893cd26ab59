"""The training loop shared by every drafter head (``hf-cascade train vanilla|glide|redrafter``).

A head supplies three functions; the loop does the rest (batches from a
:class:`~hf_cascade.training.store.DistillStore`, AdamW with warmup + cosine decay, gradient
clipping, a progress bar, periodic held-out evaluation, Hub-layout checkpoints, a training curve)::

    loss_fn(model, batch)  -> (loss, {"name": float, ...})     one optimisation step's loss
    eval_fn(model)         -> {"alpha": float, ...}           held-out acceptance metrics
    save_fn(model, state)  -> None                            write the checkpoint (Hub layout)

The target is frozen: heads that need it close over it in ``loss_fn`` and never hand its
parameters to the optimizer.

Runs on ``accelerate`` (:mod:`.accel`): a step trains on one global batch of ``batch_size`` sequences,
split evenly over the processes and, within a process, over ``grad_accum`` micro-batches; the
gradient is the mean of the parts' gradients (of their weighted-mean losses), so one process with
``grad_accum = 1`` is the single-process loop unchanged, and ``N`` processes or micro-batches train
on the same sequences per step (DDP, or FSDP: :mod:`.sharding`). Evaluation, saving and the progress bar run on the
main process only;
the logged loss and metrics are means over the parts. ``checkpoint_every = K`` writes a resumable
checkpoint every ``K`` steps (``out/checkpoint``, removed when the run finishes); ``resume`` continues
from it to the same end as an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from . import accel, sharding
from .acceptance import plot_acceptance
from .batches import Batch, BatchIterator, BatchStream, iterate_batches, make_batch, split_records  # noqa: F401


@dataclass
class TrainConfig:
    out: Path
    steps: int = 600
    batch_size: int = 16  # sequences per step, all processes together
    max_len: int = 256  # tokens per sequence (longer ones are cut at the end)
    lr: float = 2e-3
    warmup: int = 30
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_records: int = 48  # held-out sequences (never trained on)
    prompt_weight: float = 0.1  # loss weight of prompt positions (responses weigh 1)
    unroll: int = 1  # glide, redrafter: drafted positions 2..unroll fed the head's own predictions (HASS)
    feature_weight: float = 0.0  # glide, redrafter: weight of the feature regression beside the token loss (EAGLE)
    seed: int = 0
    grad_accum: int = 1  # micro-batches per process and step (the batch per step stays batch_size)
    mixed_precision: str = "no"  # "no", "bf16" or "fp16" (autocast, float32 weights)
    checkpoint_every: int = 0  # steps between resumable checkpoints in out/checkpoint (0: none)
    resume: bool = False  # continue from out/checkpoint
    fsdp: bool = False  # shard the head over the processes (also when accelerate's config asks: sharding)


@dataclass
class TrainState:
    step: int = 0
    seconds: float = 0.0
    history: list[dict] = field(default_factory=list)  # {"step", "loss", ...} and {"step", "eval": {...}}
    best: dict | None = None
    layout: dict = field(default_factory=dict)  # how the head trains: {"fsdp", "head_parameters", "parameters_here"}


def _lr_factor(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


class _Step(torch.nn.Module):
    """The head and its loss as one module: what DDP wraps, so every head method the loss calls runs
    inside the wrapped forward (gradients are synchronised whatever the loss reads of the head)."""

    def __init__(self, head: torch.nn.Module, loss_fn: Callable):
        super().__init__()
        self.head, self.loss_fn = head, loss_fn  # a loss that is a module (features.HeadLoss) trains with the head

    def forward(self, batch: Batch):
        return self.loss_fn(self.head, batch)


def train(
    model: torch.nn.Module,
    batches: BatchIterator,
    loss_fn: Callable[[torch.nn.Module, Batch], tuple[torch.Tensor, dict]],
    eval_fn: Callable[[torch.nn.Module], dict],
    save_fn: Callable[[torch.nn.Module, TrainState], None],
    cfg: TrainConfig,
    progress: bool = True,
) -> TrainState:
    """Train ``model`` for ``cfg.steps`` steps on ``batches`` (:func:`iterate_batches`); evaluate and save
    every ``cfg.eval_every`` steps and at the end (the saved checkpoint is always the latest one;
    ``state.best`` records the best eval). In every process of a launched run (see the module docstring)."""
    acc = accel.accelerator()
    world, rank, device = acc.num_processes, acc.process_index, next(model.parameters()).device
    accel.check_layout(cfg.batch_size, cfg.grad_accum, cfg.mixed_precision, world)
    fsdp = sharding.requested(cfg.fsdp, world)
    stream = batches.stream
    torch.manual_seed(cfg.seed)
    if fsdp:  # a sharded copy trains; `model` stays whole (sharding module)
        step_module = sharding.shard(_Step(model, loss_fn), fsdp, device)
    else:
        step_module = acc.prepare(_Step(model, loss_fn), device_placement=[False])
    own = [p for p in loss_fn.parameters()] if isinstance(loss_fn, torch.nn.Module) else []
    if fsdp and own:
        raise ValueError("a loss with its own parameters (a feature regression) trains data parallel, not with FSDP")
    trained = step_module.head if fsdp else model
    whole = trained if fsdp else acc.unwrap_model(step_module)  # the head, and a loss's own parameters (features)
    params = [p for p in whole.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, cfg))
    autocast, scaler = accel.precision(cfg.mixed_precision, device, sharded=fsdp is not None)
    run = _run_settings(cfg)
    done = accel.Progress(step=0, batches=0, seconds=0.0, history=[], best=None, run=run)
    acc.register_for_checkpointing(*([] if fsdp else [opt]), sched, done, *([scaler] if scaler is not None else []))
    with_shards = (trained, opt) if fsdp else None
    if cfg.resume:
        accel.load_checkpoint(acc, Path(cfg.out), with_shards)
        changed = {k: (v, run.get(k)) for k, v in done.state.get("run", {}).items() if run.get(k) != v}
        if changed:
            raise ValueError(
                f"--resume: the checkpoint in {cfg.out} was written by a run with other settings "
                f"(checkpoint, now): {changed}"
            )
        stream.skip(done.state["batches"] - stream.position)
    state = TrainState(
        done.state["step"],
        done.state["seconds"],
        list(done.state["history"]),
        done.state["best"],
        sharding.layout(model, trained, fsdp is not None),
    )
    bar = tqdm(
        total=cfg.steps, initial=state.step, desc="train", unit="step", disable=not (progress and acc.is_main_process)
    )
    t0 = time.perf_counter() - state.seconds
    for step in range(state.step + 1, cfg.steps + 1):
        trained.train()
        parts = stream.share(next(stream), rank, world, cfg.grad_accum)
        opt.zero_grad(set_to_none=True)
        logged = []
        for m, index in enumerate(parts):
            sync = _unsynced(acc, step_module, fsdp) if m < len(parts) - 1 else contextlib.nullcontext()
            with sync:
                with autocast():
                    loss, metrics = step_module(stream.batch(index).to(device))
                scaled = loss / len(parts)
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
            logged.append([loss.item(), *metrics.values()])
        if scaler is not None:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        sched.step()
        state.step = step
        values = _mean_over_parts(acc, logged)
        loss_value = values[0]
        state.history.append(
            {"step": step, "loss": loss_value, "lr": sched.get_last_lr()[0], **dict(zip(metrics, values[1:]))}
        )
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.3f}")
        if step % cfg.eval_every == 0 or step == cfg.steps:
            if fsdp:
                sharding.gather_into(trained, model)
            if acc.is_main_process:
                model.eval()
                with torch.no_grad():
                    ev = eval_fn(model)
                state.history.append({"step": step, "eval": ev})
                if state.best is None or ev.get("alpha", 0) >= state.best.get("alpha", 0):
                    state.best = {"step": step, **ev}
                state.seconds = time.perf_counter() - t0
                save_fn(model, state)
                bar.set_postfix(loss=f"{loss_value:.3f}", alpha=f"{ev.get('alpha', float('nan')):.3f}")
            acc.wait_for_everyone()
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < cfg.steps:
            state.seconds = time.perf_counter() - t0
            done.state = {
                "step": step,
                "batches": stream.position,
                "seconds": state.seconds,
                "history": state.history,
                "best": state.best,
                "run": run,
            }
            accel.save_checkpoint(acc, Path(cfg.out), with_shards)
    bar.close()
    if fsdp:
        sharding.gather_into(trained, model)
    if cfg.checkpoint_every or cfg.resume:
        accel.remove_checkpoint(acc, Path(cfg.out))
    model.eval()
    return state


def _unsynced(acc, step_module, fsdp):
    """The context of a micro-batch before a step's last: its gradient is kept, not reduced over the processes."""
    return sharding.no_sync(step_module) if fsdp else acc.no_sync(step_module)


def _run_settings(cfg: TrainConfig) -> dict:
    """What a resumed run must share with the run that wrote its checkpoint to end where it would have (the
    micro-batches and the precision may change; the batches and the schedule may not; the number of processes
    is checked with the checkpoint's RNG states, :func:`.accel.load_checkpoint`)."""
    keep = (
        "steps",
        "batch_size",
        "max_len",
        "lr",
        "warmup",
        "weight_decay",
        "grad_clip",
        "eval_records",
        "prompt_weight",
        "seed",
        "unroll",
        "feature_weight",
    )
    return {k: getattr(cfg, k) for k in keep}


def _mean_over_parts(acc, logged: list[list[float]]) -> list[float]:
    """The loss and metrics of a step: means over the micro-batches, then over the processes (exact
    with one of each)."""
    local = [sum(col) / len(logged) for col in zip(*logged)]
    if acc.num_processes == 1:
        return local
    return (acc.reduce(torch.tensor(local, dtype=torch.float64, device=acc.device), "mean")).tolist()


def write_state(state: TrainState, cfg: TrainConfig, out: Path, extra: dict | None = None) -> None:
    """``trainer_state.json`` and ``training_curve.png`` (if matplotlib is installed) in ``out``; with evaluations
    that report acceptance by drafted position, ``acceptance_by_position.png`` too (one curve per evaluation)."""
    out.mkdir(parents=True, exist_ok=True)
    cfg_d = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
    doc = {
        "config": cfg_d,
        "processes": accel.num_processes(),
        "step": state.step,
        "seconds": round(state.seconds, 1),
        "best": state.best,
        "layout": state.layout,
        "history": state.history,
        **(extra or {}),
    }
    (out / "trainer_state.json").write_text(json.dumps(doc, indent=1) + "\n")
    by_step = {f"step {h['step']}": h["eval"] for h in state.history if "eval" in h and "accept@1" in h["eval"]}
    if by_step:
        plot_acceptance(by_step, out / "acceptance_by_position.png")
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
