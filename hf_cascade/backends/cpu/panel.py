"""A few-row product that reads each weight once: the ``panel`` kernel of the target's linears and head.

Verifying ``k`` draft tokens multiplies ``k + 1`` rows by every weight of the target's decoder. The
weights stream from memory, so the product should cost one pass over them for a handful of rows; the
BLAS kernels torch calls stop keeping up from a few rows on some CPUs. This kernel is one more
candidate for :class:`~hf_cascade.backends.cpu.kernels.KernelTuner`, which uses it only for the shapes
where it is measured fastest on the machine at hand.

The kernel (``csrc/panel_linear.cpp``) keeps a copy of the weight in panels of 16 output rows,
``[ceil(d_out / 16), d_in, 16]``, so that a panel is one contiguous stream and each of its rows is
multiplied by a broadcast element of every row of ``x`` (no horizontal sums); up to 8 rows of ``x`` (6
without AVX-512) share one pass over the weight, and more rows go that many at a time over each block of 4
panels while it is in cache, so the weight still streams from memory once whatever the number of rows. It
is plain C++ with vector extensions, compiled for the machine it runs on the first time it is needed
(``torch.utils.cpp_extension.load``: a C++ compiler with OpenMP and ``ninja``; cached in torch's
extensions directory). Where that fails (no compiler, another platform) the kernel is simply not
offered and :class:`~hf_cascade.backends.cpu.kernels.WeightPacker`'s oneDNN kernel is offered instead.
The build goes to a directory of its own per CPU model and instruction set (:func:`cpu_tag`):
``-march=native`` code must not be loaded on another kind of CPU sharing the same cache; and per torch
installation (:func:`install_tag`): environments side by side do not rebuild over each other. The environment
variable ``HF_CASCADE_MARCH`` replaces ``native`` with another ``-march`` target (e.g. ``x86-64-v3``: AVX2
and FMA, no AVX-512), for a build that runs on every CPU of a cluster, or to measure the kernels without
the host's widest instructions; each target gets its own build. The copy costs as much memory as the
weight. Measurements: ``docs/cpu-kernels.md``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import re
import time
import warnings
from pathlib import Path
from types import ModuleType

import torch

from .kernels import PACKER, WeightPacker

#: the extension's sources: the panel products, and the argmax screen's candidates and integer product
SOURCES = tuple(Path(__file__).with_name("csrc") / f for f in ("panel_linear.cpp", "screen.cpp"))
#: a build lock older than this was left by an interrupted build (a build takes about 30 s) and is removed:
#: torch waits on a lock without end, so one interrupted first build would hang every later process
STALE_LOCK_SECONDS = 600.0


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


def install_tag() -> str:
    """A short tag of the torch installation the extension is built against (its version, its directory, the
    Python version): two environments on one machine (two virtualenvs with the same torch release, say) compile
    against their own headers and libraries, so each keeps its own build. Sharing one would rebuild it at every
    switch, and two processes of different environments starting at once would build over each other."""
    text = f"{torch.__version__}|{Path(torch.__file__).resolve().parent}|{platform.python_version()}"
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def march() -> str:
    """The ``-march`` target of the build: ``HF_CASCADE_MARCH`` if set, else ``native`` (module docstring).
    ``ValueError`` for a value that is not a plain target name."""
    value = os.environ.get("HF_CASCADE_MARCH", "").strip() or "native"
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+", value):
        raise ValueError(f"HF_CASCADE_MARCH={value!r} is not a -march target name (e.g. native, x86-64-v3)")
    return value


def build_name() -> str:
    """The extension's name: one build per CPU kind (:func:`cpu_tag`), torch installation (:func:`install_tag`) and
    ``-march`` target."""
    target = march()
    suffix = "" if target == "native" else "_" + re.sub(r"[^A-Za-z0-9_]", "_", target)
    return f"hf_cascade_panel_{cpu_tag()}_{install_tag()}{suffix}"


@functools.cache
def extension() -> ModuleType | None:
    """The compiled kernel (built on the first call in a process, once per machine), or ``None`` where
    it cannot be built."""
    try:
        from torch.utils.cpp_extension import load

        name = build_name()
        clear_stale_lock(name)
        return load(
            name,
            [str(f) for f in SOURCES],
            extra_cflags=["-O3", f"-march={march()}", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as err:  # noqa: BLE001  (no compiler, no ninja, an unsupported flag: not offered)
        warnings.warn(
            f"hf_cascade: the panel kernel could not be built ({type(err).__name__}: {err}); "
            "verification uses torch's kernels",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def clear_stale_lock(name: str, older_than: float = STALE_LOCK_SECONDS) -> bool:
    """Remove the build lock of extension ``name`` when it is older than ``older_than`` seconds (left by a
    build that was interrupted); whether one was removed."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        lock = Path(_get_build_directory(name, verbose=False)) / "lock"
        if not lock.exists() or time.time() - lock.stat().st_mtime <= older_than:
            return False
        lock.unlink()
    except Exception:  # noqa: BLE001  (a private torch helper: if it moved, torch's own waiting stands)
        return False
    warnings.warn(
        f"hf_cascade: removed a stale build lock left by an interrupted build ({lock})", RuntimeWarning, stacklevel=2
    )
    return True


class PanelPacker(WeightPacker):
    """Weights copied into panels ``[ceil(d_out / 16), d_in, 16]`` for the compiled few-row product
    (module docstring). Same bookkeeping as :class:`~hf_cascade.backends.cpu.kernels.WeightPacker`: one copy per
    weight, made again after an in-place update, dropped with the weight."""

    kernel = "panel"

    def available(self) -> bool:
        return extension() is not None

    def _pack(self, weight: torch.Tensor) -> torch.Tensor:  # [d_out, d_in] -> [P, d_in, 16]
        return extension().pack_panels(weight.contiguous())

    def _multiply(
        self, rows: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:  # rows [m, d_in] -> [m, d_out]
        out = extension().panel_linear(rows, packed, weight.shape[0])
        return out + bias if bias is not None else out


#: The process-wide panel copies of the ``panel`` kernel.
PANEL = PanelPacker()


def copy_kernel(weight: torch.Tensor) -> WeightPacker | None:
    """The kernel with a copy of ``weight`` that the target's linears offer to the tuner: :data:`PANEL`
    where it builds, else oneDNN's :data:`~hf_cascade.backends.cpu.kernels.PACKER`, else ``None``. One kind only, so
    at most one copy of each weight is ever made."""
    return next((c for c in (PANEL, PACKER) if c.offers(weight)), None)


__all__ = ["PANEL", "PanelPacker", "build_name", "copy_kernel", "cpu_tag", "extension", "install_tag", "march"]
