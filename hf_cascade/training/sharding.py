"""FSDP for the trained head, where accelerate's config asks for it (torch's ``fully_shard``, FSDP2).

When: ``accelerate launch`` with ``distributed_type: FSDP`` in its config file (or ``--use_fsdp``) exports
``ACCELERATE_USE_FSDP=true``; ``hf-cascade train --fsdp`` asks the same (:func:`requested`). With one process there
is nothing to shard and the loop runs as it does without it.

What is sharded: the module the loop trains, the head and its loss (:class:`.loop._Step`, what DDP wraps otherwise),
as one FSDP unit over all processes. Its parameters, gradients and optimizer states are split over the processes
and the parameters gathered for each step's forward and backward; the gradient is the processes' mean, as DDP's.
A head for a large target is no longer small (a GLIDE layer of a 70B target is about a billion parameters; its
AdamW states alone take 8 bytes a parameter), and these are what FSDP divides.

Each process also keeps the caller's head whole (:func:`shard` trains a copy): before each evaluation and at the
end the shards are gathered into it (:func:`gather_into`), so evaluation, the Hub checkpoint and the returned head
read an ordinary module, on the main process alone, with no collective in them.

Not sharded: the frozen target. Each process holds it whole or placed by ``--target-device-map``. FSDP would
gather its layers at every forward, in lock step over the processes, and the target runs an unequal number of
times per process: its per-record caches (GLIDE's K/V memo, ReDrafter's hidden states) and the evaluation on the
main process run it only where they need it.

Settings read from accelerate's (its environment variables): ``reshard_after_forward``
(``FSDP_RESHARD_AFTER_FORWARD``; FSDP1's ``FULL_SHARD`` / ``SHARD_GRAD_OP`` names map to ``True`` / ``False``,
``NO_SHARD`` means DDP, the hybrid strategies are refused) and ``FSDP_OFFLOAD_PARAMS`` (parameters, gradients and
optimizer states on the CPU; GPUs only). The others (wrap policies, state-dict type, ...) do not apply to a head
trained as one unit: checkpoints are always sharded (``torch.distributed.checkpoint``), the saved head always
whole.

The frozen target must not be loaded as FSDP would load it: see :func:`hidden_from_libraries`.

Deviation from accelerate's own FSDP (``Accelerator.prepare``): its plugin runs on accelerators only and raises on a
CPU, so that path could never run where the tests run. ``fully_shard`` runs on gloo and NCCL alike, so the code the
GPU runs is the code tested here in CPU processes.
"""

from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import dataclass
from pathlib import Path

import torch

SHARDED = "sharded"  # the checkpoint's sub-folder for the head and its optimizer (torch.distributed.checkpoint)


@dataclass(frozen=True)
class FsdpSettings:
    """How the head is sharded: ``reshard_after_forward`` frees the gathered parameters between forward and
    backward (less memory, one more gather); ``offload`` keeps the shards and optimizer states on the CPU."""

    reshard_after_forward: bool = True
    offload: bool = False


_RESHARD = {"true": True, "false": False, "full_shard": True, "1": True, "shard_grad_op": False, "2": False}


def requested(asked: bool = False, processes: int = 1, env=None) -> FsdpSettings | None:
    """The FSDP settings of this run: ``None`` (data parallel, DDP) unless ``asked`` (``--fsdp``) or accelerate's
    environment asks for FSDP, and with one process (nothing to shard). ``ValueError`` for a sharding strategy
    that cannot apply."""
    env = os.environ if env is None else env
    if not (asked or env.get("ACCELERATE_USE_FSDP", "false").lower() == "true"):
        return None
    order = ("FSDP_RESHARD_AFTER_FORWARD", "FSDP_SHARDING_STRATEGY")  # FSDP1 configs name a sharding strategy
    if env.get("FSDP_VERSION", "2") == "1":
        order = order[::-1]
    strategy = next((env[k] for k in order if env.get(k)), "true").lower()
    if strategy in ("no_shard", "3"):
        return None
    if strategy not in _RESHARD:
        raise ValueError(
            f"accelerate's FSDP config asks for sharding strategy {strategy.upper()}: hf-cascade shards "
            "a head over all processes (FULL_SHARD, or SHARD_GRAD_OP to keep the gathered parameters "
            "until backward); hybrid sharding over several machines is not supported"
        )
    if processes < 2:
        return None
    offload = env.get("FSDP_OFFLOAD_PARAMS", "false").lower() == "true"
    return FsdpSettings(reshard_after_forward=_RESHARD[strategy], offload=offload)


