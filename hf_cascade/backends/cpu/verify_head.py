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
that block size (:class:`~hf_cascade.backends.VerifySession`): :func:`calibrate_block_rows` picks the
largest block whose call costs about what a one-row call costs on this machine.

:func:`fast_verification_head` installs a :class:`VerificationHead` as the head's ``forward`` (entered
with the decoder linears by :func:`~hf_cascade.backends.cpu.verify_linear.fast_verification`) and restores
it afterwards; :func:`active_head` finds it from the model. Measurements: ``docs/cpu-kernels.md``.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ...profile_rounds import keep_rounds, kept_rounds, rounds_to_measure, store_key
from ...timing import interleaved_medians, median_ratios
from .kernels import TUNER, KernelTuner, left_product, shape_key
from .panel import copy_kernel


class VerificationHead:
    """The head's ``forward`` while the CPU kernels are engaged: the same logits as ``F.linear``,
    computed with the tuner's choice of kernel. ``block_rows``: the most rows per head call that cost
    about one row's call (read by the backend's session; default 4, else :func:`calibrate_block_rows`)."""

    def __init__(self, head: nn.Linear, block_rows: int = 4, tuner: KernelTuner | None = None):
        if int(block_rows) < 1:
            raise ValueError(f"block_rows must be >= 1, got {block_rows}")
        self.weight, self.bias = head.weight, head.bias
        self.tuner = tuner if tuner is not None else TUNER
        self.block_rows = int(block_rows)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:              # x: [..., d]
        out = self._rows(x.reshape(-1, x.shape[-1]))                     # [m, V]
        return out.reshape(*x.shape[:-1], self.weight.shape[0])

    def _rows(self, rows: torch.Tensor) -> torch.Tensor:               # [m, d] -> [m, V]
        kernels = {"linear": lambda: F.linear(rows, self.weight, self.bias)}
        if rows.shape[0] == 1:
            # one row as a 2-row product (the padding row is discarded): where the matrix-vector
            # kernel runs on one thread, two rows on two threads are faster than one row
            kernels["pad2"] = lambda: left_product(self.weight, torch.cat([rows, torch.zeros_like(rows)]), self.bias)[:1]
        else:
            kernels["rows"] = lambda: left_product(self.weight, rows, self.bias)
        copy = copy_kernel(self.weight)                                   # panel, else packed, else None
        if copy is not None:
            kernels[copy.kernel] = lambda: copy.product(self.weight, rows, self.bias)
        return self.tuner.run(shape_key(self.weight, rows.shape[0]), kernels)


#: calibrated block sizes, by the head's shape key (one measurement per process and head shape)
_BLOCK_ROWS: dict[tuple, int] = {}


def calibrate_block_rows(vh: VerificationHead, sizes: tuple[int, ...] = (1, 2, 3, 4, 8), tolerance: float = 1.2,
                         default: int = 4, repeats: int = 5) -> int:
    """The largest of ``sizes`` whose head call (with the tuner's chosen kernel) costs at most
    ``tolerance`` times a one-row call, measured once per process and head shape (cached).

    Once the tuner has chosen a kernel for every size (a few calls each), each size is timed ``repeats``
    more times after one discarded round, in symmetric rounds (:func:`~hf_cascade.timing.interleaved_medians`: a
    machine that speeds up or slows down during a round, e.g. as another process starts, would otherwise favour the
    sizes timed last), and the medians compared: the tuner's own exploration timings are
    too few for this where the cost curve is flat, and a block chosen too small makes a step that
    emits more tokens pay for a second head call. Each size's cost over one row's is pooled with the last
    processes' on this machine (:mod:`hf_cascade.profile_rounds`, per-size median), so that one process's
    neighbour does not choose the block for it (under ``HF_CASCADE_PROFILE_ROUNDS=reuse``, once enough are kept,
    they alone choose it, untimed). ``default`` when the tuner does not time (a forced
    kernel) or has not chosen for every size.
    """
    if vh.tuner.force is not None:
        return default
    key = shape_key(vh.weight, 1)
    if key not in _BLOCK_ROWS:
        filed = store_key(("output-head block", *key.weight, key.threads), {"sizes": list(sizes), "repeats": repeats})
        kept = kept_rounds(filed)
        new = []
        if rounds_to_measure(len(kept)):                           # none under HF_CASCADE_PROFILE_ROUNDS=reuse
            rows = {m: torch.randn(m, vh.weight.shape[1], dtype=vh.weight.dtype) for m in sizes}
            for m, x in rows.items():
                for _ in range(4 * max(vh.tuner.trials, 1)):
                    if vh.tuner.seconds(shape_key(vh.weight, m)) is not None:
                        break
                    vh._rows(x)
                if vh.tuner.seconds(shape_key(vh.weight, m)) is None:
                    return default
            cost = interleaved_medians({m: (lambda x=x: vh._rows(x)) for m, x in rows.items()}, repeats, warmup=1,
                                       symmetric=True, clock=vh.tuner.clock)
            new = [{m: cost[m] / cost[sizes[0]] for m in sizes}]
            keep_rounds(filed, new)
        pooled = median_ratios(kept + new)                        # with the last processes' (hf_cascade.profile_rounds)
        _BLOCK_ROWS[key] = max(m for m in sizes if pooled[m] <= tolerance)
    return _BLOCK_ROWS[key]


def calibrated_block_rows() -> list[dict]:
    """The blocks :func:`calibrate_block_rows` chose in this process, per head shape and thread count (a run's
    record: the choice is timed once per process, and every method of the process shares it)."""
    return [{"weight": list(key.weight[0]), "threads": key.threads, "block_rows": rows}
            for key, rows in _BLOCK_ROWS.items()]


def active_head(model: nn.Module) -> VerificationHead | None:
    """The :class:`VerificationHead` installed on ``model`` by :func:`fast_verification_head`, if any."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    forward = vars(head).get("forward") if head is not None else None
    return forward if isinstance(forward, VerificationHead) else None


@contextmanager
def fast_verification_head(model: nn.Module, min_vocab: int = 32768, block_rows: int | None = None,
                           tuner: KernelTuner | None = None) -> Iterator[bool]:
    """Within the block, ``model``'s output head is a :class:`VerificationHead` (``block_rows``:
    ``None`` = :func:`calibrate_block_rows`).

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
    vh = VerificationHead(head, block_rows if block_rows is not None else 4, tuner)
    if block_rows is None:
        with torch.inference_mode():
            vh.block_rows = calibrate_block_rows(vh)
    head.forward = vh
    try:
        yield True
    finally:
        del head.forward
