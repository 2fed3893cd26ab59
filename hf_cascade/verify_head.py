"""The target's verification head on CPU: a faster kernel, and only the rows greedy acceptance reads.

1. **Kernel.** Verifying ``k`` draft tokens makes the target compute logits for ``k + 1`` positions.
   For a tied 262k x 640 fp32 head (Gemma-3-270M: 671 MB) ``F.linear(h, W)`` with a few rows is
   several times slower than with one row on CPUs where the BLAS picks a poor kernel for a
   transposed, very wide right-hand side (measured on one machine: 1 row ~50 ms, 6 rows ~250-500 ms),
   where ``W @ h.T`` stays close to one pass over the weight (34 ms for 2 or 4 rows, 58 for 8), and a
   single row is faster as a 2-row product with a zero row (34 ms: the matrix-vector kernel ran on one
   thread of two). On another CPU ``F.linear`` was the faster for 1-4 rows (22.5 / 24.7 / 48.9 ms
   against 22.8 / 59 / 59), and a oneDNN product with the weight packed once
   (:class:`~hf_cascade.kernels.WeightPacker`, a second 671 MB copy) beat both from 2 rows on (22 / 23 /
   26 / 26 / 33 ms for 1 / 2 / 3 / 4 / 8 rows); on a third (AMD EPYC) ``F.linear`` took 63 / 140 / 114 ms
   for 1 / 2 / 8 rows and the compiled panel kernel (:mod:`hf_cascade.panel`, offered instead of
   oneDNN's where it builds) 13 / 13 / 22 ms. The head offers the candidates to the process-wide
   :class:`~hf_cascade.kernels.KernelTuner`, which keeps the fastest per row count.
2. **Rows.** Greedy acceptance in transformers' assisted loop reads rows ``0 .. n`` only (``n``: the
   accepted drafts; row ``n`` gives the bonus token); the rows after the first rejected draft are
   computed and thrown away. On the first machine above a call over 2-4 rows costs about what 1 row
   costs and 8-10 rows about twice that (the measurement behind :class:`~hf_cascade.tree.rows.TreeRows`),
   so a 10-token Max-Gram draft rejected at its second token paid twice for its head. With a
   :class:`GreedyPlan` (set by the candidate generator before each greedy verification) the head
   computes ``block_rows`` rows at a time (by default the largest block that costs at most 1.2 times
   one row on this machine, :func:`calibrate_block_rows`: 3 on the second machine above; 4 by the
   first's measurements; a last block of one row joins the one before), checks each row the way
   transformers will (the model's post-head transform, the generation's logits processors with the same ``input_ids`` prefix,
   argmax against the draft token), and stops after the first row that rejects its draft. Rows it
   did not compute are zeros: acceptance never reads them (they come after the first mismatch).

Safety of 2: the check must predict transformers' verdict exactly, otherwise a zero row could be
read. The plan is used only after :meth:`VerificationHead.validate` has seen the model's full,
processed logits of an earlier call of the same ``generate()`` equal (bit for bit) what the check
computes from the head's raw rows, and only with logits processors from transformers or hf_cascade
(pure functions of ``input_ids`` and scores; a user's custom processor could hold state). Sampling
never uses a plan (speculative sampling draws for every row first).

:func:`fast_verification_head` installs a :class:`VerificationHead` as the head's ``forward`` for
one assisted ``generate()`` call (the hook enters it, with the decoder linears of
:mod:`hf_cascade.verify_linear`, through :func:`~hf_cascade.verify_linear.fast_verification` around
transformers' ``_assisted_decoding``) and restores it afterwards; :func:`active_head` finds it from the model.
"""

from __future__ import annotations

import statistics
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LogitsProcessorList

from .kernels import TUNER, KernelTuner, left_product, shape_key
from .panel import copy_kernel
from .processors import process_positions


def logit_transform(model: nn.Module):
    """What ``model``'s forward applies to its head's output: Gemma-2/3's ``final_logit_softcapping``
    when set, else nothing (other transforms are caught by :meth:`VerificationHead.validate`)."""
    config = getattr(model, "config", None)
    cap = getattr(config.get_text_config(), "final_logit_softcapping", None) if config is not None else None
    if not cap:
        return lambda logits: logits
    return lambda logits: torch.tanh(logits / cap) * cap


def pure_processors(processors: LogitsProcessorList) -> bool:
    """Whether every processor comes from transformers or hf_cascade (stateless; safe to run twice)."""
    return all(type(p).__module__.split(".")[0] in ("transformers", "hf_cascade") for p in processors)


@dataclass
class GreedyPlan:
    """The next greedy verification: ``candidates`` ``[1, L + k]`` (``start = L``: the index of the
    first draft token), checked with ``processors`` after ``transform`` like transformers does."""

    candidates: torch.Tensor
    start: int
    processors: LogitsProcessorList
    transform: Callable[[torch.Tensor], torch.Tensor]

    @property
    def rows(self) -> int:
        return self.candidates.shape[1] - self.start + 1

    def process(self, i: int, raw: torch.Tensor) -> torch.Tensor:
        """``[V]`` row ``i`` as transformers' assisted loop processes it."""
        row = self.transform(raw[None, None].float())                     # [1, 1, V]
        return process_positions(self.processors, self.candidates, row, self.start + i)[0, 0]

    def accepts(self, i: int, raw: torch.Tensor) -> bool:
        """Whether greedy acceptance takes draft ``i`` given row ``i``'s raw logits."""
        return int(self.process(i, raw).argmax()) == int(self.candidates[0, self.start + i])


