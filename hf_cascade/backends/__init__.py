"""Optional verification backends, beside the decoding core (never under it).

The core (:mod:`hf_cascade.core`) runs the target's forwards with the model's own kernels on any
device. A backend may replace some of those kernels for one ``generate()`` call where they pay; the
only one today is :mod:`hf_cascade.backends.cpu` (compiled few-row products for float32 targets on
CPU). It is imported only when engaged: the core, the strategies and training never import it.

One switch engages it: the assistants' ``cpu_kernels=`` argument (``None``, the default, means
"automatic"), else the environment variable ``HF_CASCADE_CPU_KERNELS`` (``0`` / ``1``; unset means
automatic). Automatic engages the CPU kernels exactly when the target's weights are float32 on CPU.

What the core reads from an engaged backend is a :class:`VerifySession`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..placement import defer_reads

ENV = "HF_CASCADE_CPU_KERNELS"


@dataclass
class VerifySession:
    """What one ``generate()`` call's verification runs with.

    Attributes:
        backend: ``"cpu"`` when the CPU kernels are engaged, else ``"model"`` (the model's own kernels).
        block_rows: most rows of logits per output-head call when acceptance reads rows lazily
            (:class:`~hf_cascade.core.rows.TreeRows`); ``None``: every row in one call (accelerators,
            where extra rows are nearly free next to a second pass over the head's weight).
        argmax_screen: ``None``, or a function of a number of rows ``m`` (and ``top_k``, default ``None``)
            returning (made on first use) an :class:`~hf_cascade.backends.cpu.argmax_screen.ArgmaxScreen`: called,
            ``[m, H] hidden -> m`` argmax ids of the head's raw logits; ``.top(hidden, k)``, the rows exact on every
            output that can be in their top ``k``, ``-inf`` elsewhere. It is returned where measured cheaper than
            the head for calls of about ``m`` rows in that use, else ``None``. The core uses it where only the
            argmax of a row is read (greedy, no processor, no scores) or the rows are top-k filtered (sampling).
        record: ``None``, or where the backend prices ``block_rows`` over a strategy's steps, a function to call
            after the ``generate()`` call with its steps: nodes verified and nodes accepted per target call (host
            ints: :class:`~hf_cascade.core.stats.GenerationStats`' ``draft_len_per_call``, ``accepted_per_call``).
    """

    backend: str = "model"
    block_rows: int | None = None
    argmax_screen: Callable[..., Callable[[torch.Tensor], list[int]] | None] | None = None
    record: Callable[[list[int], list[int]], None] | None = None

    def record_steps(self, stats) -> None:
        """Hand ``stats``' steps (a :class:`~hf_cascade.core.stats.GenerationStats`, or a batch's, row by row) to
        :attr:`record`, where there is one."""
        if self.record is None:
            return
        for row in getattr(stats, "rows", None) or [stats]:
            self.record(list(row.draft_len_per_call), list(row.accepted_per_call))


def _weight(model) -> torch.Tensor | None:
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if get is not None else None
    weight = getattr(emb, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight
    return next((p for p in model.parameters()), None) if hasattr(model, "parameters") else None


def cpu_kernels_apply(model) -> bool:
    """Whether the CPU kernels can run ``model``: its weights are float32 and on the CPU (not offloaded
    to ``meta``)."""
    w = _weight(model)
    return w is not None and w.device.type == "cpu" and w.dtype == torch.float32


def env_setting() -> bool | None:
    """``HF_CASCADE_CPU_KERNELS``: ``True`` / ``False``, or ``None`` when unset (automatic)."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"{ENV}={value!r}: use 1 (on), 0 (off) or leave it unset (automatic).")


def wants_cpu_kernels(model, requested: bool | None) -> bool:
    """The switch: the argument if given, else the environment variable, else automatic (on exactly
    where :func:`cpu_kernels_apply`). Asking for them on a target they cannot run is an error."""
    source = "cpu_kernels=True"
    if requested is None:
        requested, source = env_setting(), f"{ENV}=1"
    if requested is None:
        return cpu_kernels_apply(model)
    if requested and not cpu_kernels_apply(model):
        w = _weight(model)
        where = f"{w.dtype} on {w.device}" if w is not None else "no weights"
        raise ValueError(
            f"{source} needs a float32 target on CPU; this one is {where} (leave the switch unset: automatic)."
        )
    return bool(requested)


def default_session(model) -> VerifySession:
    """The session without a backend: blocks of 4 rows on CPU (a head call over 1-4 rows costs about
    one pass over its weight there), all rows at once elsewhere: on the accelerator schedule
    (:func:`hf_cascade.placement.defer_reads`, which tests and the overhead bench force on a CPU)."""
    w = _weight(model)
    device = "cpu" if w is None or w.device.type == "meta" else w.device
    return VerifySession("model", None if defer_reads(device) else 4)


@contextmanager
def verification_session(model, cpu_kernels: bool | None = None, kind: str | None = None) -> Iterator[VerifySession]:
    """Entered around one ``generate()`` call: engages the CPU kernels per the switch above. ``kind``: the strategy
    the call decodes with (the CPU backend prices its block of head rows over that strategy's steps, which the
    caller hands back with :meth:`VerifySession.record_steps`); ``None`` for anything else."""
    if not wants_cpu_kernels(model, cpu_kernels):
        yield default_session(model)
        return
    from .cpu import cpu_kernels as engage_cpu  # imported only when engaged

    with engage_cpu(model, kind) as session:
        yield session


__all__ = [
    "ENV",
    "VerifySession",
    "cpu_kernels_apply",
    "default_session",
    "env_setting",
    "verification_session",
    "wants_cpu_kernels",
]
