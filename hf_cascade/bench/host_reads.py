"""Counting what a decoding loop costs the host: device-to-host reads and blocking host-to-device copies
(:class:`ReadCounter`), and time inside chosen modules' forwards (:class:`ModuleTimer`).

On a GPU every read of a tensor's value on the host (``.item()``, ``.tolist()``, ``.cpu()``, ``bool(t)``, ``int(t)``,
``float(t)``, ``t.__index__``, a move or copy into host memory) waits for the device's queued work, and so does every
blocking copy of host memory to the device (``torch.tensor(data, device=...)``, ``.to(device)`` / ``.cuda()`` /
``copy_`` of a host tensor without ``non_blocking=True`` from pinned memory, an operation that mixes a host tensor with
device tensors): ``torch.cuda.set_sync_debug_mode`` flags both. On a CPU they are free but countable: the counter
wraps the read methods of ``torch.Tensor`` and follows every torch call with a ``TorchFunctionMode`` that knows which
tensors are host memory (see :class:`ReadCounter`), and records where each was asked for. ``hf-cascade bench
--overhead`` (:mod:`hf_cascade.bench.overhead`) and ``tests/test_host_reads.py`` count with it.
"""

from __future__ import annotations

import collections
import os
import sys
import time
import traceback
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from .. import placement

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
            return path[i:] if marker != "site-packages" + os.sep else path[i + len(marker) :]
    return os.path.basename(path)


def read_site(stack, skip: Iterable[str] = ()) -> str:
    """The innermost frames outside torch, this module and ``skip`` (absolute file names): where a read was asked
    for, ``file:line function`` joined innermost first."""
    skip = {os.path.abspath(s) for s in skip} | {_HERE}
    frames = [f for f in stack if not f.filename.startswith(_TORCH_DIR) and os.path.abspath(f.filename) not in skip]
    inner = frames[-3:]
    return " <- ".join(f"{_short(f.filename)}:{f.lineno} {f.name}" for f in reversed(inner))


