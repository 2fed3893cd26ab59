"""The target's output head on CPU: the fastest of several equivalent products, per row count.

Verification makes the target compute logits for a few rows at once (the root and some drafted
tokens). With a large vocabulary the head's weight is the largest one the forward reads, and which
product reads it fastest for a handful of rows depends on the CPU and its BLAS: ``F.linear(h, W)``,
``W @ h.T`` (the weight as the left operand; a single row as a 2-row product with a zero row, for
BLAS whose matrix-vector kernel runs on one thread), or a product with a copy of the weight (the
compiled ``panel`` kernel of :mod:`hf_cascade.backends.cpu.panel` where it builds, else oneDNN's packed
one of :class:`~hf_cascade.backends.cpu.kernels.WeightPacker`). No one choice is fastest everywhere, so
:class:`VerificationHead` offers them all to the process-wide
:class:`~hf_cascade.backends.cpu.kernels.KernelTuner`, which keeps the fastest per row count. The products
differ from the model's own only in the order of accumulation, as any multi-row forward does.

Which rows to compute is the core's decision, not the head's: :class:`~hf_cascade.core.rows.TreeRows`
computes only the rows acceptance reads, at most ``block_rows`` per head call. The backend supplies
that block size (:class:`~hf_cascade.backends.VerifySession`): :func:`calibrate_block_rows` prices it over
the steps the strategy verifies (:mod:`.head_block`).

:func:`fast_verification_head` installs a :class:`VerificationHead` as the head's ``forward`` (entered
with the decoder linears by :func:`~hf_cascade.backends.cpu.verify_linear.fast_verification`) and restores
it afterwards; :func:`active_head` finds it from the model. Measurements: ``docs/cpu-kernels.md``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from . import head_block
from .head_block import rows_input
from .kernels import TUNER, KernelTuner, left_product, shape_key
from .panel import copy_kernel


class VerificationHead:
    """The head's ``forward`` while the CPU kernels are engaged: the same logits as ``F.linear``,
    computed with the tuner's choice of kernel. ``block_rows``: the rows per head call where no strategy
    prices its own (:func:`calibrate_block_rows`)."""

    def __init__(self, head: nn.Linear, block_rows: int = 4, tuner: KernelTuner | None = None):
        if int(block_rows) < 1:
            raise ValueError(f"block_rows must be >= 1, got {block_rows}")
        self.weight, self.bias = head.weight, head.bias
        self.tuner = tuner if tuner is not None else TUNER
        self.block_rows = int(block_rows)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., d]
        out = self._rows(x.reshape(-1, x.shape[-1]))  # [m, V]
        return out.reshape(*x.shape[:-1], self.weight.shape[0])

    def _rows(self, rows: torch.Tensor) -> torch.Tensor:  # [m, d] -> [m, V]
        kernels = {"linear": lambda: F.linear(rows, self.weight, self.bias)}
        if rows.shape[0] == 1:
            # one row as a 2-row product (the padding row is discarded): where the matrix-vector
            # kernel runs on one thread, two rows on two threads are faster than one row
            kernels["pad2"] = lambda: left_product(self.weight, torch.cat([rows, torch.zeros_like(rows)]), self.bias)[
                :1
            ]
        else:
            kernels["rows"] = lambda: left_product(self.weight, rows, self.bias)
        copy = copy_kernel(self.weight)  # panel, else packed, else None
        if copy is not None:
            kernels[copy.kernel] = lambda: copy.product(self.weight, rows, self.bias)
        return self.tuner.run(shape_key(self.weight, rows.shape[0]), kernels)


def calibrate_block_rows(vh: VerificationHead, screen=None, kind: str = "", default: int = 4, repeats: int = 5) -> int:
    """The block for the next call of strategy ``kind`` on this head (:mod:`.head_block`): the size of
    :data:`~.head_block.SIZES` with the least expected head cost over ``kind``'s steps in this process (a prior
    before any), each size's cost the cheaper of the head's (the tuner's chosen kernel) and ``screen``'s (an
    :class:`~hf_cascade.backends.cpu.argmax_screen.ArgmaxScreen` of the head, or ``None``), timed once per process
    and head shape once the tuner has chosen a kernel for every size, pooled with the last processes' rounds.
    ``default`` when the tuner does not time (a forced kernel) or has not chosen for every size."""
    if vh.tuner.force is not None:
        return default
    key = shape_key(vh.weight, 1)
    costs = head_block.costs_of(key)
    if costs is None:  # timed once per process and head shape
        rows = rows_input(vh.weight.shape[1], vh.weight.dtype)
        for m, x in rows.items():  # the tuner's choice first (a few calls each)
            for _ in range(4 * max(vh.tuner.trials, 1)):
                if vh.tuner.seconds(shape_key(vh.weight, m)) is not None:
                    break
                vh._rows(x)
            if vh.tuner.seconds(shape_key(vh.weight, m)) is None:
                return default
        calls = {
            m: [lambda x=x: vh._rows(x)] + ([lambda x=x: screen(x)] if screen is not None else [])
            for m, x in rows.items()
        }
        label = "output-head block" + (" or screen" if screen is not None else "")
        costs = head_block.call_costs(key, calls, label, vh.tuner.clock, repeats)
    return head_block.choose(key, kind, costs)


def record_steps(vh: VerificationHead, kind: str, drafted: list[int], accepted: list[int]) -> None:
    """Keep one call's steps of ``kind`` on this head (:func:`~.head_block.record_steps`)."""
    head_block.record_steps(shape_key(vh.weight, 1), kind, drafted, accepted)


def calibrated_block_rows() -> list[dict]:
    """The blocks :func:`calibrate_block_rows` chose in this process, per head shape, thread count and strategy kind
    (the last call's; a run's record)."""
    return head_block.chosen_blocks()


def active_head(model: nn.Module) -> VerificationHead | None:
    """The :class:`VerificationHead` installed on ``model`` by :func:`fast_verification_head`, if any."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    forward = vars(head).get("forward") if head is not None else None
    return forward if isinstance(forward, VerificationHead) else None


@contextmanager
def fast_verification_head(
    model: nn.Module, min_vocab: int = 32768, block_rows: int = 4, tuner: KernelTuner | None = None
) -> Iterator[bool]:
    """Within the block, ``model``'s output head is a :class:`VerificationHead` (``block_rows``: its default
    block; a strategy's session prices its own, :func:`calibrate_block_rows`).

    Applies only to an ``nn.Linear`` head on CPU in float32 with at least ``min_vocab`` rows;
    yields whether it applied.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    applies = (
        isinstance(head, nn.Linear)
        and head.weight.device.type == "cpu"
        and head.weight.dtype == torch.float32
        and head.weight.shape[0] >= min_vocab
        and "forward" not in vars(head)
    )
    if not applies:
        yield False
        return
    vh = VerificationHead(head, block_rows, tuner)
    head.forward = vh
    try:
        yield True
    finally:
        del head.forward
