"""``output_scores`` / ``output_logits`` of a batched generation, as plain batched ``generate`` returns them.

Plain batched ``generate`` runs every row at every step until the last row stops, so its ``scores`` and
``logits`` are tuples of one ``[B, V]`` float32 tensor per generated column, and a row that stopped early still
has rows there: the target's logits after its own tokens followed by ``pad_token_id`` (the attention mask grows by
one for every row at every step, so those pads are attended and counted in positions), processed by the
generation's logits processors with the padded row as ``input_ids``.

The batched loop records each emitted token's rows as it accepts them (the verification's rows, as at batch 1).
A row that stopped before the longest is not run afterwards; its rows from its end on are computed once, after the
loop, by one forward of the target over that row's tokens and pads (:func:`tail_logits`): only when these outputs
are asked for, one forward per such row (no cache), its logits kept for the tail only.
"""

from __future__ import annotations

import inspect

import torch
from transformers import PreTrainedModel

from ..processors import process_positions


def tail_logits(target: PreTrainedModel, sequence: torch.Tensor, pad: int, width: int, longest: int) -> torch.Tensor:
    """``[longest - width, V]`` float32: the raw logits plain batched ``generate`` computes for a row after its end.

    ``sequence``: ``[longest]`` the row as returned (``pad`` left-padding columns, its tokens up to ``width``,
    then pad ids); the logits at columns ``width - 1 .. longest - 2`` predict columns ``width .. longest - 1``.
    The row's left padding is left out (masked in plain ``generate``; positions count the row's own tokens)."""
    n = longest - width
    ids = sequence[pad : longest - 1][None]
    kwargs = {"logits_to_keep": n} if "logits_to_keep" in inspect.signature(target.forward).parameters else {}
    logits = target(input_ids=ids, use_cache=False, **kwargs).logits[0, -n:]
    return logits.float()


def batch_outputs(
    target: PreTrainedModel, rows, sequences: torch.Tensor, width: int, scores: bool, logits: bool
) -> tuple[tuple | None, tuple | None]:
    """``(scores, logits)`` tuples over the generated columns, each ``[B, V]`` float32, for the rows (in batch
    order; each with ``pad``, ``width``, ``processors`` and its recorded ``scores`` / ``logits`` lists of
    ``[1, V]``) of ``sequences`` ``[B, longest]``; ``None`` for what was not asked."""
    longest = sequences.shape[1]
    per_row_scores, per_row_logits = [], []
    for b, row in enumerate(rows):
        own_scores, own_logits = list(row.scores), list(row.logits)
        if row.width < longest:
            tail = tail_logits(target, sequences[b], row.pad, row.width, longest)
            own_logits += list(tail[:, None])
            if scores:
                processed = process_positions(
                    row.processors, sequences[b : b + 1].to(tail.device), tail[None], row.width
                )
                own_scores += list(processed[0, :, None])
        per_row_scores.append(own_scores)
        per_row_logits.append(own_logits)
    steps = longest - width

    def collate(per_row: list[list[torch.Tensor]]) -> tuple:
        return tuple(torch.cat([r[t].float() for r in per_row], dim=0) for t in range(steps))

    return (collate(per_row_scores) if scores else None), (collate(per_row_logits) if logits else None)


def record_rows(wanted_scores: bool, wanted_logits: bool, rows, src: list[int]):
    """The processed and raw rows (``[1, V]`` each) that produced a step's new tokens (``src``: their rows in the
    verification), or ``None`` for what is not asked for."""
    processed = [rows[r][None] for r in src] if wanted_scores else None
    raw = [rows.raw(r)[None] for r in src] if wanted_logits else None
    return processed, raw


__all__ = ["batch_outputs", "record_rows", "tail_logits"]
