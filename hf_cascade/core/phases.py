"""The work each phase does for one row, shared by both loops: :func:`~hf_cascade.core.loop.speculative_decode`
(one row) and :func:`~hf_cascade.core.batch.speculative_decode_batch` (a left-padded batch, these functions once per
row). A row is a :class:`Row` in both; at batch 1 it has no padding (``pad == 0``, ``full`` is its sequence).

* **prefill** -- :func:`keep_last` (the target computes the last position's logits only) and :func:`checked_head`
  (the core's output head, where it reproduces the model's logits on the prompt).
* **draft** -- :meth:`Row.step_state`: what the row's drafter sees (:class:`~hf_cascade.core.strategy.TreeStep`);
  :func:`draft_row`: its draft, pruned to what the row can emit.
* **accept** -- :func:`accept_row`: greedy, or exact speculative sampling.
* **update** -- :func:`emit`: the accepted path's tokens and the bonus token, emitted up to where plain decoding
  stops; the row's sequence, scores, logits, last hidden state and statistics.

What still differs between the loops, and why (each loop's docstring has the details):

* **verify** -- both return a :class:`~hf_cascade.core.rows.Verified` (:func:`~hf_cascade.core.rows.verified`, the one
  place that reads hidden states or full logits). One row's inputs are
  :func:`~hf_cascade.core.attention.row_inputs`: a chain with plain causal attention and
  no mask, a tree with a mask over the row's own columns; a batch needs per-row positions and one additive mask
  ``[B, 1, N, T + N]`` over padding and holes (:func:`~hf_cascade.core.attention.batch_tree_allowed`), a mask
  built and read by attention at every step, which one row does without.
* **the cache** -- one row keeps its accepted path in place (:func:`~hf_cascade.core.forward.keep_path`) and its
  cache stays dense; a batch keeps each row's columns with holes, gathers, drops finished rows and compacts
  (:mod:`hf_cascade.core.batch_state`). Static caches: :class:`~hf_cascade.core.static.StaticSlots` at batch 1,
  the same slots inside :class:`~hf_cascade.core.static.StaticBatch` for a batch (both opened by
  :func:`~hf_cascade.core.compiled.open_slots`).
* **who drafts** -- at batch 1 the drafter's own policy; in a batch the
  :class:`~hf_cascade.core.payoff.DraftGate` picks the rows that draft and how wide (rows ahead ride along).
* **outputs** -- one row streams and returns its cache; a batch pads rows to the longest and computes the tail
  scores of rows that stopped early (:mod:`hf_cascade.core.outputs`).

So one row does not run yet as a batch of one: the batch's verification builds its positions and mask on the host at
every step, and its cache update gathers columns, where a single dense row needs neither. The way to one loop is a
batch whose verification and cache update, at one row without padding or holes, are batch 1's (:func:`row_inputs
<hf_cascade.core.attention.row_inputs>`, :func:`keep_path <hf_cascade.core.forward.keep_path>`), and whose draft
gate (which takes plain steps to measure them) leaves a lone row's drafter to its own policy, as batch 1 does.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from transformers import LogitsProcessorList

from ..placement import HOST, upload
from .accept import TreeAcceptance, greedy_tree_accept, path_list, sampling_tree_accept
from .forward import output_head
from .outputs import record_rows
from .rows import TreeRows
from .stopping import Stopper, prune_tree
from .strategy import TreeDrafter, TreeStep
from .structure import TokenTree


@dataclass
class Row:
    """One sequence: its padded sequence on the device (``full``), its own tokens on the host, its drafter,
    stopper and statistics, and (in a batch) the cache columns it owns (ascending; their positions are
    ``0 .. length - 2``)."""

    index: int
    pad: int
    full: torch.Tensor
    tokens: list[int]
    drafter: TreeDrafter
    stopper: Stopper
    stats: object
    processors: LogitsProcessorList = field(default_factory=LogitsProcessorList)
    cols: list[int] = field(default_factory=list)
    last_hidden: torch.Tensor | None = None
    step: int = 0
    draft_seconds: float | None = None  # its drafter's wall time per draft (a batch)
    scores: list[torch.Tensor] = field(default_factory=list)  # [1, V] per emitted token, when asked for
    logits: list[torch.Tensor] = field(default_factory=list)

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def width(self) -> int:
        return self.pad + len(self.tokens)

    @property
    def seq(self) -> torch.Tensor:
        return self.full[self.pad :] if self.pad else self.full

    def step_state(self, cache, verify_seconds: float | None, verify_nodes: int | None = None) -> TreeStep:
        """What the drafter sees: its sequence, ``cache`` (the target's, or ``None``), its budget (the deepest
        useful draft) and the last verification's time and width (``None`` before the second)."""
        later = self.step > 1
        return TreeStep(
            self.seq,
            cache,
            self.last_hidden,
            budget=max(self.stopper.max_length - self.width - 1, 0),
            step=self.step,
            tokens=self.tokens,
            verify_seconds=verify_seconds if later else None,
            verify_nodes=verify_nodes if later else None,
        )


