"""CPU kernels for float32 targets: a verification backend (see :mod:`hf_cascade.backends`).

* :mod:`.kernels` -- the process-wide tuner that keeps the fastest product per weight shape and row
  count, and oneDNN's packed product;
* :mod:`.panel` -- a compiled few-row product over a copy of the weight in panels
  (``csrc/panel_linear.cpp``, built on first use per CPU kind);
* :mod:`.verify_linear` -- the decoder's linears through the tuner;
* :mod:`.verify_head` -- the output head through the tuner;
* :mod:`.head_block` -- the rows per head call that the core's row selection uses
  (:attr:`~hf_cascade.backends.VerifySession.block_rows`), priced over the steps a strategy verifies;
* :mod:`.argmax_screen` -- the head's exact argmax through an int8 copy of its weight (``csrc/screen.cpp``: its
  candidates, and an integer product where the CPU has AVX512-VNNI), for the rows greedy acceptance only compares
  (:attr:`~hf_cascade.backends.VerifySession.argmax_screen`).

They also speed up plain decoding on CPU::

    import hf_cascade
    with hf_cascade.cpu_kernels(model):
        out = model.generate(ids, max_new_tokens=128)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from .. import VerifySession, cpu_kernels_apply


@contextmanager
def cpu_kernels(model, kind: str | None = None) -> Iterator[VerifySession]:
    """Within the block, ``model``'s decoder linears and output head compute through the CPU kernels
    (restored on exit). Applies to float32 models on CPU only (``ValueError`` otherwise). ``kind``: the strategy
    whose call this is: its block of head rows is priced over its steps (:mod:`.head_block`; timed once per
    process at the first such call) and the session's ``record`` keeps the call's steps; ``None``: no pricing
    (plain decoding, training: blocks of the head's default)."""
    if not cpu_kernels_apply(model):
        raise ValueError("hf_cascade.cpu_kernels applies to float32 models on CPU only.")
    from .verify_head import active_head
    from .verify_linear import fast_verification

    with fast_verification(model):
        head = active_head(model)
        if head is None:
            yield VerifySession("cpu", 4, None)
            return
        screen = None
        if head.bias is None:
            from .argmax_screen import argmax_screen

            weight = head.weight

            def screen(rows: int, top_k: int | None = None):  # made and timed at first use
                return argmax_screen(weight, head, rows, top_k)

        if kind is None:
            yield VerifySession("cpu", head.block_rows, screen)
            return
        from .verify_head import calibrate_block_rows, record_steps

        with torch.inference_mode():  # the screen is made here, not at first use
            block = calibrate_block_rows(head, argmax_screen(weight) if screen is not None else None, kind)

        def record(drafted: list[int], accepted: list[int]) -> None:
            record_steps(head, kind, drafted, accepted)

        yield VerifySession("cpu", block, screen, record)


__all__ = ["cpu_kernels"]
