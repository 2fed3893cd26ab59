"""The options every assistant shares, as data.

An assistant takes its drafter or head (a loaded model, a local path or a Hub repo id) and a few keyword options;
the rest is grouped here, one frozen dataclass per concern, shared where the concern is:

* :class:`Loading` -- where the drafters and heads come from (``from_pretrained``'s Hub and placement options) and
  where they run (placed like the target at every call);
* :class:`Policy` -- what the assistants do beyond their papers so that drafting pays on the running machine (the
  rules of :mod:`hf_cascade.core.payoff`); :meth:`Policy.paper` is every paper's fixed shape.

Each strategy's own settings are its folder's (``CascadeSettings``, ``DynamicWindowSettings``, ``GlideSettings``,
``ReDrafterSettings``, ``RecyclingSettings``, ``SuffixSettings``). All are :class:`Options` (``X.of(None)``: the
defaults). A keyword an assistant took before its options became data raises a ``TypeError`` that names the new
place (:func:`rejects_moved`): no silent aliases.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch

from .core.payoff import VerifyCost
from .loading import load_pretrained


class Options:
    """Base of the option dataclasses (frozen): :meth:`of` reads an assistant's keyword, :meth:`_normalize` the
    fields' types."""

    @classmethod
    def of(cls, value):
        """``value`` as given to an assistant: the defaults for ``None``, ``TypeError`` for anything but a ``cls``."""
        if value is None:
            return cls()
        if not isinstance(value, cls):
            keyword = "settings" if cls.__name__.endswith("Settings") else cls.__name__.lower()
            raise TypeError(
                f"{keyword} must be a {cls.__name__} (or None for its defaults), got {type(value).__name__}"
            )
        return value

    def _normalize(self, **types) -> None:
        """Each named field converted to its type (``lenience=float``): a frozen dataclass's ``__post_init__``."""
        for name, kind in types.items():
            object.__setattr__(self, name, kind(getattr(self, name)))


@dataclass(frozen=True)
class Loading(Options):
    """Where an assistant's drafters and heads come from and where they run.

    Attributes:
        revision, token, cache_dir, dtype, device_map: ``from_pretrained``'s options for the drafters and heads given
            as a local path or Hub repo id (:func:`hf_cascade.loading.load_pretrained`; ``dtype`` / ``device_map``
            with an already loaded model: ``ValueError``).
        place: at every ``generate()``, move the drafters and heads to the device of the target's input embeddings
            and cast their float weights to its dtype (:func:`hf_cascade.placement.place_like`; a model dispatched
            with ``device_map`` stays put). ``False``: leave them where they are (each drafts on its own device;
            tokens, hidden states or K/V cross devices at every step).
        tokenizer: the causal-LM drafters' tokenizer (``CascadeAssistant``, ``DynamicWindowAssistant``), for an exact
            vocabulary check when ``generate(..., tokenizer=...)`` is also given.
    """

    revision: str | None = None
    token: str | bool | None = None
    cache_dir: str | os.PathLike | None = None
    dtype: Any = None
    device_map: Any = None
    place: bool = True
    tokenizer: Any = None

    def load(self, model, kind: str, head: str | None = None, needs: tuple[str, ...] = ()):
        """``model`` loaded with these options when it is a path or repo id (a loaded ``torch.nn.Module`` is returned
        as is, after the checks of :func:`~hf_cascade.loading.load_pretrained`); anything else unchanged. ``head``,
        ``needs``: the head class it must be, by the methods it needs (duck-typed: a class loaded as remote code
        is another class object), else ``TypeError``."""
        if isinstance(model, (str, os.PathLike, torch.nn.Module)):
            model = load_pretrained(
                model,
                kind=kind,
                revision=self.revision,
                token=self.token,
                cache_dir=self.cache_dir,
                dtype=self.dtype,
                device_map=self.device_map,
            )
        if not all(hasattr(model, a) for a in needs):
            raise TypeError(f"{kind} must be a {head} (or the path or repo id of one), got {type(model).__name__}")
        return model


