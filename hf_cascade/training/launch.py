"""The processes and placement options of ``hf-cascade distill`` and ``hf-cascade train``: parsing, starting the
processes and closing their group (what the commands do is in :mod:`.accel`, :mod:`.loop` and :mod:`.distill`).

``--num-processes N`` (N > 1) starts the same command under ``accelerate launch --multi_gpu --num_processes N``
(``ACCELERATE_USE_CPU=true`` without CUDA: gloo processes on the CPU) and waits for it; a command already started by
``accelerate launch`` or ``torchrun`` ignores it. ``--target-device-map`` loads the frozen target with
``from_pretrained``'s ``device_map`` (``auto``, ``balanced``, ``sequential``, ``cpu`` or a JSON object of module ->
device); with several processes a named map shards each process's target over GPUs of its own
(:func:`.accel.process_gpus`), and a JSON map, which would put every process's target on the same devices, is refused.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential", "cpu")


def add_process_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--num-processes",
        type=int,
        default=1,
        metavar="N",
        help="data-parallel processes: starts `accelerate launch --num_processes N` for you (default 1; "
        "or run the command under `accelerate launch` yourself)",
    )
    p.add_argument(
        "--target-device-map",
        default=None,
        metavar="MAP",
        help="place the frozen target with from_pretrained's device_map: auto, balanced, sequential, cpu "
        "or a JSON object (one process) for sharded / offloaded targets; with --num-processes N a named "
        "map shards each process's copy over GPUs of its own",
    )


def add_train_options(p: argparse.ArgumentParser) -> None:
    from .accel import PRECISIONS

    p.add_argument(
        "--grad-accum",
        type=int,
        default=1,
        metavar="N",
        help="micro-batches per process and step; the batch per step stays --batch-size (default 1)",
    )
    p.add_argument(
        "--mixed-precision",
        choices=PRECISIONS,
        default="no",
        help="autocast the step in bf16 or fp16 (float32 weights; fp16 with a gradient scaler)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="K",
        help="write a resumable checkpoint (OUT/checkpoint) every K steps (default 0: none)",
    )
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint to the same end")
    p.add_argument(
        "--fsdp",
        action="store_true",
        help="shard the head, its gradients and optimizer states over the processes (FSDP); also on when "
        "accelerate's config asks for FSDP",
    )
    add_process_options(p)


def device_map(value: str | None):
    """The ``device_map`` a ``--target-device-map`` value names (``None``: none); ``ValueError`` otherwise."""
    if value is None or value in DEVICE_MAPS:
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ValueError(
            f"--target-device-map must be one of {', '.join(DEVICE_MAPS)} or a JSON object of "
            f"module -> device, got {value!r}"
        )
    return parsed


def launched() -> bool:
    """True in a process started by ``accelerate launch`` / ``torchrun`` (they set ``WORLD_SIZE``)."""
    return "WORLD_SIZE" in os.environ


def check_processes(args: argparse.Namespace, processes: int) -> None:
    """``ValueError`` for option combinations that cannot run (before any model is loaded)."""
    if args.num_processes < 1:
        raise ValueError(f"--num-processes must be >= 1, got {args.num_processes}")
    if isinstance(device_map(args.target_device_map), dict) and processes > 1:
        raise ValueError(
            "a JSON --target-device-map puts every process's target on the same devices; with "
            f"{processes} processes name a map (auto, balanced, sequential): each process then shards "
            "its target over GPUs of its own"
        )


def relaunch(argv: list[str], args: argparse.Namespace) -> int:
    """Run ``hf-cascade argv`` under ``accelerate launch --num_processes args.num_processes`` (after checking
    what can be checked before the processes start); its exit code."""
    import torch

    from .accel import check_layout

    processes = args.num_processes
    check_processes(args, processes)
    if args.command == "train":
        check_layout(args.batch_size, args.grad_accum, args.mixed_precision, processes)

    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "-m",
        "hf_cascade.cli",
        *_without_num_processes(argv),
    ]
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env["ACCELERATE_USE_CPU"] = "true"
    return subprocess.call(cmd, env=env)


def leave_process_group(finished: bool) -> None:
    """Close a launched run's process group before the interpreter exits. Left open, gloo's threads are torn down at
    exit, and a rank can abort there ("terminate called without an active exception") after its command finished.
    ``finished``: every process returned normally, so all reach a last barrier (after an error only this process's
    group is closed: a barrier could wait for a process that will never come)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()


def _without_num_processes(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--num-processes":
            skip = True
        elif not a.startswith("--num-processes="):
            out.append(a)
    return out


__all__ = [
    "add_process_options",
    "add_train_options",
    "check_processes",
    "device_map",
    "launched",
    "leave_process_group",
    "relaunch",
]
