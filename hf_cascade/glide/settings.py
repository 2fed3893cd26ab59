"""GLIDE's own settings (:class:`GlideSettings`): the shape of its draft, apart from the drafter that runs it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..options import Options
from .cape import CapeSettings


@dataclass(frozen=True)
class GlideSettings(Options):
    """The shape of GLIDE's draft (Du et al., ICML 2024). The defaults are the paper's GLIDE + CAPE: a main path of
    ``gamma = 5`` tokens expanded by CAPE's ``S(p)`` (7, 5, 3, 1 siblings); :meth:`chain` is the paper's GLIDE
    alone. What is drafted and verified beyond that shape, on the running machine, is the assistant's
    :class:`~hf_cascade.options.Policy`.

    Attributes:
        draft_length: main-path tokens per step (``gamma``; the paper evaluates GLIDE with 5).
        cape: CAPE's expansion (:class:`~hf_cascade.glide.cape.CapeSettings`: ``S(p)``, a cap on the tree's nodes,
            a floor on the siblings' path probability); ``True``: the paper's, ``None`` or ``False``: no expansion
            (a chain).
        min_confidence: the main path stops at the first token the draft gives probability ``< min_confidence``
            (0 = never, the paper's fixed ``gamma``). A chain does not verify that unsure token; with CAPE it is
            verified with its expansion set, the position where siblings are most likely to be needed, if its path
            probability (its ``p`` times the main confidences above it) reaches CAPE's ``min_prob``, the floor of
            the siblings. Not in the paper: for CPUs, where every verified node costs.
    """

    draft_length: int = 5
    cape: CapeSettings | None = field(default_factory=CapeSettings)
    min_confidence: float = 0.0

    def __post_init__(self) -> None:
        cape = CapeSettings() if self.cape is True else None if self.cape is False else self.cape
        if cape is not None and not isinstance(cape, CapeSettings):
            raise TypeError(f"cape must be a CapeSettings, True or False/None, got {type(cape).__name__}")
        if int(self.draft_length) < 1:
            raise ValueError(f"draft_length must be >= 1, got {self.draft_length}")
        if not 0.0 <= float(self.min_confidence) <= 1.0:
            raise ValueError(f"min_confidence must be in [0, 1], got {self.min_confidence}")
        object.__setattr__(self, "cape", cape)
        self._normalize(draft_length=int, min_confidence=float)

    @classmethod
    def chain(cls, draft_length: int = 5, min_confidence: float = 0.0) -> GlideSettings:
        """The paper's GLIDE without CAPE: a chain of ``draft_length`` tokens."""
        return cls(draft_length, None, min_confidence)


__all__ = ["GlideSettings"]
