"""The target's decoder linears on CPU: a multi-token forward at about the price of a one-token one.

Verifying ``k`` draft tokens runs the target's decoder over ``k + 1`` positions, so every linear
layer multiplies ``[k + 1, d_in]`` rows by its ``[d_out, d_in]`` weight. On some CPUs ``F.linear(x, W)``
with 2-16 rows runs on one thread while ``W @ x.T`` (the weight as the left operand, split across
threads by its output rows) uses all: measured on one 2-core machine, all 126 linears of Gemma-3-270M
took ~24 ms for 1 row, ~35-47 ms for 2-4 rows with ``F.linear`` and ~17-26 ms with ``W @ x.T``, and
the decoder forward over 2 / 4 tokens went from ~79 / ~85 ms to ~45 / ~45 ms. On another 2-core
machine (AVX-512) the opposite held, and a oneDNN product with a weight packed once
(:class:`~hf_cascade.kernels.WeightPacker`) beat both from 4 rows on when the linears were timed alone
(19.5 ms for 4 rows against 22-27 and 30; inside the model's forward about even at 4 rows, ~3 ms less at
7-12), and a compiled kernel that reads a copy of the weight in panels (:mod:`hf_cascade.panel`) made the
decoder forward over 4 / 8 tokens 35.3 / 39.6 ms -> 28.7 / 34.5 ms; on a third (AMD EPYC, where MKL's
few-row kernels are slow) the panel kernel made the decoder over 1 / 2 / 4 / 8 tokens ~50 / 75-80 / 76 / 80 ms
(``F.linear``) -> ~28 / 23 / 27 / 33 ms. So :class:`RowsLinear` offers ``F.linear``, ``W @ x.T`` and one
copy-based kernel (``panel`` where it builds, else ``packed``) to the process-wide
:class:`~hf_cascade.kernels.KernelTuner`, which keeps the fastest per weight shape and row count.

:class:`RowsLinear` is installed as the ``forward`` of each plain ``nn.Linear`` of the target's
decoder for one assisted ``generate()`` (:func:`fast_decoder_linears`, entered with the output head
of :mod:`hf_cascade.verify_head` by :func:`fast_verification`). The kernels compute the same
products in a different order of accumulation, like any multi-token forward does against a one-token
one (logits differ from plain decoding's by ~1e-6, as verification logits always did). A single row
goes to the tuner only where a copy kernel exists (a verification of an empty draft, or a
``self:N`` drafter sharing the decoder); without one, and for more than ``max_rows`` rows (a long
prompt, where the usual kernel is as fast or faster), ``F.linear`` runs unchanged.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from .kernels import TUNER, KernelTuner, left_product, shape_key
from .panel import copy_kernel


class RowsLinear:
    """An ``nn.Linear``'s ``forward`` computing up to ``max_rows`` rows with the fastest of ``F.linear``,
    ``(W @ x.T).T`` (2 rows or more) and a product with a copy of the weight: the compiled ``panel``
    kernel (:mod:`hf_cascade.panel`) where it builds, else the packed oneDNN one
    (:func:`~hf_cascade.panel.copy_kernel`; ``tuner``'s choice, default: the process-wide one). A single
    row is offered to the tuner only where a copy kernel exists (``W @ x.T`` is no faster than
    ``F.linear`` for one row); without one it takes ``F.linear`` unchanged."""

    def __init__(self, linear: nn.Linear, max_rows: int = 64, tuner: KernelTuner | None = None):
        if int(max_rows) < 2:
            raise ValueError(f"max_rows must be >= 2, got {max_rows}")
        self.weight, self.bias = linear.weight, linear.bias
        self.max_rows = int(max_rows)
        self.tuner = tuner if tuner is not None else TUNER

    def __call__(self, x: torch.Tensor) -> torch.Tensor:                 # x: [..., d_in]
        rows = x.reshape(-1, x.shape[-1])                                  # [m, d_in]
        m = rows.shape[0]
        copy = copy_kernel(self.weight)                                    # panel, else packed, else None
        if not (2 if copy is None else 1) <= m <= self.max_rows:
            return F.linear(x, self.weight, self.bias)
        kernels = {"linear": lambda: F.linear(rows, self.weight, self.bias)}             # [m, d_out]
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
    head excluded: :mod:`hf_cascade.verify_head` has its own) computes through :class:`RowsLinear`.
    Subclasses (quantized or LoRA layers) and layers whose ``forward`` is already replaced are left
    alone. Yields how many layers were switched; restores them on exit."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    switched = [
        m for m in _decoder(model).modules()
        if type(m) is nn.Linear and m is not head and "forward" not in vars(m)
        and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32
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
    :func:`~hf_cascade.verify_head.fast_verification_head`, kernels chosen by ``tuner`` (default: the
    process-wide :data:`~hf_cascade.kernels.TUNER`). Yields whether either applied."""
    from .verify_head import fast_verification_head

    with ExitStack() as stack:
        switched = stack.enter_context(fast_decoder_linears(model, tuner=tuner))
        head = stack.enter_context(fast_verification_head(model, tuner=tuner))
        yield bool(switched) or head


__all__ = ["RowsLinear", "fast_decoder_linears", "fast_verification"]
