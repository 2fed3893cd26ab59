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

**The integer product** (where the kernel is built with AVX512-VNNI: ``panel_screen_vnni`` of
``csrc/screen.cpp``). The widened-float product spends several instructions per weight on widening and
multiplying; past a row or two it is bound by arithmetic, not by reading the copy. The integer product
quantizes the row too, per group of ``G = 64`` inputs: ``x~_i = round(x_i / b_g)`` in ``[-127, 127]``, ``b_g =
max |x_i| / 127`` over the group (per group, because a hidden state's largest coordinates are far above its
others: one scale per row would make the bound below several times wider), multiplies bytes exactly in int32 per
group, sums the groups in float32 with their ``b_g``, and multiplies by ``a_j`` once. With ``t = b x~`` (the row
the kernel multiplies, exactly), ``|x . w_j - t . w~_j| <= ||x|| ||w_j - w~_j|| + ||x - t|| ||w~_j||``, and the
float32 sum over ``n_g`` groups and the final product add at most ``(g_n (1 + u) + u) ||t|| ||w~_j||`` (``g_n =
n_g u / (1 - n_g u)``; each group's integer sum is exact, and so is its conversion: below ``2**24``). So
``|l_j - s_j| <= ||x|| c_j + (||x - t|| + (g_n (1 + u) + u) ||t||) ||w~_j||``: the same ``c_j``, plus a second
term per row (computed in float64 from the very ``t`` the kernel reads, rounded up) times ``||w~_j||`` (rounded up
by 1%). On Gemma-3-270M's rows the candidates are a few dozen per row instead of about 10; the pass reads the
same bytes with a quarter of the instructions. The screen times both products once, where both are built, and
keeps the faster (:attr:`ArgmaxScreen.product`), dropping the other's copy.

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
read in full, as the processed rows they are). The core decides (:func:`hf_cascade.core.head_input.screen_heads`). It
costs an int8 copy of the weight (a quarter of its memory), and is used only where it is measured faster than the
head's own product on the running machine, per use and size of call (:func:`argmax_screen`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from ...timing import interleaved_medians
from .panel import extension

#: float32 unit roundoff
_U = 2.0**-24


#: inputs per group of the integer product's quantized row (module docstring)
GROUP = 64