def draft_row(row: Row, state: TreeStep) -> tuple[TokenTree, torch.Tensor | None]:
    """The row's drafter's tree for ``state``, pruned to what the row can emit (depth below ``state.budget``,
    nothing below a stop token: :func:`~hf_cascade.core.stopping.prune_tree`)."""
    tree, q = row.drafter.draft_tree(state.seq, state)
    return prune_tree(tree, q, state.budget, row.stopper.stop_set)


def keep_last(target) -> dict:
    """The forward's keyword that computes the last position's logits only, where the model has it."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(target.forward).parameters else {}


def checked_head(target, hidden: torch.Tensor, logits: torch.Tensor):
    """The core's output head (:func:`~hf_cascade.core.forward.output_head`) where it reproduces ``logits`` from
    ``hidden`` (``[R, H]``, ``[R, V]``: the prefill's last rows); else ``None`` (the full model computes rows)."""
    head = output_head(target)
    if head is None:
        return None
    rows = head(hidden)
    if rows.shape == logits.shape and torch.allclose(rows.float(), logits.float(), rtol=1e-4, atol=1e-4):
        return head
    return None


def accept_row(
    do_sample: bool, tree: TokenTree, rows: TreeRows, q: torch.Tensor | None, batched: bool | None = None
) -> TreeAcceptance:
    """Greedy: the longest path the target's argmax agrees with. Sampling: recursive rejection sampling (exact for
    any ``q``, point masses included; ``batched``: :func:`~hf_cascade.core.accept.sampling_tree_accept`'s)."""
    if do_sample:
        return sampling_tree_accept(tree, rows.softmax(), q, batched=batched)
    return greedy_tree_accept(tree, rows)


class Emitted(NamedTuple):
    """What a step emitted for one row."""

    path: list[int]  #: the accepted nodes (host ints)
    new: list[int]  #: the path's tokens and the bonus token
    src: list[int]  #: the verification row that produced each of ``new`` (0: the root's)
    count: int  #: how many of ``new`` are emitted (plain decoding stops after the last)
    finished: bool  #: the row is done


def emit(
    row: Row,
    tree: TokenTree,
    acceptance: TreeAcceptance,
    rows: TreeRows,
    hidden: torch.Tensor | None,
    scores: bool,
    logits: bool,
) -> Emitted:
    """Append the accepted path's tokens and the bonus token to ``row`` up to where plain decoding stops (its
    :class:`~hf_cascade.core.stopping.Stopper`; criteria see the new tokens' score rows), with their score and
    logit rows where asked for; ``hidden``: the verification's hidden states of this row (``None``: none), its
    last emitted token's becomes :attr:`Row.last_hidden`. Records the step in the row's statistics. The cache is
    the caller's (one row and a batch keep their K/V differently)."""
    path = path_list(acceptance)  # host ints: no read
    new = [tree.token_list[i] for i in path] + [int(acceptance.bonus)]
    src = [0] + [i + 1 for i in path]
    appended = torch.cat([row.full, upload(torch.tensor(new, dtype=row.full.dtype, device=HOST), row.full.device)])
    processed, raw = record_rows(scores, logits, rows, src)
    seen = tuple(row.scores + processed) if processed is not None else None
    count, finished = row.stopper.emitted(appended, row.width, new, seen)
    if processed is not None:
        row.scores += processed[:count]
    if raw is not None:
        row.logits += raw[:count]
    row.full = appended if count == len(new) else appended[: row.width + count]
    row.tokens = row.tokens + new[:count]
    row.last_hidden = hidden[src[count - 1]] if hidden is not None else None
    row.stats.record_step(
        tree.num_nodes, *tree.shape(row.drafter.linear), path, count, rows.rows_computed, max(rows.head_calls, 1)
    )
    row.step += 1
    return Emitted(path, new, src, count, finished)


__all__ = ["Emitted", "Row", "accept_row", "checked_head", "draft_row", "emit", "keep_last"]
