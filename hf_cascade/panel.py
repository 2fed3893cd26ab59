"""A few-row product that reads each weight once: the ``panel`` kernel of the target's linears and head.

Verifying ``k`` draft tokens multiplies ``k + 1`` rows by every weight of the target's decoder. The
weights stream from memory, so the product should cost one pass over them for a handful of rows; the
BLAS kernels torch calls stop keeping up from about 4 rows on some CPUs. Measured on a 2-core Xeon
(AVX-512), torch 2.13 CPU wheel, 2 threads, Gemma-3-270M's 126 decoder linears timed alone, 1-8 rows:

* ``F.linear`` (MKL): 14.3 / 15.3 / 16.7 / 22.8 / 23.5 / 25.0 / 28.1 / 29.4 ms
* oneDNN with a packed weight (:class:`~hf_cascade.kernels.WeightPacker`): 16.6 / 17.4 / 18.5 / 18.8 /
  19.8 / 20.4 / 21.4 / 21.7 ms
* this kernel: 13.2 / 15.5 / 16.6 / 18.2 / 19.3 / 20.1 / 20.8 / 21.2 ms

and inside the model's forward (decoder only, 150 cached tokens, 1-8 new tokens), with the kernels the
tuner chose before (``linear`` / ``rows`` / ``packed``) against this one for 2-8 rows: 24.2 / 27.3 / 28.5 /
35.3 / 36.5 / 38.4 / 39.1 / 39.6 ms against 24.0 / 26.9 / 27.3 / 28.7 / 31.6 / 33.1 / 33.7 / 34.5 ms.

On a 2-core AMD EPYC (Zen 4, AVX-512; same wheel, 2 threads), where MKL's few-row kernels are much slower
(plain greedy ``generate`` of Gemma-3-270M: 8.9 tok/s), the 126 decoder linears timed alone, 1 / 2 / 4 /
8 rows: ``F.linear`` 34.8 / 56.1 / 50.6 / 56.7 ms, this kernel 13.1 / 14.0 / 14.5 / 18.0 ms; the decoder
forward over 1-8 new tokens (150 cached) 48-52 ms with ``F.linear`` (75-94 ms for 2-4 tokens), 31-40 ms
with ``W @ x.T`` or oneDNN's packed product, 23 / 25 / 27 / 29 / 32 / 33 ms for 2 / 3 / 4 / 5 / 6 / 8 tokens
with this kernel; the 262k x 640 head 63 / 140 / 114 / 111 ms for 1 / 2 / 4 / 8 rows with ``F.linear``,
22 / 27 / 25 / 27 ms packed, 13 / 13 / 20 / 22 ms with this kernel. There a one-token forward with these
kernels costs about a third of the model's own, so the bench's ``plain-kernels`` baseline (plain greedy
inside them) shows how much of a speedup is the kernels' and how much the drafting's.

The kernel (``csrc/panel_linear.cpp``) keeps a copy of the weight in panels of 16 output rows,
``[ceil(d_out / 16), d_in, 16]``, so that a panel is one contiguous stream and each of its rows is
multiplied by a broadcast element of every row of ``x`` (no horizontal sums); up to 8 rows of ``x``
share one pass over the weight, and more rows go 8 at a time over each block of 4 panels while it is in
cache, so the weight still streams from memory once (a full pass per 8 rows made 9 / 10 rows of
Gemma-3-270M's head cost 43 / 41 ms on the AMD EPYC, against 22-30 for 8: now 25 / 25; in-process A/B of
``MaxGram(corpus=...)`` on 26 Spec-Bench prompts, head in blocks of 8 rows, old / new time: 1.062 and 1.029
in two runs, intervals above 1; ``docs/results/verify-blocks-ab``). It is plain C++ with vector extensions,
compiled for the machine it runs on the first time it is needed (``torch.utils.cpp_extension.load``:
a C++ compiler with OpenMP and ``ninja``; ~30 s once, cached in torch's extensions directory). Where
that fails (no compiler, another platform), or with ``HF_CASCADE_PANEL=0`` in the environment, the
kernel is simply not offered and :class:`~hf_cascade.kernels.WeightPacker`'s oneDNN kernel is offered
instead. The build goes to a directory of its own per CPU model and instruction set (:func:`cpu_tag`):
``-march=native`` code must not be loaded on another kind of CPU sharing the same cache. The copy
costs as much memory as the weight (+400 MB for Gemma-3-270M's decoder, +671 MB for its head);
``PANEL.enabled = False`` turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import warnings
from pathlib import Path
from types import ModuleType

import torch

from .kernels import PACKER, WeightPacker

SOURCE = Path(__file__).with_name("csrc") / "panel_linear.cpp"


def cpu_tag() -> str:
    """A short tag of this CPU's model and instruction-set flags: the build is compiled with
    ``-march=native``, so a cache shared by two kinds of CPU (a home directory on a cluster) must keep
    one build per kind instead of handing one CPU's instructions to another."""
    text = platform.processor() + platform.machine()
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        text += "".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags", "Features"))}))
    except OSError:
        pass
    return hashlib.sha1(text.encode()).hexdigest()[:10]


@functools.cache
def extension() -> ModuleType | None:
    """The compiled kernel (built on the first call in a process, ~30 s the first time on a machine), or
    ``None`` where it cannot be built or ``HF_CASCADE_PANEL=0``."""
    if os.environ.get("HF_CASCADE_PANEL", "1") == "0":
        return None
    try:
        from torch.utils.cpp_extension import load

        return load(f"hf_cascade_panel_{cpu_tag()}", [str(SOURCE)], extra_cflags=["-O3", "-march=native", "-fopenmp"],
                    extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as err:  # noqa: BLE001  (no compiler, no ninja, an unsupported flag: not offered)
        warnings.warn(f"hf_cascade: the panel kernel could not be built ({type(err).__name__}: {err}); "
                      "verification uses torch's kernels", RuntimeWarning, stacklevel=2)
        return None


class PanelPacker(WeightPacker):
    """Weights copied into panels ``[ceil(d_out / 16), d_in, 16]`` for the compiled few-row product
    (module docstring). Same bookkeeping as :class:`~hf_cascade.kernels.WeightPacker`: one copy per
    weight, made again after an in-place update, dropped with the weight."""

    kernel = "panel"

    def available(self) -> bool:
        return extension() is not None

    def _pack(self, weight: torch.Tensor) -> torch.Tensor:             # [d_out, d_in] -> [P, d_in, 16]
        return extension().pack_panels(weight.contiguous())

    def _multiply(self, rows: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None) -> torch.Tensor:           # rows [m, d_in] -> [m, d_out]
        out = extension().panel_linear(rows, packed, weight.shape[0])
        return out + bias if bias is not None else out


#: The process-wide panel copies of the ``panel`` kernel.
PANEL = PanelPacker()


def copy_kernel(weight: torch.Tensor) -> WeightPacker | None:
    """The kernel with a copy of ``weight`` that the target's linears offer to the tuner: :data:`PANEL`
    where it builds, else oneDNN's :data:`~hf_cascade.kernels.PACKER`, else ``None``. One kind only, so
    at most one copy of each weight is ever made."""
    return next((c for c in (PANEL, PACKER) if c.offers(weight)), None)


__all__ = ["PANEL", "PanelPacker", "copy_kernel", "cpu_tag", "extension"]
