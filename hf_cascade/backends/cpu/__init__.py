"""CPU kernels for float32 targets: a verification backend (see :mod:`hf_cascade.backends`).

* :mod:`.kernels` -- the process-wide tuner that keeps the fastest product per weight shape and row
  count, and oneDNN's packed product;
* :mod:`.panel` -- a compiled few-row product over a copy of the weight in panels
  (``csrc/panel_linear.cpp``, built on first use per CPU kind);
* :mod:`.verify_linear` -- the decoder's linears through the tuner;
* :mod:`.verify_head` -- the output head through the tuner, and the calibrated number of rows per head
  call that the core's row selection uses (:attr:`~hf_cascade.backends.VerifySession.block_rows`);
* :mod:`.argmax_screen` -- the head's exact argmax through an int8 copy of its weight (``csrc/screen.cpp``: its
  candidates, and an integer product where the CPU has AVX512-VNNI), for the rows greedy acceptance only compares (:attr:`~hf_cascade.backends.VerifySession.argmax_screen`).

They also speed up plain decoding on CPU::

    import hf_cascade
    with hf_cascade.cpu_kernels(model):
        out = model.generate(ids, max_new_tokens=128)
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from .. import VerifySession, cpu_kernels_apply


@contextmanager
def cpu_kernels(model) -> Iterator[VerifySession]:
    """Within the block, ``model``'s decoder linears and output head compute through the CPU kernels
    (restored on exit). Applies to float32 models on CPU only (``ValueError`` otherwise)."""
    if not cpu_kernels_apply(model):
        raise ValueError("hf_cascade.cpu_kernels applies to float32 models on CPU only.")
    from .verify_head import active_head
    from .verify_linear import fast_verification

    with fast_verification(model):
        head = active_head(model)
        screen = None
        if head is not None and head.bias is None:
            from .argmax_screen import argmax_screen

            weight = head.weight

            def screen(rows: int, top_k: int | None = None):              # made and timed at first use
                return argmax_screen(weight, head, rows, top_k)
        yield VerifySession("cpu", head.block_rows if head is not None else 4, screen)


__all__ = ["cpu_kernels"]