class ReadCounter:
    """Counts host reads of tensors and blocking host-to-device copies (and, with ``sites``, where they were asked
    for) while installed::

        with ReadCounter(target) as counter:          # count from the target's first forward on
            target.generate(...)
        counter.reads, counter.copies, counter.forwards, counter.per_call, counter.sites.most_common(5)
        counter.per_forward                           # the counts from each target forward to the next

    ``target``: count only from its decoder's first forward on (its prefill; the reads before it go to
    ``reads_before``), and count its decoder forwards; ``skip_forwards``: from the one after the first
    ``skip_forwards`` on (1: from the first verification on, the prefill left out); ``None``: count from entering on.
    ``names``: the wrapped ``torch.Tensor`` read methods (:data:`READS`). A read or copy made inside a module given to
    :meth:`pause_in` is not counted (a model's own forward), nor one made while one is being recorded. The wrappers, the
    mode and the hooks are removed on exit, whatever happened.

    What counts as a copy (``copies``, sites in ``copy_sites``) is decided as on an accelerator, where the target's
    tensors live on the device and host-built ones in host memory; on a CPU both are the same memory, so the counter
    follows each tensor's side through every torch call made while installed (its ``TorchFunctionMode``):

    * **host** tensors: made without a device (the default device is taken to be the host), on the host
      (``device="cpu"`` as a string, or :data:`hf_cascade.placement.HOST`), moved there (``.cpu()``,
      ``.to(HOST)``), or computed from host tensors alone;
    * **device** tensors: every other one -- made with any other device (``torch.device("cpu")`` objects included:
      the loops name the target's device so), moved to one, computed with a device tensor among the inputs, or
      made before the counter was installed (the model's weights, the caller's ``input_ids``).

    A blocking copy is then: ``torch.tensor`` / ``as_tensor`` / ``asarray`` of host data (Python values, a host
    tensor) onto a device; ``.to(device)`` / ``.cuda()`` / ``device_tensor.copy_(host_tensor)`` of a host tensor,
    unless ``non_blocking=True`` from pinned memory (those are ``async_copies``); an operation mixing a host tensor
    of one element or more dimensions with device tensors (indexing a device tensor with a host index: torch copies
    it). With ``pinned_uploads`` (default), what :func:`hf_cascade.placement.upload` stages is taken as pinned, as it
    is on CUDA (on a CPU there is nothing to pin). A move or ``copy_`` of a device tensor into host memory is a read.
    Explicit waits through :func:`hf_cascade.placement.synchronize` (called on the module) are ``syncs``. What torch
    does inside one call (a model's kernels, a compiled graph) is that call's. On CUDA
    ``torch.cuda.set_sync_debug_mode`` flags the same reads, copies and waits (``tests/cuda/test_cuda_syncs.py``).
    """

    def __init__(
        self,
        target: Any = None,
        names: Sequence[str] = READS,
        sites: bool = True,
        skip_files: Iterable[str] = (),
        pinned_uploads: bool = True,
        skip_forwards: int = 0,
    ):
        self.target, self.names, self.record_sites = target, tuple(names), bool(sites)
        self.skip_files = tuple(skip_files)
        self.pinned_uploads = bool(pinned_uploads)
        self.skip_forwards = int(skip_forwards)
        self.active = target is None
        self.reads = 0
        self.reads_before = 0  # reads while installed but before the target's first forward
        self.sites: collections.Counter = collections.Counter()
        self.copies = 0  # blocking host-to-device copies
        self.async_copies = 0  # non-blocking ones, from pinned memory
        self.syncs = 0  # explicit waits: hf_cascade.placement.synchronize
        self.copy_sites: collections.Counter = collections.Counter()
        self.forwards = 0
        self.per_forward: list[dict[str, int]] = []  # counted from each counted target forward to the next
        self._inside = False
        self._paused = 0
        self._saved: dict[str, Any] = {}
        self._originals: dict = {}  # wrapper -> the read method it wraps
        self._handles: list = []
        self._pause_modules: list = []
        self._mode: _Sides | None = None
        self._pinned_saved = None
        self._synchronize_saved = None

    # -- installing -----------------------------------------------------------------------------------------
    def __enter__(self) -> ReadCounter:
        for name in self.names:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original
            setattr(torch.Tensor, name, self._wrap(original))
        if self.target is not None:
            self._handles.append(self.target.get_decoder().register_forward_pre_hook(self._on_forward))
        for module in self._pause_modules:
            self._pause_hooks(module)
        self._mode = _Sides(self)
        self._mode.__enter__()
        if self.pinned_uploads:
            self._pinned_saved = placement._pinned
            placement._pinned = self._mode.pinned_upload(self._pinned_saved)
        self._synchronize_saved = placement.synchronize
        placement.synchronize = self._counted_synchronize(self._synchronize_saved)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Remove the wrappers and hooks (idempotent) and stop counting."""
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        if self._pinned_saved is not None:
            placement._pinned, self._pinned_saved = self._pinned_saved, None
        if self._synchronize_saved is not None:
            placement.synchronize, self._synchronize_saved = self._synchronize_saved, None
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved = {}
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.active = False

    def pause_in(self, module: torch.nn.Module) -> ReadCounter:
        """Reads made inside ``module``'s forwards are not counted."""
        self._pause_modules.append(module)
        if self._saved:  # already installed
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
        self.forwards += 1
        self.active = self.forwards > self.skip_forwards  # count from the first forward not skipped on
        if self.active:
            self.per_forward.append({"reads": 0, "copies": 0, "async_copies": 0, "syncs": 0})

    def _record(self, kind: str, frame) -> None:
        """One read (``kind="read"``), blocking copy (``"copy"``) or asynchronous copy (``"async"``) asked for at
        ``frame`` (counted from the target's first forward on, outside paused modules)."""
        if kind == "read" and not self.active:
            self.reads_before += 1
            return
        if not self.active or self._inside or self._paused:
            return
        field = {"read": "reads", "copy": "copies", "async": "async_copies", "sync": "syncs"}[kind]
        setattr(self, field, getattr(self, field) + 1)
        if self.per_forward:
            self.per_forward[-1][field] += 1
        if kind in ("async", "sync"):
            return
        if self.record_sites:
            self._inside = True  # what recording calls does not count
            try:
                site = read_site(traceback.extract_stack(frame), self.skip_files)
                (self.sites if kind == "read" else self.copy_sites)[site] += 1
            finally:
                self._inside = False

    def _counted_synchronize(self, synchronize):
        def counted(device=None):
            self._record("sync", sys._getframe(1))
            return synchronize(device)

        return counted

    def _wrap(self, original):
        counter = self

        def wrapper(tensor, *args, **kwargs):
            counter._record("read", sys._getframe(1))
            return original(tensor, *args, **kwargs)

        wrapper.__name__ = getattr(original, "__name__", "read")
        wrapper.__wrapped__ = original
        self._originals[wrapper] = original
        return wrapper

    # -- results ----------------------------------------------------------------------------------------------
    @property
    def per_call(self) -> float:
        """Reads per target decoder forward (``nan`` before one)."""
        return self.reads / self.forwards if self.forwards else float("nan")

    @property
    def copies_per_call(self) -> float:
        """Blocking host-to-device copies per target decoder forward (``nan`` before one)."""
        return self.copies / self.forwards if self.forwards else float("nan")

    def top_sites(self, n: int = 8) -> list[tuple[str, int]]:
        return self.sites.most_common(n)


#: torch calls that make a tensor from data (a copy when the data is on the other side)
_FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray}


