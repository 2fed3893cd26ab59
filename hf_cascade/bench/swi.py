"""Standardized walltime improvement (SWI): the speedup over plain decoding when every model forward costs a
fixed, stated amount, so the number does not depend on the machine's noise.

CS Drafting (Chen et al., 2024, Section 5.1, "Metrics") defines it: *"Standardized walltime improvement
(SWI) assumes each forward run of a model takes a constant amount of time which can be recorded data of
previous work or heuristics such as the total number of the parameters of a model. Under this assumption,
the value of SWI is the speedup of the speculative method over autoregressive generation."* Their Table 2
reports two: the forward cost is the model's parameter count ("model size"), or a time from earlier work.
Their code charges every model call its constant (the target's review of a whole draft is one call) and
Max-Gram nothing.

The rule here, per generation (all costs in units of one target forward):

* **plain** ``generate`` runs one target forward per new token (the prompt's forward emits the first):
  standardized time ``= new_tokens`` (:func:`plain_time`);
* a **method** is charged ``prefill_calls`` target forwards over the prompt alone (hf_cascade's core runs
  the prompt minus its last token first; transformers' assisted loop has none, its first verification
  runs the prompt) at 1 each, plus ``target(n)`` for each verification of ``n`` draft nodes (``n + 1``
  rows; ``draft_len_per_call``), plus, for each drafter level, ``per_forward`` per forward and
  ``per_extra_token`` per token beyond the first of a forward (``forward_calls``, ``forward_tokens``)
  (:func:`standardized_time`). Statistical drafters (Max-Gram, prompt lookup) run no forwards: they cost 0.
  The target's prompt tokens count as one row wherever they run (plain's first forward, the core's prefill,
  the first verification of transformers' loop): every method runs the same prompt, and the verification
  profile is measured after one. A drafter's prompt tokens are its own cost (its ``forward_tokens``);
* the **SWI** of a method over a set of prompts is plain's standardized time per generated token over the
  method's, each summed over the prompts where both ran (:func:`swi`), as the wall-time ``speedup`` compares
  seconds per token. Greedy outputs are identical, so this is the ratio of the summed times; sampled outputs
  end at different lengths, and a generation that stopped early is not cheaper per token for it.

Two cost models (:data:`COST_MODELS`; :mod:`hf_cascade.bench.costs` builds the tables from the loaded models):

* ``"params"``: a forward costs its model's parameter count, a target verification of any number of rows
  one target forward (the paper's "model size" SWI): ``target(n) = 1``, a drafter ``P_drafter / P_target``
  per forward whatever its rows;
* ``"measured"``: this machine's costs: ``target(n)`` is the measured relative cost of verifying ``n``
  nodes (:class:`~hf_cascade.core.payoff.VerifyCost`), a drafter's forward its measured time over that of a
  one-token target forward, plus a measured slope per extra token.

Everything here is a pure function of a record's statistics (the dict of
:meth:`~hf_cascade.GenerationStats.to_dict`) and a :class:`Costs` table: no model, no clock. A method whose
statistics lack a count, or whose drafter has no known cost, gets ``None`` (unavailable), never a guess.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

#: The cost models of ``hf-cascade bench --cost-model``.
COST_MODELS = ("params", "measured")


@dataclass(frozen=True)
class DrafterCost:
    """What one forward of a drafter level costs, in target forwards: ``per_forward`` for a forward of one
    token (row), ``per_extra_token`` for each further token it runs (catch-up tokens, a review's draft,
    beams). ``note`` says what was counted (e.g. a head that computes its logits with the target's LM head)."""

    name: str
    per_forward: float
    per_extra_token: float = 0.0
    note: str = ""

    def __post_init__(self) -> None:
        if self.per_forward < 0 or self.per_extra_token < 0:
            raise ValueError(f"drafter costs must be >= 0, got {self.per_forward}, {self.per_extra_token}")

    def __call__(self, forwards: int, tokens: int) -> float:
        """Cost of ``forwards`` forwards that ran ``tokens`` tokens in all."""
        return self.per_forward * forwards + self.per_extra_token * max(tokens - forwards, 0)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "per_forward": self.per_forward,
            "per_extra_token": self.per_extra_token,
            "note": self.note,
        }


#: A statistical drafter (Max-Gram, corpus n-grams, prompt lookup): no forward, no cost.
STATISTICAL = DrafterCost("statistical", 0.0)


