"""Device-to-host reads per target call do not grow with the draft length.

On a GPU every read of a tensor's value on the host (``.item()``, ``.tolist()``, ``.cpu()``, ``bool(t)``,
``int(t)``, ``float(t)``, ``t.__index__``) waits for the device to finish its queued work. A decoding loop
that reads once per drafted token pays that synchronisation ``k`` times per target call; the core promises
a bounded number of reads per step (module docstring of :mod:`hf_cascade.core.loop`).

The test counts those reads during ``generate()`` (counting wrappers on ``torch.Tensor``, here on CPU where
the reads are free but countable; ``hf_cascade.placement.DEFER_READS = True`` makes the drafting loops take
their accelerator path, as on a GPU) from the target's first forward on, and the target's forwards (a forward
pre-hook on its decoder, which verification calls without the output head), at a short and a long draft
setting of the same strategy: reads per target call at the long setting must stay within a small constant
of the short one. Reading host-side Python lists is free and not counted. When it fails, the message lists
the call sites of the reads (``file:line function``) at both settings, most frequent first.
"""

from __future__ import annotations

import collections
import os
import sys
import traceback

import pytest
import torch

import hf_cascade
import hf_cascade.placement
from hf_cascade import CascadeAssistant, DynamicWindowAssistant, GlideAssistant, MaxGram, ReDrafterAssistant
from hf_cascade.drafters.maxgram_tree import MaxGramTree, MaxGramTreeAssistant
from tests import tiny_models as tm
from tests.redrafter_helpers import fit_head
from tests.test_glide_decode import echo_glide
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
SLACK = 2                      # reads per target call the long setting may add (e.g. a longer path read once)
CYCLE = ids(1, 9)                    # the tiny Llama target cycles with period 6 from here: long drafts are accepted
REPETITIVE = ids(1, 5, 6, 7, 5, 6, 7, 5, 6)

_TORCH_DIR = os.path.dirname(torch.__file__)
_HERE = os.path.abspath(__file__)


def _site(stack) -> str:
    """The innermost frames outside torch (and this file): where the read was asked for."""
    frames = [f for f in stack if not f.filename.startswith(_TORCH_DIR) and os.path.abspath(f.filename) != _HERE]
    inner = frames[-3:]
    return " <- ".join(f"{_short(f.filename)}:{f.lineno} {f.name}" for f in reversed(inner))


def _short(path: str) -> str:
    for marker in ("hf_cascade" + os.sep, "site-packages" + os.sep, "tests" + os.sep):
        i = path.rfind(marker)
        if i >= 0:
            return path[i:] if marker != "site-packages" + os.sep else path[i + len(marker):]
    return path


class ReadCounter:
    """Counts tensor reads (with their call sites) while ``active``, and the target's decoder forwards."""

    def __init__(self):
        self.active = False
        self.reads = 0
        self.sites: collections.Counter = collections.Counter()
        self.forwards = 0
        self._inside = False

    def install(self, monkeypatch, target) -> None:
        for name in READS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._wrap(original))
        self._handle = target.get_decoder().register_forward_pre_hook(self._on_forward)

    def _on_forward(self, module, args):
        self.active = True                      # count from the first target forward (the prefill) on
        self.forwards += 1

    def _wrap(self, original):
        counter = self

        def wrapper(tensor, *args, **kwargs):
            if counter.active and not counter._inside:
                counter._inside = True          # reads made while recording do not count
                try:
                    counter.reads += 1
                    counter.sites[_site(traceback.extract_stack(sys._getframe(1)))] += 1
                finally:
                    counter._inside = False
            return original(tensor, *args, **kwargs)

        wrapper.__name__ = getattr(original, "__name__", "read")
        return wrapper

    def close(self) -> None:
        self._handle.remove()
        self.active = False


def count_reads(monkeypatch, target, assistant, prompt=CYCLE, new: int = 60) -> tuple[float, ReadCounter, object]:
    counter = ReadCounter()
    with monkeypatch.context() as mp:
        mp.setattr(hf_cascade.placement, "DEFER_READS", True)        # drafting loops as on an accelerator
        counter.install(mp, target)
        try:
            out = target.generate(prompt, do_sample=False, max_new_tokens=new, assistant_model=assistant)
        finally:
            counter.close()
    assert out.shape[1] == prompt.shape[1] + new
    return counter.reads / counter.forwards, counter, assistant.last_stats


