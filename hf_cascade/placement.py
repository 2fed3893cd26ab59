"""Where drafters and heads run, and how to time a device.

Users run targets on GPUs in bf16/fp16, often dispatched with ``device_map="auto"`` (layers on several
devices), and pull drafters and heads from the Hub in whatever dtype they were saved in (usually fp32).
The rule applied at bind (once per ``generate()`` call, by each assistant's ``bind``):

* a drafter or head runs on the device of the target's **input embeddings** (where the tokens enter
  the target; under ``device_map`` that is where its first layers are) and in the embeddings' dtype
  (the dtype of the hidden states the target computes in): :func:`target_device_dtype`;
* only floating-point parameters and persistent buffers are cast; integer buffers (vocabulary subsets)
  keep their dtype, non-persistent float buffers (rotary ``inv_freq``, which transformers computes in
  float32 whatever the model's dtype) keep theirs and only move; modules listed in a model's
  ``_keep_in_fp32_modules`` stay float32;
* a module dispatched by accelerate (``hf_device_map`` / ``_hf_hook``: the user placed it on purpose)
  is left where it is, and so is every module when the assistant was built with ``Loading(place=False)``.
  Whatever crosses devices then is moved explicitly where it is used (reviews run on the reviewer's
  device, tokens handed to the target move to the target's device).

:func:`place_like` is idempotent and cheap when the module is already placed (one pass over its tensors'
metadata, no copy). :func:`synchronize` waits for a device's queued work: what a clock read that times
device work must do first (on a GPU, kernels run asynchronously: without it a timer measures the launch).
:func:`upload` moves a host-built tensor to a device without waiting for it (pinned memory on CUDA).
"""

from __future__ import annotations

import fnmatch

import torch
from torch import nn

__all__ = [
    "DEFER_READS",
    "HOST",
    "accelerators",
    "defer_reads",
    "execution_device",
    "is_dispatched",
    "place_like",
    "synchronize",
    "target_device_dtype",
    "upload",
]

#: The host: where host-built tensors are made (``torch.tensor(..., device=HOST)``), whatever the default device.
HOST = torch.device("cpu")

#: The accelerator schedule: drafting loops defer their reads and verification computes every row in one head call
#: (:func:`hf_cascade.backends.default_session`). ``None`` (default) decides by device (:func:`defer_reads`); ``True`` /
#: ``False`` force it (tests and ``bench --overhead`` run the GPU schedule on a CPU).
DEFER_READS: bool | None = None


def defer_reads(device: torch.device | str) -> bool:
    """Whether a drafting loop on ``device`` should defer its host reads: on an accelerator every ``.item()``,
    ``int(t)``, ``.tolist()`` waits for the queued work, so a loop drafts its ``k`` tokens on the device and
    reads them once (then cuts the draft where its stop rules say; the forwards past that point are the
    price, against ``k`` synchronisations). On a CPU reads are free and a loop stops as early as it can."""
    if DEFER_READS is not None:
        return bool(DEFER_READS)
    return torch.device(device).type != "cpu"


def execution_device(module: nn.Module) -> torch.device | None:
    """The device accelerate runs ``module`` on (its ``_hf_hook``'s ``execution_device``), or ``None``."""
    hook = getattr(module, "_hf_hook", None)
    hooks = list(getattr(hook, "hooks", None) or ([hook] if hook is not None else []))
    for h in hooks:
        device = getattr(h, "execution_device", None)
        if device is not None:
            return torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    return None


def is_dispatched(module: nn.Module) -> bool:
    """Whether accelerate placed ``module`` (``device_map`` dispatch, offload): ``hf_device_map`` with
    more than one entry or an ``_hf_hook`` on the module or one of its submodules."""
    device_map = getattr(module, "hf_device_map", None)
    if isinstance(device_map, dict) and len(set(map(str, device_map.values()))) > 1:
        return True
    return any(vars(m).get("_hf_hook") is not None for m in module.modules())  # an instance attribute (no __getattr__)


def target_device_dtype(target: nn.Module) -> tuple[torch.device, torch.dtype]:
    """``(device, dtype)`` of ``target``'s input embeddings: where token ids enter it and the dtype its
    hidden states are computed in (not ``model.dtype``, the first parameter's, which under mixed
    dtypes or ``device_map`` can be another one). Offloaded embeddings (``meta`` weights) report their
    accelerate execution device."""
    get = getattr(target, "get_input_embeddings", None)
    emb = get() if get is not None else None
    weight = getattr(emb, "weight", None)
    if isinstance(weight, torch.Tensor):
        device = weight.device
        if device.type == "meta":
            device = execution_device(emb) or execution_device(target) or device
        return device, weight.dtype
    for p in target.parameters():
        return p.device, p.dtype
    return torch.device("cpu"), torch.get_default_dtype()


def _fp32_names(module: nn.Module) -> list[str]:
    keep = getattr(module, "_keep_in_fp32_modules", None) or []
    return [str(k) for k in keep]


def _kept_fp32(name: str, patterns: list[str]) -> bool:
    parts = name.split(".")
    return any(p in parts or fnmatch.fnmatch(name, f"*{p}*") for p in patterns)


