"""Where training runs: processes, devices, precision and resumable checkpoints, on ``accelerate``.

* Processes: one by default; ``accelerate launch --multi_gpu --num_processes N -m hf_cascade.cli train ...``
  (or ``torchrun``, or ``hf-cascade train --num-processes N``) starts ``N`` data-parallel processes (DDP; gloo
  on CPUs, NCCL on GPUs). Every process holds the frozen target and the head. Where accelerate's config asks for
  FSDP (or ``--fsdp``), the loop shards the head itself (:mod:`.sharding`); DeepSpeed and Megatron-LM configs are
  refused (:func:`accelerator`).
* Devices: the target goes to the process's device (:func:`place_target`) unless it was loaded with a
  ``device_map`` (sharded or offloaded). With several processes a named map (``auto``, ``balanced``, ...) shards
  each process's target over GPUs of its own (:func:`process_gpus`, :func:`target_max_memory`): a target larger
  than one GPU trains data parallel, e.g. 2 processes of 4 GPUs each on a node of 8. The head goes where its
  inputs are: one process's mapped target, the device of its output layer; else the process's device, the one
  DDP runs the head on (:func:`head_device`).
* Precision: ``"bf16"`` / ``"fp16"`` run the step (the head's forward and the target's) under
  ``torch.autocast`` with float32 weights, fp16 with a gradient scaler (:func:`precision`). It is applied here
  rather than through ``Accelerator(mixed_precision=...)`` because accelerate fixes that once per process,
  and a library may train several heads in one process.
* Checkpoints (:func:`save_checkpoint` / :func:`load_checkpoint`): ``accelerate``'s ``save_state`` of the
  head, the optimizer, the scheduler, the scaler, every process's RNG states and the run's progress (data
  position, history), written to a temporary folder and renamed, so an interrupt never leaves a torn one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import torch

from . import sharding

PRECISIONS = ("no", "bf16", "fp16")
CHECKPOINT = "checkpoint"


def _cpu() -> bool:
    """Run on the CPU: no CUDA device, or ``ACCELERATE_USE_CPU`` set (``accelerate launch --cpu``)."""
    from accelerate.utils import parse_flag_from_env

    return parse_flag_from_env("ACCELERATE_USE_CPU") or not torch.cuda.is_available()


def process_state():
    """accelerate's ``PartialState`` of this process. On the CPU it is asked for explicitly: accelerate makes
    processes started by a launcher one gloo group only then (otherwise each would train alone)."""
    from accelerate import PartialState

    return PartialState(cpu=_cpu())


def accelerator():
    """An ``accelerate.Accelerator`` for this process (the launcher's settings; one process when not
    launched); DDP may leave parameters unused by a step (a head's optional parts)."""
    from accelerate import Accelerator, DistributedDataParallelKwargs

    process_state()
    with sharding.hidden_from_libraries():  # FSDP is the loop's own (.sharding), not accelerate's
        acc = Accelerator(
            mixed_precision="no",
            cpu=_cpu(),
            kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
        )
    kind = acc.distributed_type.value
    if kind in ("FSDP", "DEEPSPEED", "MEGATRON_LM"):
        raise ValueError(
            f"accelerate's config asks for {kind}: hf-cascade trains heads data parallel (DDP), or "
            "sharded with FSDP. Launch with `accelerate launch --multi_gpu ...` (add --fsdp to shard the "
            "head) or `hf-cascade train --num-processes N`; place a target too large for one device "
            "with --target-device-map (each process shards its own copy)"
        )
    return acc


def num_processes() -> int:
    """The number of processes of this run (1 when not launched by accelerate / torchrun)."""
    return process_state().num_processes


def is_main_process() -> bool:
    return process_state().is_main_process


def main_process_first():
    """A context in which the main process runs first and the others after it (files one process writes and
    all read, e.g. soft labels); a plain context with one process."""
    state = process_state()
    return state.main_process_first() if state.num_processes > 1 else contextlib.nullcontext()


def place_target(target) -> torch.nn.Module:
    """Move the frozen ``target`` to this process's device unless it was loaded with a ``device_map``
    (then it stays where the map put it); eval mode, no gradients."""
    if not getattr(target, "hf_device_map", None):
        target.to(process_state().device)
    return target.eval().requires_grad_(False)


def head_device(target) -> torch.device:
    """Where a head trains: in a single process with a target placed by a ``device_map``, the device of the
    target's output layer (its hidden states and logits end there); otherwise this process's device (with several
    processes DDP runs the head there; it is among a mapped target's GPUs, :func:`process_gpus`, and the losses
    move the target's states to the head)."""
    state = process_state()
    if getattr(target, "hf_device_map", None) and state.num_processes == 1:
        return target.get_output_embeddings().weight.device
    return state.device


def process_gpus(local_rank: int, local_processes: int, gpus: int) -> list[int]:
    """The GPUs (indices on this machine) a data-parallel process with a device-mapped target shards it over:
    every ``local_processes``-th from its own, ``local_rank``, so its first is the device accelerate gives it and
    each process has ``gpus // local_processes`` (the rest idle). ``ValueError`` with fewer GPUs than processes."""
    if gpus < local_processes:
        raise ValueError(
            f"--target-device-map with {local_processes} processes on this machine needs a GPU per "
            f"process at least; {gpus} found. Run fewer processes (--num-processes) or none mapped"
        )
    return [local_rank + k * local_processes for k in range(gpus // local_processes)]


def target_max_memory(device_map, available=None) -> dict | None:
    """``from_pretrained``'s ``max_memory`` for this process's mapped target: ``None`` (the map alone) in one
    process, on a CPU-only machine, or for an explicit map; with several processes and a named map, the memory
    accelerate finds free (``available``, default ``accelerate.utils.get_max_memory()``) on this process's GPUs
    (:func:`process_gpus`) and its share of the CPU's (offloaded layers)."""
    state = process_state()
    if device_map is None or isinstance(device_map, dict) or state.num_processes == 1:
        return None
    if available is None:
        if not torch.cuda.is_available() or _cpu():
            return None
        from accelerate.utils import get_max_memory

        available = get_max_memory()
    gpus = sorted(k for k in available if isinstance(k, int))
    if not gpus:
        return None
    local = int(os.environ.get("LOCAL_WORLD_SIZE", state.num_processes))  # processes on this machine
    mine = process_gpus(state.local_process_index, local, len(gpus))
    memory = {gpus[i]: available[gpus[i]] for i in mine}
    if "cpu" in available:
        memory["cpu"] = available["cpu"] // local
    return memory


def check_layout(batch_size: int, grad_accum: int, mixed_precision: str, processes: int | None = None) -> None:
    """``ValueError`` unless ``batch_size`` sequences split into the processes x ``grad_accum`` micro-batches
    and ``mixed_precision`` is one of :data:`PRECISIONS`."""
    if mixed_precision not in PRECISIONS:
        raise ValueError(f"mixed precision must be one of {', '.join(PRECISIONS)}, got {mixed_precision!r}")
    if grad_accum < 1:
        raise ValueError(f"gradient accumulation must be >= 1 micro-batch, got {grad_accum}")
    world = num_processes() if processes is None else processes
    if batch_size % (world * grad_accum):
        raise ValueError(
            f"--batch-size {batch_size} (sequences per step, all processes together) must be a multiple "
            f"of {world} process(es) x --grad-accum {grad_accum}"
        )


def precision(mixed_precision: str, device: torch.device, sharded: bool = False):
    """``(autocast context factory, GradScaler or None)`` for ``"no"``, ``"bf16"`` or ``"fp16"`` (``sharded``:
    FSDP's scaler, which agrees over the processes on skipping a step)."""
    if mixed_precision == "no":
        return contextlib.nullcontext, None
    dtype = torch.bfloat16 if mixed_precision == "bf16" else torch.float16
    scaler = None
    if mixed_precision == "fp16":
        scaler = sharding.grad_scaler(device) if sharded else torch.amp.GradScaler(device.type)
    return (lambda: torch.autocast(device.type, dtype=dtype)), scaler


class Progress:
    """The run's position as a checkpointable object: the last finished step, the data position (global
    batches taken), the history, the best evaluation and the seconds trained."""

    def __init__(self, **state):
        self.state = state

    def state_dict(self) -> dict:
        return dict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = dict(state)


def save_checkpoint(acc, out: Path, shards=None) -> Path:
    """``acc.save_state`` into ``out/checkpoint`` (through ``out/checkpoint.tmp`` and a rename), and with
    ``shards = (sharded head, optimizer)`` their shards (:func:`.sharding.save`); every process calls it.
    Returns the folder."""
    final, tmp = out / CHECKPOINT, out / (CHECKPOINT + ".tmp")
    if acc.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    acc.wait_for_everyone()
    acc.save_state(str(tmp))
    if shards is not None:
        sharding.save(*shards, tmp)
    acc.wait_for_everyone()
    if acc.is_main_process:
        old = out / (CHECKPOINT + ".old")
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    acc.wait_for_everyone()
    return final


def load_checkpoint(acc, out: Path, shards=None) -> None:
    """Restore what :func:`save_checkpoint` wrote into the objects registered with ``acc`` (and ``shards``);
    ``ValueError`` when ``out`` holds none."""
    path = out / CHECKPOINT
    saved = len(list(path.glob("random_states_*.pkl")))
    if not saved:
        raise ValueError(
            f"--resume: no checkpoint in {path} (written every --checkpoint-every steps); run without "
            "--resume to start over"
        )
    if saved != acc.num_processes:
        raise ValueError(
            f"--resume: {path} was written by {saved} process(es); resume it with as many, not {acc.num_processes}"
        )
    written = (path / sharding.SHARDED).is_dir()
    if written != (shards is not None):
        how = "with FSDP (--fsdp or accelerate's FSDP config)" if written else "without FSDP"
        raise ValueError(f"--resume: {path} was written by a run {how}; resume it the same way")
    acc.load_state(str(path))
    if shards is not None:
        sharding.load(*shards, path)


def remove_checkpoint(acc, out: Path) -> None:
    """Delete ``out/checkpoint`` (a finished run keeps only its Hub-layout head and training state)."""
    acc.wait_for_everyone()
    if acc.is_main_process:
        shutil.rmtree(out / CHECKPOINT, ignore_errors=True)


__all__ = [
    "PRECISIONS",
    "Progress",
    "accelerator",
    "check_layout",
    "head_device",
    "is_main_process",
    "load_checkpoint",
    "main_process_first",
    "num_processes",
    "place_target",
    "precision",
    "process_gpus",
    "remove_checkpoint",
    "save_checkpoint",
    "target_max_memory",
]
