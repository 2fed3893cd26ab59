"""The output head's argmax without its float32 logits: a bfloat16 screen with a proven error bound.

Greedy acceptance with no logits processor reads only the argmax of each row it walks
(:meth:`~hf_cascade.core.rows.TreeRows.argmax_block`). With a large vocabulary the head's float32 weight is the
largest the forward reads (Gemma-3-270M: 262k x 640, 671 MB per call): the call streams it from memory. The
screen streams a bfloat16 copy instead (half the bytes; ``panel_linear_bf16`` of ``csrc/panel_linear.cpp``: each
weight widened to float32 exactly, products and sums in float32), then settles the few rows of the vocabulary
that can still be the argmax with their float32 weights.

**Why it is exact.** For a row ``x`` and output ``j`` let ``l_j`` be the float32 logit a float32 product
computes (any order of accumulation) and ``s_j`` the screen's. With ``w~_j`` the bfloat16 copy of ``w_j`` and
``g = K u / (1 - K u)`` (``K`` inputs, ``u = 2**-24``), the error of a float32 dot product is at most
``g sum_i |x_i w_ji| <= g ||x|| ||w_j||``, so
``|l_j - s_j| <= ||x|| (||w_j - w~_j|| + g (||w_j|| + ||w~_j||)) = ||x|| c_j``, with ``c_j`` computed once per
weight (in float64, then rounded up by 1%). Every ``j`` with ``s_j + ||x|| c_j`` below ``max_k (s_k - ||x|| c_k)``
has ``l_j`` below some ``l_k``: it is not the argmax. The remaining candidates (on Gemma-3-270M's real rows:
1-2 typically, 7 at most in a sample of 144) get their float32 logits, and the argmax among them is the row's.
Like every other row computation of the core (:mod:`hf_cascade.core.rows`), the float32 logits of the
candidates may differ from the model's own product in the order of accumulation only.

It applies to a bias-free ``nn.Linear`` head in float32 on CPU (the backend's :class:`~.verify_head.VerificationHead`),
under greedy decoding with no logits processor, no ``output_scores`` / ``output_logits`` and a drafter that does
not read the rows (:attr:`~hf_cascade.core.strategy.TreeDrafter.reads_rows`): the core decides
(:func:`hf_cascade.core.loop.speculative_decode`). It costs a bfloat16 copy of the weight (half its memory), and
is used only where it is measured faster than the head's own product on the running machine (:func:`argmax_screen`).
"""

from __future__ import annotations

import statistics
import time
import weakref
from typing import Callable

import torch

from .panel import extension

#: float32 unit roundoff
_U = 2.0 ** -24


class ArgmaxScreen:
    """``screen(x)``: the argmax of each row of ``x @ weight.T`` (``[k, K]`` float32 rows -> ``k`` host ints),
    through the bfloat16 screen of the module docstring."""

    def __init__(self, weight: torch.Tensor):
        ext = extension()
        if ext is None or not hasattr(ext, "panel_linear_bf16"):
            raise RuntimeError("the panel kernel is not built on this machine")
        if weight.dtype != torch.float32 or weight.dim() != 2 or weight.device.type != "cpu":
            raise ValueError(f"ArgmaxScreen needs a 2-D float32 CPU weight, got {tuple(weight.shape)} {weight.dtype}")
        self.weight = weight
        self.panels = ext.pack_panels_bf16(weight.contiguous())
        n, k = weight.shape
        g = k * _U / (1 - k * _U)
        margin = []
        for rows in weight.split(16384):                                     # float64 per chunk, not per weight
            w, rounded = rows.double(), rows.to(torch.bfloat16).double()
            margin.append((w - rounded).norm(dim=1) + g * (w.norm(dim=1) + rounded.norm(dim=1)))
        self.margin = (torch.cat(margin) * 1.01).float()                     # [N] c_j, rounded up
        self.candidates = 0                                                  # float32 rows computed (statistics)

    def __call__(self, x: torch.Tensor) -> list[int]:
        x = x.float().contiguous()
        screen = extension().panel_linear_bf16(x, self.panels, self.weight.shape[0])           # [k, N]
        reach = (x.norm(dim=1, keepdim=True) * 1.0001) * self.margin                       # [k, N] ||x|| c_j
        floor = (screen - reach).max(dim=1, keepdim=True).values                          # [k, 1]
        maybe = screen + reach >= floor                                                   # [k, N] candidates
        out = []
        for row, mask in zip(x, maybe):
            ids = mask.nonzero().flatten()
            self.candidates += ids.numel()
            exact = torch.nn.functional.linear(row[None], self.weight.index_select(0, ids))[0]
            out.append(int(ids[exact.argmax()]))
        return out


#: id(weight) -> (its version when decided, its screen or None); an entry goes with its weight
_SCREENS: dict[int, tuple[int, ArgmaxScreen | None]] = {}


def argmax_screen(weight: torch.Tensor, against: Callable[[torch.Tensor], torch.Tensor] | None = None,
                  rows: int = 4, repeats: int = 5) -> ArgmaxScreen | None:
    """The process-wide screen of ``weight`` (made on first use, made again after an in-place update of the
    weight), or ``None`` where the kernel is not built or, with ``against`` (the head's own product,
    ``[k, K] -> [k, N]``), where the screen of ``rows`` rows is not measured faster than ``against`` plus an
    argmax on this machine (medians of ``repeats`` interleaved calls; decided once per weight)."""
    entry = _SCREENS.get(id(weight))
    if entry is not None and entry[0] == weight._version:
        return entry[1]
    if entry is None:
        weakref.finalize(weight, _SCREENS.pop, id(weight), None)
    try:
        screen = ArgmaxScreen(weight)
    except RuntimeError:
        screen = None
    if screen is not None and against is not None and not _faster(screen, against, weight, rows, repeats):
        screen = None
    _SCREENS[id(weight)] = (weight._version, screen)
    return screen


def _faster(screen: ArgmaxScreen, against, weight: torch.Tensor, rows: int, repeats: int) -> bool:
    x = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(0)) * 50
    times: dict[str, list[float]] = {"screen": [], "head": []}
    with torch.inference_mode():
        for _ in range(repeats + 1):                                   # the first round warms both up
            for name, run in (("screen", lambda: screen(x)), ("head", lambda: against(x).argmax(dim=-1).tolist())):
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    screen.candidates = 0
    return statistics.median(times["screen"][1:]) < statistics.median(times["head"][1:])


__all__ = ["ArgmaxScreen", "argmax_screen"]