@contextlib.contextmanager
def hidden_from_libraries(env=None):
    """A context in which accelerate's FSDP request (``ACCELERATE_USE_FSDP``) is out of the environment, put back
    after. Around the frozen target's loading: transformers, seeing it with accelerate's default
    ``cpu_ram_efficient_loading``, loads a model's weights in the first process only and leaves the others' to an
    FSDP broadcast that never comes for a target FSDP does not wrap (their weights stay uninitialised memory).
    Around building the ``Accelerator``: its FSDP plugin raises on a CPU, and FSDP here is this module's. A script
    of your own that loads the target under such a launch: load it in this context."""
    env = os.environ if env is None else env
    saved = env.pop("ACCELERATE_USE_FSDP", None)
    try:
        yield
    finally:
        if saved is not None:
            env["ACCELERATE_USE_FSDP"] = saved


def shard(step: torch.nn.Module, settings: FsdpSettings, device: torch.device) -> torch.nn.Module:
    """A copy of ``step`` (its head and loss), made the same in every process (the main process's values) and
    sharded over all processes on ``device``; the original is left whole and unchanged."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    work = copy.deepcopy(step)
    for tensor in work.state_dict().values():  # fully_shard keeps each process's own slice: start from one head
        dist.broadcast(tensor, src=0)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    offload = CPUOffloadPolicy() if settings.offload and device.type != "cpu" else OffloadPolicy()
    return fully_shard(work, mesh=mesh, reshard_after_forward=settings.reshard_after_forward, offload_policy=offload)


def no_sync(module: torch.nn.Module):
    """A context in which backward accumulates the gradient without reducing it (the micro-batches before a
    step's last), as DDP's ``no_sync``."""

    @contextlib.contextmanager
    def unsynced():
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)

    return unsynced()


def gather_into(sharded: torch.nn.Module, whole: torch.nn.Module) -> None:
    """Gather ``sharded``'s parameters (a collective: every process calls it) into ``whole``, its unsharded twin."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(sharded, options=StateDictOptions(full_state_dict=True))
    whole.load_state_dict(full)


def save(sharded: torch.nn.Module, opt: torch.optim.Optimizer, folder: Path) -> None:
    """Write the head's and the optimizer's shards into ``folder/sharded`` (every process writes its own)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(sharded, opt)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(Path(folder) / SHARDED))


def load(sharded: torch.nn.Module, opt: torch.optim.Optimizer, folder: Path) -> None:
    """Restore what :func:`save` wrote into ``sharded`` and ``opt``; ``ValueError`` when ``folder`` holds none (a
    checkpoint of a run without FSDP)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = Path(folder) / SHARDED
    if not path.is_dir():
        raise ValueError(f"--resume: {folder} was written by a run without FSDP; resume it without FSDP")
    model_state, optim_state = get_state_dict(sharded, opt)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(sharded, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


def layout(whole: torch.nn.Module, trained: torch.nn.Module, fsdp: bool) -> dict:
    """How the head trains, for ``trainer_state.json``: FSDP or not, the head's parameters and those this process
    holds (with FSDP its shards: about ``1 / N`` of them)."""
    here = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in trained.parameters())
    return {"fsdp": fsdp, "head_parameters": sum(p.numel() for p in whole.parameters()), "parameters_here": here}


def grad_scaler(device: torch.device):
    """fp16's gradient scaler for sharded gradients: it agrees over the processes on skipping a step."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    return ShardedGradScaler(device.type)


__all__ = [
    "FsdpSettings",
    "gather_into",
    "grad_scaler",
    "hidden_from_libraries",
    "layout",
    "load",
    "no_sync",
    "requested",
    "save",
    "shard",
]
