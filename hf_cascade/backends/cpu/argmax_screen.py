"""The output head's argmax (or top-k rows) without its float32 logits: an int8 screen with a proven error bound.

Greedy acceptance with no logits processor reads only the argmax of each row it walks
(:meth:`~hf_cascade.core.rows.TreeRows.argmax_block`). With a large vocabulary the head's float32 weight is the
largest the forward reads (Gemma-3-270M: 262k x 640, 671 MB per call): the call streams it from memory. The
screen streams an int8 copy instead (a quarter of the bytes; ``panel_linear_i8`` of ``csrc/panel_linear.cpp``:
row ``j`` is ``w~_j = a_j q_j``, ``q_j = round(w_j / a_j)`` in ``[-127, 127]``, ``a_j = max|w_j| / 127``; each
``q`` widened to float32 exactly, products and sums in float32, each sum multiplied by ``a_j`` once), then settles
the few rows of the vocabulary that can still be the argmax with their float32 weights.

**Why it is exact.** For a row ``x`` and output ``j`` let ``l_j`` be the float32 logit a float32 product
computes (any order of accumulation) and ``s_j`` the screen's. With ``g = K u / (1 - K u)`` (``K`` inputs,
``u = 2**-24``), the error of a float32 dot product is at most ``g sum_i |x_i v_i| <= g ||x|| ||v||``, and the
final multiplication by ``a_j`` adds at most ``u |a_j fl(x . q_j)| <= u (1 + g) ||x|| ||w~_j||``, so
``|l_j - s_j| <= ||x|| (||w_j - w~_j|| + g (||w_j|| + ||w~_j||) + u (1 + g) ||w~_j||) = ||x|| c_j``, with ``c_j``
computed once per weight from the very copy the kernel reads (in float64, then rounded up by 1%). Every ``j`` with
``s_j + ||x|| c_j`` below ``max_k (s_k - ||x|| c_k)`` has ``l_j`` below some ``l_k``: it is not the argmax. The
remaining candidates (on Gemma-3-270M's real rows: about 10, a few dozen at most) get their float32 logits, and the
argmax among them is the row's. Like every other row computation of the core (:mod:`hf_cascade.core.rows`), the
float32 logits of the candidates may differ from the model's own product in the order of accumulation only.
Why int8 and not bfloat16 (which the first version used): its bound is about 8 times wider, so several times
more candidates are settled in float32, but those are a few rows of the weight against a pass over all of it at
half the bytes; ``docs/cpu-kernels.md`` has both measured.

**Top-k rows for sampling.** The same bound gives every output that can be among a row's ``k`` largest logits:
those whose upper bound ``s_j + ||x|| c_j`` reaches the ``k``-th largest lower bound (each output left out is
strictly below the row's ``k``-th largest logit). :meth:`ArgmaxScreen.top` returns their float32 logits and
``-inf`` elsewhere. A top-``k`` filter (``TopKLogitsWarper``, alone or after a positive temperature) sets every
output below the ``k``-th largest to ``-inf``, so the filtered row is the full row's, and so is everything
computed after it (top-p, min-p, the softmax acceptance samples from): sampling is exact, not approximated.
transformers applies ``top_k=50`` unless told otherwise, so this is the common sampling case
(:func:`hf_cascade.processors.screen_top_k` decides; a repetition penalty before the filter rules it out).

It applies to a bias-free ``nn.Linear`` head in float32 on CPU (the backend's :class:`~.verify_head.VerificationHead`),
with no ``output_scores`` / ``output_logits``: greedy with no logits processor (the argmax alone, or top-k rows
for a drafter that reads the rows only through their top candidates:
:attr:`~hf_cascade.core.strategy.TreeDrafter.rows_top_k`), or sampling with a top-k filter first (the rows are then
read in full, as the processed rows they are). The core decides (:func:`hf_cascade.core.loop._screen`). It costs an
int8 copy of the weight (a quarter of its memory), and is used only where it is measured faster than the
head's own product on the running machine, per use and size of call (:func:`argmax_screen`).
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch

from ...timing import interleaved_medians
from .panel import extension

#: float32 unit roundoff
_U = 2.0 ** -24


class ArgmaxScreen:
    """``screen(x)``: the argmax of each row of ``x @ weight.T`` (``[k, K]`` float32 rows -> ``k`` host ints),
    through the int8 screen of the module docstring."""

    def __init__(self, weight: torch.Tensor):
        ext = extension()
        if ext is None or not hasattr(ext, "panel_linear_i8"):
            raise RuntimeError("the panel kernel is not built on this machine")
        if weight.dtype != torch.float32 or weight.dim() != 2 or weight.device.type != "cpu":
            raise ValueError(f"ArgmaxScreen needs a 2-D float32 CPU weight, got {tuple(weight.shape)} {weight.dtype}")
        self.weight = weight
        self.panels, self.scale = ext.pack_panels_i8(weight.contiguous())    # [P, K, 16] int8, [P * 16]
        n, k = weight.shape
        g = k * _U / (1 - k * _U)
        margin = []
        for p0 in range(0, self.panels.shape[0], 1024):                     # float64 per chunk, not per weight
            q = self.panels[p0: p0 + 1024]
            rows = slice(p0 * 16, min(n, (p0 + q.shape[0]) * 16))
            copy = (q.double() * self.scale[p0 * 16: (p0 + q.shape[0]) * 16].double().view(-1, 1, 16))
            copy = copy.transpose(1, 2).reshape(-1, k)[: rows.stop - rows.start]     # w~_j, in row order
            w = weight[rows].double()
            margin.append((w - copy).norm(dim=1) + g * (w.norm(dim=1) + copy.norm(dim=1))
                          + _U * (1 + g) * copy.norm(dim=1))
        self.margin = (torch.cat(margin) * 1.01).float()                     # [N] c_j, rounded up
        self.candidates = 0                                                  # float32 rows computed (statistics)
        self.faster: dict[tuple[int, bool], bool] = {}     # (rows per call: a power of two, top-k use) -> faster

    def __call__(self, x: torch.Tensor) -> list[int]:
        """The argmax of each row (host ints): the top ``k = 1`` below."""
        x, rows = self._candidates(x, 1)
        return [int(ids[exact.argmax()]) for ids, exact in rows]

    def top(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """``[m, N]`` float32: each row's logits at every output that can be among its ``k`` largest (a superset of
        them), ``-inf`` at every other. An output left out is strictly below the row's ``k``-th largest logit, so
        after a top-``k`` filter (``TopKLogitsWarper``, alone or after a temperature) this row is the full row's."""
        x, rows = self._candidates(x, k)
        out = torch.full((x.shape[0], self.weight.shape[0]), float("-inf"), dtype=torch.float32, device=x.device)
        for i, (ids, exact) in enumerate(rows):
            out[i, ids] = exact
        return out

    def _candidates(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Per row, the outputs whose upper bound reaches the ``k``-th largest lower bound, and their float32 logits."""
        x = x.float().contiguous()
        ext = extension()
        screen = ext.panel_linear_i8(x, self.panels, self.scale, self.weight.shape[0])      # [m, N]
        norm = (x.norm(dim=1) * 1.0001).contiguous()                                     # ||x||, rounded up
        rows = []
        for row, ids in zip(x, ext.screen_candidates(screen, norm, self.margin, int(k))):   # reach ||x|| c_j
            self.candidates += ids.numel()
            rows.append((ids, torch.nn.functional.linear(row[None], self.weight.index_select(0, ids))[0]))
        return x, rows


#: id(weight) -> (its version when made, its screen or None); an entry goes with its weight
_SCREENS: dict[int, tuple[int, ArgmaxScreen | None]] = {}


def argmax_screen(weight: torch.Tensor, against: Callable[[torch.Tensor], torch.Tensor] | None = None,
                  rows: int = 4, top_k: int | None = None, repeats: int = 5) -> ArgmaxScreen | None:
    """The process-wide screen of ``weight`` (made on first use, made again after an in-place update of the
    weight), or ``None`` where the kernel is not built or, with ``against`` (the head's own product,
    ``[m, K] -> [m, N]``), where a call over ``rows`` rows is not measured faster than ``against`` (plus an
    argmax; with ``top_k``: :meth:`ArgmaxScreen.top` against the logits alone) on this machine (medians of
    ``repeats`` interleaved calls). The screen's float32 work grows with the rows while the head's stays bound by
    reading its weight, so the answer depends on ``rows``: it is decided once per weight, use and power of two of
    rows (:attr:`ArgmaxScreen.faster`), where a call first asks for it."""
    entry = _SCREENS.get(id(weight))
    if entry is None or entry[0] != weight._version:
        if entry is None:
            weakref.finalize(weight, _SCREENS.pop, id(weight), None)
        try:
            screen = ArgmaxScreen(weight)
        except RuntimeError:
            screen = None
        entry = _SCREENS[id(weight)] = (weight._version, screen)
    screen = entry[1]
    if screen is None or against is None:
        return screen
    key = (1 << max(int(rows) - 1, 0).bit_length(), top_k is not None)      # rows rounded up to a power of two
    if key not in screen.faster:
        screen.faster[key] = _faster(screen, against, weight, key[0], top_k, repeats)
    return screen if screen.faster[key] else None


def _faster(screen: ArgmaxScreen, against, weight: torch.Tensor, rows: int, top_k: int | None, repeats: int) -> bool:
    x = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(0)) * 50
    counted = screen.candidates
    if top_k is None:
        uses = {"screen": lambda: screen(x), "head": lambda: against(x).argmax(dim=-1).tolist()}
    else:
        uses = {"screen": lambda: screen.top(x, top_k), "head": lambda: against(x)}
    with torch.inference_mode():
        seconds = interleaved_medians(uses, repeats)                  # the first round warms both up
    screen.candidates = counted                                        # the timing's rows are not the generation's
    return seconds["screen"] < seconds["head"]


__all__ = ["ArgmaxScreen", "argmax_screen"]
