"""The target's verification head on CPU: a faster kernel, and only the rows greedy acceptance reads.

1. **Kernel.** Verifying ``k`` draft tokens makes the target compute logits for ``k + 1`` positions.
   For a tied 262k x 640 fp32 head (Gemma-3-270M: 671 MB) ``F.linear(h, W)`` with a few rows is
   several times slower than with one row on CPUs where the BLAS picks a poor kernel for a
   transposed, very wide right-hand side (measured here: 1 row ~50 ms, 6 rows ~250-500 ms).
   ``W @ h.T`` computes the same products with the weight as the left operand and stays close to
   one pass over the weight. A single row is computed as a 2-row product with a zero row: the
   matrix-vector kernel uses one thread (measured here with 2 threads: 52 ms for one row, 34 ms for
   two, 34 ms for four, 58 for eight, 118 for twelve).
2. **Rows.** Greedy acceptance in transformers' assisted loop reads rows ``0 .. n`` only (``n``: the
   accepted drafts; row ``n`` gives the bonus token); the rows after the first rejected draft are
   computed and thrown away. Here a ``W @ h.T`` call over 2-4 rows costs about what 1 row costs and
   8-10 rows about twice that (the measurement behind :class:`~hf_cascade.tree.rows.TreeRows`), so a
   10-token Max-Gram draft rejected at its second token pays twice for its head. With a
   :class:`GreedyPlan` (set by the candidate generator before each greedy verification) the head
   computes ``block_rows`` rows at a time (a last block of one row joins the one before), checks each row the way transformers will (the model's
   post-head transform, the generation's logits processors with the same ``input_ids`` prefix,
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

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LogitsProcessorList

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

    def __init__(self, head: nn.Linear, block_rows: int = 4):
        if int(block_rows) < 1:
            raise ValueError(f"block_rows must be >= 1, got {block_rows}")
        self.weight, self.bias = head.weight, head.bias
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
        if rows.shape[0] == 1:
            if torch.get_num_threads() == 1:
                return F.linear(rows, self.weight, self.bias)
            # one row as a 2-row product: the matrix-vector kernel runs on one thread (here 52 ms
            # against 34 ms for two rows on two threads); the padding row is discarded
            out = (self.weight @ torch.cat([rows, torch.zeros_like(rows)]).T).T[:1]
        else:
            out = (self.weight @ rows.T).T
        return out + self.bias if self.bias is not None else out

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


def active_head(model: nn.Module) -> VerificationHead | None:
    """The :class:`VerificationHead` installed on ``model`` by :func:`fast_verification_head`, if any."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    forward = vars(head).get("forward") if head is not None else None
    return forward if isinstance(forward, VerificationHead) else None


@contextmanager
def fast_verification_head(model: nn.Module, min_vocab: int = 32768, block_rows: int = 4) -> Iterator[bool]:
    """Within the block, ``model``'s output head is a :class:`VerificationHead`.

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
    head.forward = VerificationHead(head, block_rows)
    try:
        yield True
    finally:
        del head.forward