class ArgmaxScreen:
    """``screen(x)``: the argmax of each row of ``x @ weight.T`` (``[k, K]`` float32 rows -> ``k`` host ints),
    through the int8 screen of the module docstring. ``product``: ``"float"`` (the widened int8 product),
    ``"integer"`` (AVX512-VNNI builds only) or ``None``: the faster of the two built here, timed once over 4 rows."""

    def __init__(self, weight: torch.Tensor, product: str | None = None):
        ext = extension()
        if ext is None or not hasattr(ext, "panel_linear_i8"):
            raise RuntimeError("the panel kernel is not built on this machine")
        if weight.dtype != torch.float32 or weight.dim() != 2 or weight.device.type != "cpu":
            raise ValueError(f"ArgmaxScreen needs a 2-D float32 CPU weight, got {tuple(weight.shape)} {weight.dtype}")
        if product not in (None, "float", "integer"):
            raise ValueError(f"product must be 'float', 'integer' or None, got {product!r}")
        if product == "integer" and not hasattr(ext, "panel_screen_vnni"):
            raise RuntimeError("the integer screen product needs a build with AVX512-VNNI")
        self.weight = weight
        self.panels, self.scale = ext.pack_panels_i8(weight.contiguous())  # [P, K, 16] int8, [P * 16]
        k = weight.shape[1]
        g = k * _U / (1 - k * _U)
        diff, norm, copy_norm = ext.screen_norms(weight, self.panels, self.scale).unbind(1)  # float64, per row
        margin = diff + g * (norm + copy_norm) + _U * (1 + g) * copy_norm
        self.margin = (margin * 1.01).float()  # [N] c_j, rounded up
        self.copy_norm = (copy_norm * 1.01).float()  # [N] ||w~_j||, rounded up
        self.candidates = 0  # float32 rows computed (statistics)
        self.faster: dict[tuple[int, bool], bool] = {}  # (rows per call: a power of two, top-k use) -> faster
        self.product, self.vnni = "float", None  # the integer copy where built
        if product != "float" and hasattr(ext, "panel_screen_vnni"):
            self._pack_integer()
            self.product = product or _faster_product(self)
            if self.product == "integer":
                self.panels = None  # one copy is kept
            else:
                self.vnni = self.qsum = None

    def _pack_integer(self) -> None:
        """The int8 copy in the integer product's layout: ``[P, Kp / 4, 64]`` (four inputs of each of a panel's 16
        outputs per 64 bytes, inputs padded with zeros to ``Kp``, a multiple of :data:`GROUP`) and each group's
        sum of ``q`` per output, ``[P, G, 16]`` int32."""
        self.padded = -(-self.panels.shape[1] // GROUP) * GROUP
        self.vnni, self.qsum = extension().pack_vnni(self.panels, GROUP)  # [P, Kp / 4, 64], [P, G, 16]

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

    def screen_logits(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``x`` ``[m, K]`` float32 -> (screen logits ``[m, N]``, the rows' second bound term or ``None``): every
        logit ``l_j`` of row ``i`` is within ``||x_i|| margin_j (+ term_i copy_norm_j)`` of its screen logit."""
        ext = extension()
        if self.product == "float":
            return ext.panel_linear_i8(x, self.panels, self.scale, self.weight.shape[0]), None
        m, K = x.shape
        groups = torch.nn.functional.pad(x, (0, self.padded - K)).view(m, -1, GROUP)
        b = groups.abs().amax(dim=2, keepdim=True) / 127
        b = torch.where(b > 0, b, torch.ones_like(b))  # float32 b_g
        q = torch.round(groups / b).clamp_(-127, 127)  # x~, exact small integers
        t = (q.double() * b.double()).view(m, -1)[:, :K]  # the row the kernel multiplies
        n_g = b.shape[1]
        g_n = n_g * _U / (1 - n_g * _U)
        term = (x.double() - t).norm(dim=1) + (g_n * (1 + _U) + _U) * t.norm(dim=1)
        u = (q + 128).to(torch.uint8).view(m, -1)
        y = ext.panel_screen_vnni(
            u, b.view(m, -1).contiguous(), self.vnni, self.qsum, self.scale, self.weight.shape[0], GROUP
        )
        return y, (term * 1.0001).float().contiguous()

    def _candidates(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Per row, the outputs whose upper bound reaches the ``k``-th largest lower bound, and their float32 logits."""
        x = x.float().contiguous()
        screen, term = self.screen_logits(x)  # [m, N]
        norm = (x.norm(dim=1) * 1.0001).contiguous()  # ||x||, rounded up
        second = (term, self.copy_norm) if term is not None else (None, None)
        rows = []
        for row, ids in zip(x, extension().screen_candidates(screen, norm, self.margin, int(k), *second)):
            self.candidates += ids.numel()
            rows.append((ids, torch.nn.functional.linear(row[None], self.weight.index_select(0, ids))[0]))
        return x, rows


def _faster_product(screen: ArgmaxScreen, rows: int = 4, repeats: int = 5) -> str:
    """The faster of the screen's two products over ``rows`` rows on this machine (interleaved medians)."""
    x = torch.randn(rows, screen.weight.shape[1], generator=torch.Generator().manual_seed(0)) * 50
    uses = {}
    for product in ("float", "integer"):

        def use(product=product):
            screen.product = product
            screen.screen_logits(x)

        uses[product] = use
    with torch.inference_mode():
        seconds = interleaved_medians(uses, repeats)
    return min(seconds, key=seconds.get)


#: id(weight) -> (its version when made, its screen or None); an entry goes with its weight
_SCREENS: dict[int, tuple[int, ArgmaxScreen | None]] = {}


def argmax_screen(
    weight: torch.Tensor,
    against: Callable[[torch.Tensor], torch.Tensor] | None = None,
    rows: int = 4,
    top_k: int | None = None,
    repeats: int = 5,
) -> ArgmaxScreen | None:
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
    key = (1 << max(int(rows) - 1, 0).bit_length(), top_k is not None)  # rows rounded up to a power of two
    if key not in screen.faster:
        screen.faster[key] = _faster(screen, against, weight, key[0], top_k, repeats)
    return screen if screen.faster[key] else None


def screen_choices() -> list[dict]:
    """What each screen made in this process chose, timed once: its product and, per power of two of rows and use
    (argmax or top-k), whether it was faster than the head (a run's record, as :func:`calibrated_block_rows`)."""

    def label(rows: int, top_k: bool) -> str:
        return f"{rows} row{'s' if rows > 1 else ''}{', top-k' if top_k else ''}"

    return [
        {
            "weight": list(s.weight.shape),
            "product": s.product,
            "faster": {label(*key): bool(v) for key, v in s.faster.items()},
        }
        for _, s in _SCREENS.values()
        if s is not None
    ]


def _faster(screen: ArgmaxScreen, against, weight: torch.Tensor, rows: int, top_k: int | None, repeats: int) -> bool:
    x = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(0)) * 50
    counted = screen.candidates
    if top_k is None:
        uses = {"screen": lambda: screen(x), "head": lambda: against(x).argmax(dim=-1).tolist()}
    else:
        uses = {"screen": lambda: screen.top(x, top_k), "head": lambda: against(x)}
    with torch.inference_mode():
        seconds = interleaved_medians(uses, repeats)  # the first round warms both up
    screen.candidates = counted  # the timing's rows are not the generation's
    return seconds["screen"] < seconds["head"]


__all__ = ["GROUP", "ArgmaxScreen", "argmax_screen", "screen_choices"]