def _report(short: ReadCounter, long: ReadCounter) -> str:
    lines = [f"short: {short.reads} reads / {short.forwards} target calls; "
             f"long: {long.reads} reads / {long.forwards} target calls", "reads by call site (short, long):"]
    sites = sorted(set(short.sites) | set(long.sites), key=lambda s: -(long.sites[s] + short.sites[s]))
    for s in sites[:25]:
        lines.append(f"  {short.sites[s]:5d} {long.sites[s]:5d}  {s}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def target():
    return tm.llama_target()


_COPIES: dict = {}


def copy_of(target):
    """A drafter equal to the target: every draft token is accepted (the most tokens per call)."""
    if id(target) not in _COPIES:
        _COPIES[id(target)] = tm.copy_model(target)
    return _COPIES[id(target)]


def _glide(target, cape, n):
    return GlideAssistant(echo_glide(target, 0.0), cape=cape, draft_length=n)     # cross 0: accepted on Llama


# name -> (factory(target, draft length), prompt on which long drafts get accepted)
SETTINGS = {
    # Max-Gram alone (a chain through the core), at most 2 / 10 tokens per draft (K = [[k]])
    "maxgram": (lambda t, n: CascadeAssistant([MaxGram(adaptive=False, max_tokens=10)], k_matrix=[[n]]), CYCLE),
    # a neural drafter (its k forwards per draft on the device, read once) and SD + self-verify windows of n
    "drafter": (lambda t, n: CascadeAssistant([copy_of(t)], k_matrix=[[n]]), CYCLE),
    "dynamic_window": (lambda t, n: DynamicWindowAssistant(copy_of(t), max_window=n, tau_init=float("inf")), CYCLE),
    "glide": (lambda t, n: _glide(t, False, n), REPETITIVE),
    "glide_cape": (lambda t, n: _glide(t, True, n), REPETITIVE),
    "maxgram_tree": (lambda t, n: MaxGramTreeAssistant(branches=2, depth=n), CYCLE),
    "redrafter": (lambda t, n: ReDrafterAssistant(fit_head(t, "llama", steps=80), beam_width=2, beam_length=n), CYCLE),
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_reads_per_target_call_do_not_grow_with_draft_length(target, monkeypatch, name):
    make, prompt = SETTINGS[name]
    per_call, counters, stats = {}, {}, {}
    for length in (2, 10):
        per_call[length], counters[length], stats[length] = count_reads(monkeypatch, target, make(target, length), prompt)
    # the long setting really drafts (and gets accepted) more per call
    assert max(stats[10].tree_depths) > 2 and max(stats[2].tree_depths) <= 2
    assert stats[10].tokens_per_target_call > stats[2].tokens_per_target_call
    assert per_call[10] <= per_call[2] + SLACK, _report(counters[2], counters[10])


def test_the_counter_sees_plain_decoding_reads(target, monkeypatch):
    """Positive control: transformers' plain loop reads the device at least once per token."""
    counter = ReadCounter()
    with monkeypatch.context() as mp:
        counter.install(mp, target)
        try:
            target.generate(CYCLE, do_sample=False, max_new_tokens=20)
        finally:
            counter.close()
    assert counter.forwards == 20 and counter.reads >= 20
    # and the wrappers are gone
    assert torch.Tensor.item.__name__ == "item" and not counter.active


class ReadingTree(MaxGramTree):
    """Max-Gram trees, read back token by token (what a drafting loop that reads per token does)."""

    def draft_tree(self, seq, state):
        tree, q = super().draft_tree(seq, state)
        for t in tree.tokens:
            int(t)
        return tree, q


def test_the_test_catches_a_read_per_drafted_token(target, monkeypatch):
    """Negative control: the same comparison fails for a drafter that reads each drafted token."""
    def make(n):
        a = MaxGramTreeAssistant(branches=2, depth=n)
        a.drafter = ReadingTree(2, n)
        return a

    short, _, _ = count_reads(monkeypatch, target, make(2))
    long, _, _ = count_reads(monkeypatch, target, make(10))
    assert long > short + SLACK