@dataclass(frozen=True)
class Policy(Options):
    """What the assistants do beyond their papers so that drafting pays on the running machine. Every field is
    lossless: it decides what is drafted and verified, never what is accepted.

    Attributes:
        cost_aware: draft, and verify, only what is expected to pay for its cost on this machine, as measured in
            the call (:mod:`hf_cascade.core.payoff`): GLIDE's and ReDrafter's trees and Token Recycling's candidates
            cut to the nodes that pay (whether to draft, how deep, which nodes), the cascade's neural tokens
            admitted while they pay and its drafter consulted only where its forwards are expected to pay,
            HSDDW's draft models run only where they are. ``False``: the papers' fixed shapes (GLIDE's
            ``draft_length``, ReDrafter's whole beams, the cascade's K-matrix lengths, HSDDW's every step).
        verify_cost: the target's verification cost by number of nodes (a
            :class:`~hf_cascade.core.payoff.VerifyCost` table, e.g. from
            :func:`~hf_cascade.measure.measure_verify_cost` or :meth:`~hf_cascade.core.payoff.VerifyCost.flat`),
            for the tree strategies; ``None``: measured on the target's device when the assistant binds to it
            (:func:`~hf_cascade.measure.measured_verify_cost`, once per device kind).
        lookup: the text's own repeats (prompt lookup) reach the target without a model's review: GLIDE and
            ReDrafter join them to each tree as a branch rated by its measured acceptance (with ``cost_aware``,
            whose cut decides what pays), HSDDW asks Max-Gram first and runs its draft models only where it
            proposes nothing, the cascade sends Max-Gram's match to the target first and lets its smallest neural
            drafter continue it (its drafters do not review it), Token Recycling seeds its tree with the repeats'
            continuations. ``False``: the model's drafts alone, as in the papers.
        memory: how many tokens of the target's answers of earlier calls the assistant remembers and drafts from
            (:class:`~hf_cascade.drafters.memory.AnswerMemory`: the emitted tokens of each finished call, the oldest
            answers evicted beyond this many tokens; ``assistant.forget()`` empties it): Max-Gram (the cascade's,
            HSDDW's lookup) continues a match found there when it is longer than the sequence's own and its
            measured acceptance is no lower; GLIDE's and ReDrafter's lookup branch (with ``lookup``) seeds its
            continuations there when that match is longer. Lossless (a draft source like any other); an output never
            depends on
            it, only its speed. Each assistant keeps its own. ``0`` (default): no memory.
        sync_phases: the phase timings of ``last_stats.phase_seconds`` wait for the target's accelerators at each
            phase's edges, so that each phase is charged its own device work (about eight synchronisations per step;
            :class:`~hf_cascade.core.stats.PhaseTimer`). ``False`` (default): no phase waits; the timings that decide
            something (the measured verification cost, the drafters' measured forwards) synchronise whatever this
            says. No effect on a CPU.
    """

    cost_aware: bool = True
    verify_cost: VerifyCost | None = None
    lookup: bool = True
    memory: int = 0
    sync_phases: bool = False

    def __post_init__(self) -> None:
        if self.verify_cost is not None and not isinstance(self.verify_cost, VerifyCost):
            raise TypeError(
                f"Policy.verify_cost must be a hf_cascade.VerifyCost or None (measured when the assistant "
                f"binds), got {type(self.verify_cost).__name__}"
            )
        if isinstance(self.memory, bool) or not isinstance(self.memory, int) or self.memory < 0:
            raise ValueError(f"Policy.memory is a number of tokens >= 0 (0: no memory), got {self.memory!r}")
        self._normalize(cost_aware=bool, lookup=bool, sync_phases=bool)

    @classmethod
    def paper(cls) -> Policy:
        """The papers' fixed shapes: no cost rule, no lookup."""
        return cls(cost_aware=False, lookup=False)


#: The Hub and placement keywords of the assistants that load models, and where they are now.
LOADING_KEYWORDS = {
    **{name: f"loading=Loading({name}=...)" for name in ("revision", "token", "cache_dir", "dtype", "device_map")},
    "place_drafters": "loading=Loading(place=...)",
}
#: The policy keywords (``verify_cost``, ``lookup``, ``cost_aware``, ``maxgram_first``), and where they are now
#: (with a note where the meaning needs one).
POLICY_KEYWORDS = {
    "verify_cost": (
        "policy=Policy(verify_cost=...)",
        "verify_cost=None, the paper's shape, is Policy(cost_aware=False)",
    ),
    "lookup": "policy=Policy(lookup=...)",
    "cost_aware": "policy=Policy(cost_aware=...)",
    "maxgram_first": (
        "policy=Policy(lookup=...)",
        "Max-Gram's match first, unreviewed; Policy.paper(): the paper's order",
    ),
}


def rejects_moved(
    settings: type | None, *names: str, loading: bool = False, policy: bool = False, **others: str
) -> Callable:
    """Decorates an assistant's ``__init__``: a keyword it took before its options became data raises ``TypeError``
    naming the new place. ``names``: old keywords that are now fields of ``settings`` (the assistant's
    ``settings=``) under the same name; ``loading`` / ``policy``: it took the keywords of :data:`LOADING_KEYWORDS` /
    :data:`POLICY_KEYWORDS`; ``others``: any other old keyword and its place, as written after the model
    (``cape_sizes="settings=GlideSettings(cape=CapeSettings(sizes=...))"``). The signature seen by ``inspect``
    stays the ``__init__``'s own."""
    known = {f.name for f in fields(settings)} if settings is not None else set()
    assert all(n in known for n in names), (settings, names)
    moved: dict[str, str | tuple[str, str]] = {n: f"settings={settings.__name__}({n}=...)" for n in names}
    moved.update({**(LOADING_KEYWORDS if loading else {}), **(POLICY_KEYWORDS if policy else {}), **others})

    def decorate(init: Callable) -> Callable:
        params = inspect.signature(init).parameters
        clash = [k for k in moved if k in params]
        assert not clash, f"{init.__qualname__} still takes {clash}"

        @functools.wraps(init)
        def checked(self, *args, **kwargs):
            old = [k for k in kwargs if k in moved]
            if old:
                name = type(self).__name__
                lines = []
                for k in old:
                    place, note = moved[k] if isinstance(moved[k], tuple) else (moved[k], None)
                    lines.append(f"{name}({k}=...) is now {name}(..., {place})" + (f" [{note}]" if note else ""))
                raise TypeError("; ".join(lines) + f". The options are grouped as data: see help({name}).")
            return init(self, *args, **kwargs)

        return checked

    return decorate


__all__ = ["LOADING_KEYWORDS", "POLICY_KEYWORDS", "Loading", "Options", "Policy", "rejects_moved"]
