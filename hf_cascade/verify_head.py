"""A faster verification head for CPU targets with large vocabularies.

Verifying ``k`` draft tokens makes the target compute logits for ``k + 1`` positions. For a tied
262k x 640 fp32 head (Gemma-3-270M: 671 MB) ``F.linear(h, W)`` with a few rows is several times
slower than with one row on CPUs where the BLAS picks a poor kernel for a transposed, very wide
right-hand side (measured here: 1 row ~50 ms, 6 rows ~250-500 ms). ``W @ h.T`` computes the same
products with the weight as the left operand and stays close to one pass over the weight.

:func:`fast_verification_head` swaps the head's ``forward`` for the duration of one assisted
``generate()`` call (the hook enters it around transformers' ``_assisted_decoding``) and restores it
afterwards. Single-row calls keep ``F.linear`` untouched. Both paths compute the same dot products
in float32; only the order of floating-point accumulation can differ, as it already does between
transformers' own one-row and multi-row forwards.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn


def _head_forward(head: nn.Linear):
    weight, bias = head.weight, head.bias

    def forward(x: torch.Tensor) -> torch.Tensor:                      # x: [..., d]
        rows = x.reshape(-1, x.shape[-1])                                 # [m, d]
        if rows.shape[0] == 1:
            return F.linear(x, weight, bias)
        out = (weight @ rows.T).T                                         # [m, V]
        if bias is not None:
            out = out + bias
        return out.reshape(*x.shape[:-1], weight.shape[0])

    return forward


@contextmanager
def fast_verification_head(model: nn.Module, min_vocab: int = 32768) -> Iterator[bool]:
    """Within the block, ``model``'s output head uses ``W @ h.T`` for multi-row inputs.

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
    head.forward = _head_forward(head)
    try:
        yield True
    finally:
        del head.forward
