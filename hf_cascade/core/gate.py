"""Whether a batched step drafts at all: drafting must pay over the whole batch, on the running machine.

Each row's drafter sizes its own draft from its own acceptance and cost, but in a batch every row's
verification widens to the widest draft, and where the forward is compute-bound (a CPU, a GPU at a large
batch) a wider batched forward can cost more than the accepted tokens bring. :class:`DraftGate` measures,
within one ``generate()`` call, the batch's tokens per second per row on steps where some row drafted and on
plain steps (no row drafted), and lets the rows draft only while drafting is at least as fast. It starts by
drafting, takes one plain step to measure the other side, and while refusing drafts every
``explore_every``-th step anyway (acceptance changes with the text). Not in any paper: it is the batch-level
form of the rule the single-row defaults already follow (draft only what pays for its verification,
:mod:`hf_cascade.core.adapt`, :mod:`hf_cascade.drafters.lookahead`).

The times are host wall times of whole steps (draft, verify, accept, update), each ending after acceptance
read the device, so the device is synchronised. Decisions depend on past timings only, never on random
draws: greedy outputs stay exact and sampling stays lossless whatever the gate decides.
"""

from __future__ import annotations


class DraftGate:
    """Per call: drafted vs plain throughput of a batch (see the module docstring)."""

    def __init__(self, explore_every: int = 8, decay: float = 0.7):
        self.explore_every, self.decay = int(explore_every), float(decay)
        self.rate: dict[bool, float | None] = {True: None, False: None}   # tokens / (second x row), EMA
        self.refused = 0

    def allows(self) -> bool:
        """Whether the rows may draft at this step."""
        drafted, plain = self.rate[True], self.rate[False]
        if drafted is None:
            return True                                   # start by drafting
        if plain is None:
            return False                                  # then measure one plain step
        if drafted >= plain:
            return True
        self.refused += 1
        return self.explore_every > 0 and self.refused % self.explore_every == 0

    def observe(self, drafted: bool, tokens: int, seconds: float, rows: int) -> None:
        """One step: whether any row drafted, the tokens it emitted over the batch, its wall time, its rows."""
        if seconds <= 0 or rows <= 0:
            return
        rate = tokens / (seconds * rows)
        old = self.rate[drafted]
        self.rate[drafted] = rate if old is None else self.decay * old + (1 - self.decay) * rate


__all__ = ["DraftGate"]