@dataclass(frozen=True)
class Costs:
    """One method's costs under one cost model.

    Attributes:
        target: ``n -> `` cost of one verification of ``n`` draft nodes (a
            :class:`~hf_cascade.core.payoff.VerifyCost` or any callable; ``target(0) = 1``).
        drafters: one entry per level of the method's statistics (top first, as ``stats["levels"]``);
            ``None``: a model whose cost is unknown (its forwards make the SWI unavailable).
        unavailable: why this method's SWI cannot be computed (then every standardized time is ``None``).
    """

    target: Callable[[int], float]
    drafters: tuple[DrafterCost | None, ...] = ()
    unavailable: str | None = None

    def to_dict(self) -> dict:
        return {
            "drafters": [d.to_dict() if d is not None else None for d in self.drafters],
            **({"unavailable": self.unavailable} if self.unavailable else {}),
        }


def flat_target(n: int) -> float:
    """The ``params`` model's target: a verification of any number of rows is one forward."""
    return 1.0


def plain_time(new_tokens: int) -> float:
    """Standardized time of plain ``generate``: one target forward per new token."""
    return float(new_tokens)


def standardized_time(stats: Mapping | None, costs: Costs) -> float | None:
    """Standardized time (target forwards) of one generation from its statistics (see the module docstring);
    ``None`` when the statistics lack a count this needs (``prefill_calls``, ``draft_len_per_call`` with one
    entry per target call, the levels' forward counts) or a drafter that ran has no known cost."""
    if stats is None or costs.unavailable is not None:
        return None
    calls, nodes, prefill = stats.get("target_calls"), stats.get("draft_len_per_call"), stats.get("prefill_calls")
    if calls is None or nodes is None or prefill is None or len(nodes) != calls:
        return None
    time = float(prefill) + sum(float(costs.target(int(n))) for n in nodes)
    levels = stats.get("levels", [])
    if len(levels) != len(costs.drafters):
        return None
    for level, cost in zip(levels, costs.drafters):
        forwards = level.get("forward_calls")
        if forwards is None:
            return None
        if forwards == 0:
            continue
        tokens = level.get("forward_tokens")
        if cost is None or (tokens is None and cost.per_extra_token > 0):
            return None
        time += cost(int(forwards), int(tokens if tokens is not None else forwards))
    return time if time > 0 else None


def swi(pairs: Iterable[tuple[float | None, float | None]], tokens: tuple[int, int] | None = None) -> float | None:
    """``sum(plain) / sum(method)`` over ``(plain standardized time, method standardized time)`` pairs of
    the same prompts; ``None`` when there is no pair or any time is unavailable. ``tokens``: the tokens plain
    and the method generated over those prompts (``(plain, method)``); the ratio is then of times per
    generated token (sampled outputs differ in length; under greedy decoding the two counts are equal)."""
    pairs = list(pairs)
    if not pairs or any(p is None or m is None for p, m in pairs):
        return None
    plain, method = sum(p for p, _ in pairs), sum(m for _, m in pairs)
    if method <= 0:
        return None
    if tokens is None:
        return plain / method
    plain_tokens, method_tokens = tokens
    return (plain / plain_tokens) / (method / method_tokens) if plain_tokens > 0 and method_tokens > 0 else None


def record_times(record: Mapping, costs: Mapping[str, Costs] | None, one_forward_per_token: bool) -> dict:
    """``{cost model: standardized time | None}`` of one bench record (its ``new_tokens`` and ``stats``):
    :func:`plain_time` for methods that run one target forward per token (plain ``generate``), else
    :func:`standardized_time` with the method's :class:`Costs` per cost model (``None`` without them)."""
    out = {}
    for model, table in (costs or {}).items():
        if one_forward_per_token:
            out[model] = plain_time(record["new_tokens"]) if record["new_tokens"] > 0 else None
        else:
            out[model] = standardized_time(record.get("stats"), table) if table is not None else None
    return out


def group_swi(pairs: Sequence[tuple[Mapping, Mapping]], models: Sequence[str]) -> dict:
    """``{cost model: SWI | None}`` of (plain record, method record) pairs whose ``standardized_time`` dicts
    :func:`record_times` filled, per generated token (their ``new_tokens``)."""
    tokens = (sum(p["new_tokens"] for p, _ in pairs), sum(r["new_tokens"] for _, r in pairs))
    return {
        m: swi(
            ((p.get("standardized_time", {}).get(m), r.get("standardized_time", {}).get(m)) for p, r in pairs), tokens
        )
        for m in models
    }


__all__ = [
    "COST_MODELS",
    "STATISTICAL",
    "Costs",
    "DrafterCost",
    "flat_target",
    "group_swi",
    "plain_time",
    "record_times",
    "standardized_time",
    "swi",
]