def _tensors(module: nn.Module):
    """``(owner, name, full_name, tensor, kind)`` for every parameter and buffer, ``kind`` in
    ``{"param", "buffer", "transient"}`` (non-persistent buffer)."""
    for prefix, m in module.named_modules():
        for name, p in m._parameters.items():
            if p is not None:
                yield m, name, f"{prefix}.{name}" if prefix else name, p, "param"
        transient = getattr(m, "_non_persistent_buffers_set", set())
        for name, b in m._buffers.items():
            if b is not None:
                yield m, name, f"{prefix}.{name}" if prefix else name, b, "transient" if name in transient else "buffer"


def _wanted(
    t: torch.Tensor, kind: str, full_name: str, device, dtype, fp32: list[str]
) -> tuple[torch.device, torch.dtype]:
    want = t.dtype
    if t.is_floating_point() and kind != "transient":
        want = torch.float32 if fp32 and _kept_fp32(full_name, fp32) else dtype
    return device, want


def place_like(
    module: nn.Module,
    target: nn.Module | None = None,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """Move ``module`` (a drafter or a draft head) to ``target``'s input-embedding device and cast its
    floating-point weights to their dtype (see the module docstring for what is cast); in place, returns
    ``module``. ``device`` / ``dtype`` override the target's. A module dispatched by accelerate is left
    alone. Already placed: no copy, nothing changes (safe to call at every ``generate()``)."""
    if is_dispatched(module):
        return module
    if target is not None:
        t_device, t_dtype = target_device_dtype(target)
        device = t_device if device is None else device
        dtype = t_dtype if dtype is None else dtype
    if device is None and dtype is None:
        return module
    device = torch.device(device) if device is not None else None
    fp32 = _fp32_names(module)
    shared: dict[int, torch.Tensor] = {}  # one converted tensor per source tensor (tied weights)
    with torch.no_grad():
        for owner, name, full_name, t, kind in list(_tensors(module)):
            want_device, want_dtype = _wanted(t, kind, full_name, device or t.device, dtype or t.dtype, fp32)
            if t.device == want_device and t.dtype == want_dtype:
                continue
            if t.device.type == "meta":
                raise ValueError(
                    f"{type(module).__name__}.{full_name} is on the meta device (not loaded): "
                    "load the drafter's weights before generating with it."
                )
            key = id(t)
            if key not in shared:
                shared[key] = t.to(device=want_device, dtype=want_dtype)
            new = shared[key]
            if kind == "param":
                owner._parameters[name] = (
                    nn.Parameter(new, requires_grad=t.requires_grad) if not isinstance(new, nn.Parameter) else new
                )
                shared[key] = owner._parameters[name]
            else:
                owner._buffers[name] = new
    return module


def accelerators(module: nn.Module) -> tuple[torch.device, ...]:
    """The accelerator devices ``module`` computes on: its parameters' (under ``device_map``, several) and, for
    offloaded input embeddings, accelerate's execution device (:func:`target_device_dtype`); empty on a CPU.
    What :func:`synchronize` must wait for before a clock read that times ``module``'s work (found once, not at
    every read)."""
    devices = {p.device for p in module.parameters()} | {target_device_dtype(module)[0]}
    return tuple(sorted((d for d in devices if d.type not in ("cpu", "meta")), key=str))


def upload(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``host`` (a tensor built on the host) on ``device``, in one copy that does not wait for the device where it
    can: on CUDA from pinned memory with ``non_blocking=True`` (the pinned block is held by torch's caching host
    allocator until the copy is done, so ``host`` may be dropped at once); elsewhere an ordinary move (on a CPU, no
    copy at all). The rule of a decoding step: what it builds on the host reaches the device through here, packed into
    as few tensors as it can (:mod:`hf_cascade.core.forward`), never through a blocking ``.to(device)`` /
    ``torch.tensor(..., device=...)``."""
    device = torch.device(device)
    staged, pinned = _pinned(host, device)
    return staged.to(device, non_blocking=pinned)


def _pinned(host: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, bool]:
    """``(host in pinned memory, True)`` where a copy to ``device`` from there is asynchronous (CUDA); else
    ``(host, False)``."""
    if device.type != "cuda":
        return host, False
    return (host if host.is_pinned() else host.pin_memory()), True


def synchronize(device: torch.device | str | nn.Module | None = None) -> None:
    """Wait until ``device``'s queued work is done (CUDA, XPU, MPS; a no-op on CPU). A module: every
    device its parameters live on. ``None``: the current accelerator, if any. Call before reading a
    clock that times device work."""
    if isinstance(device, nn.Module):
        for d in {p.device for p in device.parameters()}:
            synchronize(d)
        return
    if device is None:
        if torch.cuda.is_available():
            synchronize(torch.device("cuda"))
        if hasattr(torch, "xpu") and torch.xpu.is_available():
            synchronize(torch.device("xpu"))
        if torch.backends.mps.is_available():
            synchronize(torch.device("mps"))
        return
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "xpu" and hasattr(torch, "xpu"):
        torch.xpu.synchronize(device)
    elif device.type == "mps" and hasattr(torch, "mps"):
        torch.mps.synchronize()