class _Sides(TorchFunctionMode):
    """:class:`ReadCounter`'s mode: which tensors are host memory (the rest are the device's), and the copies and reads
    between the two sides (the rules are :class:`ReadCounter`'s docstring)."""

    def __init__(self, counter: ReadCounter):
        super().__init__()
        self.counter = counter
        self._host: dict[int, weakref.ref] = {}  # id -> the host tensor (tensors compare elementwise: no sets)
        self._pinned: dict[int, weakref.ref] = {}

    # -- sides --------------------------------------------------------------------------------------------------
    @staticmethod
    def _has(table: dict, t: torch.Tensor) -> bool:
        ref = table.get(id(t))
        return ref is not None and ref() is t

    @staticmethod
    def _add(table: dict, t: torch.Tensor) -> None:
        key = id(t)
        table[key] = weakref.ref(t, lambda _, key=key: table.pop(key, None))

    def is_host(self, t: torch.Tensor) -> bool:
        return self._has(self._host, t)

    def _mark(self, out, host: bool) -> None:
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                if host:
                    self._add(self._host, t)
                else:
                    self._host.pop(id(t), None)

    def pinned_upload(self, pinned):
        """:func:`hf_cascade.placement._pinned` where every device stages in pinned memory, as CUDA does (on a CPU
        the tensor itself, taken as pinned)."""

        def staged(host, device):
            out, _ = pinned(host, device)
            self._add(self._pinned, out)
            return out, True

        return staged

    @staticmethod
    def _side(spec, sides: _Sides) -> bool | None:
        """``True`` (host), ``False`` (device) or ``None`` (no device named) for a ``device=`` / ``.to()`` argument."""
        if spec is None:
            return None
        if isinstance(spec, torch.Tensor):
            return sides.is_host(spec)
        if spec is placement.HOST or (isinstance(spec, str) and spec == "cpu"):
            return True
        return False

    # -- the calls ----------------------------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():  # traced into a compiled graph: that call's own work
            return func(*args, **kwargs)
        func = self.counter._originals.get(func, func)  # a read method: counted by its wrapper, once
        out = func(*args, **kwargs)
        frame = sys._getframe(1)
        name = getattr(func, "__name__", "")
        if func in _FROM_DATA:
            out = self._from_data(args, kwargs, out, frame)
        elif name in ("to", "cuda", "cpu", "pin_memory") and args and isinstance(args[0], torch.Tensor):
            out = self._move(name, args, kwargs, out, frame)
        elif name == "copy_" and len(args) >= 2 and isinstance(args[1], torch.Tensor):
            dst_host, src_host = self.is_host(args[0]), self.is_host(args[1])
            if src_host and not dst_host:
                self._copy(args[1], kwargs.get("non_blocking", args[2] if len(args) > 2 else False), frame)
            elif dst_host and not src_host:
                self.counter._record("read", frame)
        else:
            self._compute(args, kwargs, out, frame)
        return out

    def _from_data(self, args, kwargs, out, frame) -> None:
        data = args[0] if args else kwargs.get("data", kwargs.get("obj"))
        dest = self._side(kwargs.get("device"), self)
        source = self.is_host(data) if isinstance(data, torch.Tensor) else True  # Python values: the host's
        if source and dest is False:
            self.counter._record("copy", frame)  # built on the host, then a blocking copy
        elif not source and dest:
            self.counter._record("read", frame)
        return self._moved(data, out, source if dest is None else dest)

    def _moved(self, source, out, host: bool):
        """``out`` marked ``host`` (or the device's); where a move to the other side returned ``source`` itself (on a
        CPU it is the same memory), a new tensor over it, so that ``source`` keeps its side as on an accelerator."""
        if out is source and isinstance(source, torch.Tensor) and self.is_host(source) != host:
            out = source.view_as(source)
        self._mark(out, host)
        return out

    def _move(self, name, args, kwargs, out, frame) -> None:
        t = args[0]
        source = self.is_host(t)
        if name == "pin_memory":
            self._mark(out, True)
            self._add(self._pinned, out)
            return out
        if name == "cuda":
            dest = False
        elif name == "cpu":
            dest = True  # the read itself: the ``cpu`` method's wrapper
        else:
            spec = kwargs.get("device", kwargs.get("other"))
            for a in args[1:]:
                if spec is None and isinstance(a, (str, torch.device, int, torch.Tensor)) and not isinstance(a, bool):
                    spec = a
            dest = self._side(spec, self)
        blocking_flag = kwargs.get("non_blocking", next((a for a in args[1:] if isinstance(a, bool)), False))
        if source and dest is False:
            self._copy(t, blocking_flag, frame)
        elif not source and dest and name != "cpu":
            self.counter._record("read", frame)
        return self._moved(t, out, source if dest is None else dest)

    def _copy(self, source: torch.Tensor, non_blocking, frame) -> None:
        asynchronous = bool(non_blocking) and (source.is_pinned() or self._has(self._pinned, source))
        self.counter._record("async" if asynchronous else "copy", frame)

    def _compute(self, args, kwargs, out, frame) -> None:
        dest = self._side(kwargs.get("device"), self) if "device" in kwargs else None
        if dest is not None:  # a factory on a named side: made there, no copy
            self._mark(out, dest)
            return
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        host = [t for t in inputs if self.is_host(t)]
        if len(host) == len(inputs):  # host inputs only (or none: a factory on the host)
            self._mark(out, True)
            return
        if any(t.dim() > 0 for t in host):  # host memory joins device tensors: torch copies it
            self.counter._record("copy", frame)
        self._mark(out, False)


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

    def __enter__(self) -> ModuleTimer:
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
