"""The target's decoder linears on CPU: a multi-token forward at about the price of a one-token one.

Verifying ``k`` draft tokens runs the target's decoder over ``k + 1`` positions, so every linear
layer multiplies ``[k + 1, d_in]`` rows by its ``[d_out, d_in]`` weight. Which product does that
fastest depends on the CPU and its BLAS (on some, ``F.linear`` with a few rows runs on one thread
while ``W @ x.T`` splits the weight's output rows across all; on others the opposite holds, or a
product with a copy of the weight beats both). So :class:`RowsLinear` offers ``F.linear``, ``W @ x.T``
and one copy-based kernel (``panel`` where it builds, else ``packed``) to the process-wide
:class:`~hf_cascade.backends.cpu.kernels.KernelTuner`, which keeps the fastest per weight shape and row count.

:class:`RowsLinear` is installed as the ``forward`` of each plain ``nn.Linear`` of the target's
decoder while the CPU kernels are engaged (:func:`fast_decoder_linears`, entered with the output head
of :mod:`hf_cascade.backends.cpu.verify_head` by :func:`fast_verification`). The kernels compute the same
products in a different order of accumulation, like any multi-token forward does against a one-token
one. A single row goes to the tuner only where a copy kernel exists (a verification of an empty
draft, a ``self:N`` drafter sharing the decoder, or plain decoding inside
:func:`hf_cascade.cpu_kernels`); without one, and for more than ``max_rows`` rows (a long prompt,
where the usual kernel is as fast or faster), ``F.linear`` runs unchanged. Measurements:
``docs/cpu-kernels.md``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from .kernels import TUNER, KernelTuner, left_product, shape_key
from .panel import copy_kernel


class RowsLinear:
    """An ``nn.Linear``'s ``forward`` computing up to ``max_rows`` rows with the fastest of ``F.linear``,
    ``(W @ x.T).T`` (2 rows or more) and a product with a copy of the weight: the compiled ``panel``
    kernel (:mod:`hf_cascade.backends.cpu.panel`) where it builds, else the packed oneDNN one
    (:func:`~hf_cascade.backends.cpu.panel.copy_kernel`; ``tuner``'s choice, default: the process-wide one). A single
    row is offered to the tuner only where a copy kernel exists (``W @ x.T`` is no faster than
    ``F.linear`` for one row); without one it takes ``F.linear`` unchanged."""

    def __init__(self, linear: nn.Linear, max_rows: int = 64, tuner: KernelTuner | None = None):
        if int(max_rows) < 2:
            raise ValueError(f"max_rows must be >= 2, got {max_rows}")
        self.weight, self.bias = linear.weight, linear.bias
        self.max_rows = int(max_rows)
        self.tuner = tuner if tuner is not None else TUNER

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., d_in]
        rows = x.reshape(-1, x.shape[-1])  # [m, d_in]
        m = rows.shape[0]
        copy = copy_kernel(self.weight)  # panel, else packed, else None
        if not (2 if copy is None else 1) <= m <= self.max_rows:
            return F.linear(x, self.weight, self.bias)
        kernels = {"linear": lambda: F.linear(rows, self.weight, self.bias)}  # [m, d_out]
        if m > 1:
            kernels["rows"] = lambda: left_product(self.weight, rows, self.bias).contiguous()
        if copy is not None:
            kernels[copy.kernel] = lambda: copy.product(self.weight, rows, self.bias)
        out = self.tuner.run(shape_key(self.weight, m), kernels)
        return out.reshape(*x.shape[:-1], self.weight.shape[0])


def _decoder(model: nn.Module) -> nn.Module:
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if get_decoder is not None else None
    return decoder if isinstance(decoder, nn.Module) else model


@contextmanager
def fast_decoder_linears(model: nn.Module, max_rows: int = 64, tuner: KernelTuner | None = None) -> Iterator[int]:
    """Within the block, every plain ``nn.Linear`` of ``model``'s decoder on CPU in float32 (the output
    head excluded: :mod:`hf_cascade.backends.cpu.verify_head` has its own) computes through :class:`RowsLinear`.
    Subclasses (quantized or LoRA layers) and layers whose ``forward`` is already replaced are left
    alone. Yields how many layers were switched; restores them on exit."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    switched = [
        m
        for m in _decoder(model).modules()
        if type(m) is nn.Linear
        and m is not head
        and "forward" not in vars(m)
        and m.weight.device.type == "cpu"
        and m.weight.dtype == torch.float32
    ]
    for m in switched:
        m.forward = RowsLinear(m, max_rows, tuner)
    try:
        yield len(switched)
    finally:
        for m in switched:
            del m.forward


@contextmanager
def fast_verification(model: nn.Module, tuner: KernelTuner | None = None) -> Iterator[bool]:
    """The target's CPU kernels for one assisted call: :func:`fast_decoder_linears` and
    :func:`~hf_cascade.backends.cpu.verify_head.fast_verification_head`, kernels chosen by ``tuner`` (default: the
    process-wide :data:`~hf_cascade.backends.cpu.kernels.TUNER`). Yields whether either applied."""
    from .verify_head import fast_verification_head

    with ExitStack() as stack:
        switched = stack.enter_context(fast_decoder_linears(model, tuner=tuner))
        head = stack.enter_context(fast_verification_head(model, tuner=tuner))
        yield bool(switched) or head


__all__ = ["RowsLinear", "fast_decoder_linears", "fast_verification"]
