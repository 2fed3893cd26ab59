"""Counting what a decoding loop costs the host: device-to-host reads (:class:`ReadCounter`) and time inside chosen
modules' forwards (:class:`ModuleTimer`).

On a GPU every read of a tensor's value on the host (``.item()``, ``.tolist()``, ``.cpu()``, ``bool(t)``, ``int(t)``,
``float(t)``, ``t.__index__``) waits for the device's queued work. On a CPU the reads are free but countable: the
counter wraps those methods of ``torch.Tensor`` and records where each read was asked for. ``hf-cascade bench
--overhead`` (:mod:`hf_cascade.bench.overhead`) and ``tests/test_host_reads.py`` count with it.
"""

from __future__ import annotations

import collections
import os
import sys
import time
import traceback
from typing import Any, Iterable, Sequence

import torch

#: The tensor methods that read a value on the host (each one waits for the device's queued work on a GPU).
READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
#: The scalar / list reads only (no ``.cpu()`` / ``.numpy()`` copies).
SCALAR_READS = ("item", "tolist", "__int__", "__float__", "__bool__", "__index__")

_TORCH_DIR = os.path.dirname(torch.__file__)
_HERE = os.path.abspath(__file__)


def _short(path: str) -> str:
    for marker in ("hf_cascade" + os.sep, "site-packages" + os.sep, "tests" + os.sep):
        i = path.rfind(marker)
        if i >= 0:
            return path[i:] if marker != "site-packages" + os.sep else path[i + len(marker):]
    return os.path.basename(path)


def read_site(stack, skip: Iterable[str] = ()) -> str:
    """The innermost frames outside torch, this module and ``skip`` (absolute file names): where a read was asked
    for, ``file:line function`` joined innermost first."""
    skip = {os.path.abspath(s) for s in skip} | {_HERE}
    frames = [f for f in stack if not f.filename.startswith(_TORCH_DIR) and os.path.abspath(f.filename) not in skip]
    inner = frames[-3:]
    return " <- ".join(f"{_short(f.filename)}:{f.lineno} {f.name}" for f in reversed(inner))


class ReadCounter:
    """Counts host reads of tensors (and, with ``sites``, where they were asked for) while installed::

        with ReadCounter(target) as counter:          # count from the target's first forward on
            target.generate(...)
        counter.reads, counter.forwards, counter.per_call, counter.sites.most_common(5)

    ``target``: count only from its decoder's first forward on (its prefill; the reads before it go to
    ``reads_before``), and count its decoder forwards; ``None``: count from entering on. ``names``: the wrapped
    ``torch.Tensor`` methods (:data:`READS`). A read made inside a module given to :meth:`pause_in` is not counted
    (a model's own forward), nor one made while a read is being recorded. The wrappers and hooks are removed on exit,
    whatever happened.
    """

    def __init__(self, target: Any = None, names: Sequence[str] = READS, sites: bool = True,
                 skip_files: Iterable[str] = ()):
        self.target, self.names, self.record_sites = target, tuple(names), bool(sites)
        self.skip_files = tuple(skip_files)
        self.active = target is None
        self.reads = 0
        self.reads_before = 0                   # reads while installed but before the target's first forward
        self.sites: collections.Counter = collections.Counter()
        self.forwards = 0
        self._inside = False
        self._paused = 0
        self._saved: dict[str, Any] = {}
        self._handles: list = []
        self._pause_modules: list = []

    # -- installing -----------------------------------------------------------------------------------------
    def __enter__(self) -> "ReadCounter":
        for name in self.names:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original
            setattr(torch.Tensor, name, self._wrap(original))
        if self.target is not None:
            self._handles.append(self.target.get_decoder().register_forward_pre_hook(self._on_forward))
        for module in self._pause_modules:
            self._pause_hooks(module)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Remove the wrappers and hooks (idempotent) and stop counting."""
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved = {}
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.active = False

    def pause_in(self, module: torch.nn.Module) -> "ReadCounter":
        """Reads made inside ``module``'s forwards are not counted."""
        self._pause_modules.append(module)
        if self._saved:                                    # already installed
            self._pause_hooks(module)
        return self

    def _pause_hooks(self, module) -> None:
        def pre(*_):
            self._paused += 1

        def post(*_):
            self._paused -= 1

        self._handles.append(module.register_forward_pre_hook(pre))
        self._handles.append(module.register_forward_hook(post, always_call=True))

    def _on_forward(self, module, args):
        self.active = True                      # count from the first target forward (the prefill) on
        self.forwards += 1

    def _wrap(self, original):
        counter = self

        def wrapper(tensor, *args, **kwargs):
            if not counter.active:
                counter.reads_before += 1
            elif not counter._inside and not counter._paused:
                counter.reads += 1
                if counter.record_sites:
                    counter._inside = True          # reads made while recording do not count
                    try:
                        counter.sites[read_site(traceback.extract_stack(sys._getframe(1)), counter.skip_files)] += 1
                    finally:
                        counter._inside = False
            return original(tensor, *args, **kwargs)

        wrapper.__name__ = getattr(original, "__name__", "read")
        wrapper.__wrapped__ = original
        return wrapper

    # -- results ----------------------------------------------------------------------------------------------
    @property
    def per_call(self) -> float:
        """Reads per target decoder forward (``nan`` before one)."""
        return self.reads / self.forwards if self.forwards else float("nan")

    def top_sites(self, n: int = 8) -> list[tuple[str, int]]:
        return self.sites.most_common(n)


class ModuleTimer:
    """Seconds spent inside the forwards of ``modules`` (outermost calls only: a module called inside another, or
    inside itself, is not counted twice) and the number of outermost calls, while installed::

        with ModuleTimer([target.get_decoder()]) as timer:
            ...
        timer.seconds, timer.calls; timer.reset()

    :meth:`enter` / :meth:`exit` mark time inside by hand (a compiled call that hooks do not see)."""

    def __init__(self, modules: Iterable[torch.nn.Module] = ()):
        self.modules = list(modules)
        self.seconds, self.calls = 0.0, 0
        self._depth, self._start = 0, 0.0
        self._handles: list = []

    def __enter__(self) -> "ModuleTimer":
        for m in self.modules:
            self._handles.append(m.register_forward_pre_hook(lambda *_: self.enter()))
            self._handles.append(m.register_forward_hook(lambda *_: self.exit(), always_call=True))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def enter(self) -> None:
        if self._depth == 0:
            self._start = time.perf_counter()
            self.calls += 1
        self._depth += 1

    def exit(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.seconds += time.perf_counter() - self._start

    def reset(self) -> None:
        self.seconds, self.calls, self._depth = 0.0, 0, 0


__all__ = ["READS", "SCALAR_READS", "ModuleTimer", "ReadCounter", "read_site"]