class VerificationHead:
    """The head's ``forward`` during one assisted call (see the module docstring).

    Attributes:
        rows_requested / rows_computed: rows asked for by the model and rows actually computed.
        validated: ``None`` until :meth:`validate` ran, then whether plans may be used.
    """

    def __init__(self, head: nn.Linear, block_rows: int = 4, tuner: KernelTuner | None = None):
        if int(block_rows) < 1:
            raise ValueError(f"block_rows must be >= 1, got {block_rows}")
        self.weight, self.bias = head.weight, head.bias
        self.tuner = tuner if tuner is not None else TUNER
        self.block_rows = int(block_rows)
        self.plan: GreedyPlan | None = None
        self.validated: bool | None = None
        self.last_raw: torch.Tensor | None = None   # [m, V] raw rows of the last call (for validate)
        self.rows_requested = 0
        self.rows_computed = 0

    def expect(self, plan: GreedyPlan | None) -> None:
        """Use ``plan`` for the next call (once), if validated."""
        self.plan = plan if self.validated else None

    def validate(self, plan: GreedyPlan, scores: torch.Tensor) -> bool | None:
        """Compare transformers' processed rows ``scores`` ``[1, k + 1, V]`` of the last call (made
        with ``plan``'s candidates) with the plan's check applied to the raw rows the head returned;
        plans are used from then on only if equal. ``None`` (still undecided) when the last call's
        rows do not line up with ``scores`` (e.g. a prefill that returned every position)."""
        raw = self.last_raw
        if raw is None or not raw.shape[0] == plan.rows == scores.shape[1]:
            return None                                                   # not comparable: undecided
        self.validated = pure_processors(plan.processors) and all(
            torch.equal(plan.process(i, raw[i]), scores[0, i].to(raw.device)) for i in range(plan.rows))
        return self.validated

    def __call__(self, x: torch.Tensor) -> torch.Tensor:              # x: [..., d]
        plan, self.plan = self.plan, None
        rows = x.reshape(-1, x.shape[-1])                                 # [m, d]
        m = rows.shape[0]
        self.rows_requested += m
        if plan is not None and x.shape[0] == 1 and plan.rows == m and m > 1:
            out, computed = self._lazy(rows, plan)
        else:
            out, computed = self._rows(rows), m
        self.rows_computed += computed
        self.last_raw = out
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

    def blocks(self, m: int) -> list[tuple[int, int]]:
        """Row ranges of the successive head calls for ``m`` rows: ``block_rows`` at a time, a last
        block of one row joined to the one before (a 5-row call costs less than a 4- and a 1-row call)."""
        b = self.block_rows
        edges = list(range(0, m, b)) + [m]
        if len(edges) > 2 and edges[-1] - edges[-2] == 1:
            del edges[-2]
        return list(zip(edges[:-1], edges[1:]))

    def _lazy(self, rows: torch.Tensor, plan: GreedyPlan) -> tuple[torch.Tensor, int]:
        """``[m, V]`` logits whose rows up to the first rejected draft are computed, and how many
        rows were (whole blocks)."""
        m = rows.shape[0]
        out = rows.new_empty(m, self.weight.shape[0])                     # [m, V]
        for start, end in self.blocks(m):
            out[start:end] = self._rows(rows[start:end])
            for i in range(start, end):
                if i == m - 1 or not plan.accepts(i, out[i]):
                    out[end:].zero_()                                     # rows acceptance never reads
                    return out, end
        return out, m


#: calibrated block sizes, by the head's shape key (one measurement per process and head shape)
_BLOCK_ROWS: dict[tuple, int] = {}


def calibrate_block_rows(vh: VerificationHead, sizes: tuple[int, ...] = (1, 2, 3, 4, 8), tolerance: float = 1.2,
                         default: int = 4, repeats: int = 5) -> int:
    """The largest of ``sizes`` whose head call (with the tuner's faster kernel) costs at most
    ``tolerance`` times a one-row call: once the tuner has chosen for every size (a few calls each),
    each size is timed ``repeats`` more times, sizes interleaved, and the medians compared (~1.5 s for
    Gemma-3-270M's head, once per process and head shape). The tuner's own exploration timings (three
    per kernel) were too noisy for this on a flat cost curve: on the AMD EPYC, where 1-8 rows cost
    20-23 ms, one process of two chose 4 rows instead of 8, and a call emitting 5-8 tokens then paid
    for a second head call (in-process A/B of ``MaxGram(corpus=...)``, time with blocks of 4 / of 8: 1.033
    and 1.057 in two runs; ``docs/results/verify-blocks-ab``). ``default`` when the tuner does not time (a
    forced kernel)."""
    if vh.tuner.force is not None:
        return default
    key = shape_key(vh.weight, 1)
    if key not in _BLOCK_ROWS:
        rows = {m: torch.randn(m, vh.weight.shape[1], dtype=vh.weight.dtype) for m in sizes}
        for m, x in rows.items():
            for _ in range(4 * max(vh.tuner.trials, 1)):
                if vh.tuner.seconds(shape_key(vh.weight, m)) is not None:
                    break
                vh._rows(x)
            if vh.tuner.seconds(shape_key(vh.weight, m)) is None:
                return default
        times: dict[int, list[float]] = {m: [] for m in sizes}
        for _ in range(repeats):
            for m, x in rows.items():
                t0 = vh.tuner.clock()
                vh._rows(x)
                times[m].append(vh.tuner.clock() - t0)
        cost = {m: statistics.median(t) for m, t in times.items()}
        _BLOCK_ROWS[key] = max(m for m in sizes if cost[m] <= tolerance * cost[sizes[0]])
    return _BLOCK_ROWS[key]


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
