"""Drawn drafts: a main path *sampled* from the drafter's distribution ``q``, verified exactly, used when it pays.

Under sampling a deterministic draft token ``x`` (the drafter's argmax) is accepted with the target's probability
``p(x)``; a token drawn from ``q`` is accepted with ``min(1, p(x) / q(x))``, on average ``sum_x min(p(x), q(x))``,
the overlap of the two distributions (Leviathan et al., 2023, Section 3.5; Chen et al., 2023). Which is larger
depends on the drafter: the overlap when ``q`` is close to ``p``, the argmax's ``p(x)`` when ``q`` is more spread
than ``p`` (a small drafter at a low temperature). :class:`ProposalChoice` measures both at the first position of
every verified draft, from the same target row, and the drafter draws only while drawing is ahead.

A drawn tree is verified by :func:`~hf_cascade.core.accept.sampling_tree_accept` as SpecInfer's multi-step
speculative sampling (Miao et al., 2024, Section 4) with one stochastic candidate per node followed by point
masses. Three rules keep it exact; each drafter that draws follows them:

1. **The row handed to verification is the distribution the token was drawn from** (:func:`draw`). It is the
   drafter's softmax after the target's *warpers* (temperature, top-k, top-p, min-p, typical, epsilon, eta:
   :func:`warpers`), which reshape a row without reading the sequence, so a drafter can apply them over its
   own reduced vocabulary; penalties and constraints stay on the target's side (``q`` is then further from
   ``p``, which costs acceptance, never exactness: any ``q`` is exact when it is what the token was drawn from).
2. **Whether a drawn node is verified never depends on its own token** (only on its ancestors): a node kept
   only when its token looks likely is no longer a draw from ``q``. So a drawn main path's length is decided
   before each draw, from the draft's confidence ``max q`` (a property of the distribution, not of the draw),
   and budget pruning keeps every drawn node (:func:`keep_drawn`).
3. **Deterministic siblings come after the drawn child** in node order: each is the point mass
   ``q = delta(x)`` (a one-hot row, :func:`tree_draft_probs`); they may depend on the drawn token (e.g. the
   next-best tokens other than it) because every candidate may depend on the ones tried before it.

:class:`ProposalChoice` decides from earlier steps only, never from the current draw: exactness holds whatever it
decides.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList
from transformers.generation import logits_process

from .categorical import categorical
from .structure import TokenTree

#: transformers' warpers that read neither the sequence nor vocabulary ids (those present in this version)
WARPERS = tuple(
    getattr(logits_process, name)
    for name in (
        "TemperatureLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
        "MinPLogitsWarper",
        "TypicalLogitsWarper",
        "EpsilonLogitsWarper",
        "EtaLogitsWarper",
        "TopHLogitsWarper",
    )
    if hasattr(logits_process, name)
)


def warpers(processors: LogitsProcessorList | None) -> LogitsProcessorList:
    """The processors of ``processors`` a drafter applies to its own rows (rule 1), in their order."""
    return LogitsProcessorList(p for p in processors or [] if isinstance(p, WARPERS))


def draw(
    warpers: LogitsProcessorList, logits: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One draw from ``logits`` (``[N]``, raw, over any vocabulary): ``(index [], q [N])``, ``q`` the softmax of
    the row after ``warpers`` (rule 1). Nothing is read from an accelerator
    (:func:`~hf_cascade.core.categorical.categorical`)."""
    q = warped(warpers, logits)
    return categorical(q, generator), q


def warped(warpers: LogitsProcessorList, logits: torch.Tensor) -> torch.Tensor:
    """``[N]`` the softmax of ``logits`` (``[N]``) after ``warpers``: what :func:`draw` draws from."""
    scores = logits.float()[None]
    if len(warpers):
        scores = warpers(scores.new_zeros(1, 0, dtype=torch.long), scores.clone())
    return scores[0].softmax(dim=-1)


def keep_drawn(kept: list[bool], drawn: int) -> list[bool]:
    """A budget's choice of nodes with the first ``drawn`` (the drawn main path, nodes ``0 .. drawn - 1``)
    kept whatever it chose (rule 2); the other nodes as it chose. Still closed under ancestors when the
    budget's choice was: the drawn nodes are each other's ancestors."""
    return [True] * drawn + list(kept[drawn:])


def tree_draft_probs(
    tree: TokenTree, drawn_rows: torch.Tensor, vocab_size: int | None = None, columns: torch.Tensor | None = None
) -> torch.Tensor:
    """``draft_probs`` ``[n, V]`` of a tree whose first ``m`` nodes were drawn from ``drawn_rows`` (``[m, N]``, node
    order) and whose other nodes are deterministic (one-hot rows, rule 3), on ``drawn_rows``' device. ``columns``
    (``[N]``): the target id of each column of ``drawn_rows`` (a drafter's reduced vocabulary; ``None``: the
    columns are the target's ids, ``V = N``); ``vocab_size``: ``V`` (default ``N``)."""
    m, n = drawn_rows.shape[0], tree.num_nodes
    if m > n:
        raise ValueError(f"{m} drawn rows for a tree of {n} nodes")
    size = drawn_rows.shape[1] if vocab_size is None else int(vocab_size)
    out = drawn_rows.new_zeros(n, size, dtype=torch.float32)
    if columns is None:
        out[:m] = drawn_rows
    else:
        out[:m].index_copy_(1, columns.to(out.device), drawn_rows.float())
    if n > m:
        rows = torch.arange(m, n, device=out.device)
        out[rows, tree.tokens[m:].to(out.device)] = 1.0
    return out


class ProposalChoice:
    """Per ``generate()`` call: at each main-path position, draw from ``q`` or take its argmax, whichever the
    target is expected to accept more often there. The choice is kept per bucket of the drafter's confidence
    ``max q`` (``bounds``; CAPE's bins by default): the argmax wins where the target is sharper than the drafter
    (a sure continuation), a draw can win where both are spread alike. The confidence is a property of the
    distribution, not of the draw, so choosing by it keeps rule 2 (a node's mode, like its presence, never
    depends on its own token).

    Both modes are measured at every drafted step from the same target row at the draft's first position (so
    the mode not in use is measured too), with ``K`` the deterministic siblings the first level carries (CAPE's
    expansion set; 0 for a chain) and ``T`` the ``K + 1`` tokens ``q`` ranks first:

    * argmax (its siblings are the next ``K``): ``sum_{x in T} p(x)``;
    * a draw ``x ~ q``, its siblings the best ``K`` other than ``x`` (``T`` less ``x`` when ``x`` is in ``T``,
      else the first ``K`` of ``T``): accepted with ``min(1, p(x) / q(x))``; on rejection (probability
      ``max(0, q(x) - p(x)) / q(x)``) the siblings are tried against the residual ``r = norm(max(0, p - q))``,
      whose value at ``x`` is then 0. In expectation over ``x``:
      ``a + (1 - a) * r(T) - d * r(t_K)``, with ``a = sum_x min(p(x), q(x))`` (the overlap),
      ``r(T) = sum_{y in T} r(y)``, ``t_K`` the last of ``T`` and ``d = sum_{x not in T} max(0, q(x) - p(x))``.

    Each an exponential moving average per bucket (``decay``; both from the same steps, so their difference is
    paired); a bucket takes the argmax (the drafter's behaviour without this choice) until measured. Measuring at
    the first level only is not in any paper: it is the cheapest measure both modes share (one row each, one
    device read per step); deeper positions are assumed to behave like first ones of the same confidence, and
    the budget's pruning of siblings is not modelled."""

    def __init__(self, bounds: tuple[float, ...] = (0.3, 0.6, 0.8), decay: float = 0.95):
        self.bounds, self.decay = tuple(float(b) for b in bounds), float(decay)
        self.rate: list[dict[str, float | None]] = [{"argmax": None, "draw": None} for _ in range(len(bounds) + 1)]
        self._pending: list[tuple[torch.Tensor, int]] = []  # deferred observations: (device pair, bucket)

    def bucket(self, confidence: float) -> int:
        """The bucket of a confidence (``(0, b_0]`` is 0, ``(b_0, b_1]`` is 1, ...)."""
        return sum(confidence > b for b in self.bounds)

    def draws(self, confidence: float | None = None) -> bool:
        """Whether a position of this confidence is drawn (``None``: whether any bucket draws)."""
        buckets = self.rate if confidence is None else [self.rate[self.bucket(confidence)]]
        return any(_ahead(r) for r in buckets)

    def table(self, device) -> torch.Tensor | None:
        """``[buckets]`` bool on ``device``: which buckets draw (index it with ``torch.bucketize(confidence,
        bounds)``: no device read); ``None`` when none does."""
        if not self.draws():
            return None
        return torch.tensor([_ahead(r) for r in self.rate], dtype=torch.bool, device=device)

    def observe(
        self,
        p: torch.Tensor,
        q: torch.Tensor,
        columns: torch.Tensor | None = None,
        siblings: int = 0,
        confidence: float | None = None,
        defer: bool = False,
    ) -> None:
        """One drafted step: ``p`` ``[V]`` the target's processed distribution at the draft's first position,
        ``q`` ``[N]`` the drafter's (warped) distribution there, ``columns`` ``[N]`` its columns' target ids
        (``None``: ``N = V``), ``siblings`` the deterministic siblings of the first level, ``confidence`` the
        drafter's (unwarped) ``max q`` there, its bucket (``None``: the last). One device read, or none with
        ``defer``: the measure stays on the device until the drafter's next read carries it (:meth:`pending`,
        :meth:`settle`), so the choice at a step uses the measures up to the step before the last. The choice
        only ever reads earlier steps, so what is drawn stays exact either way (rule 2)."""
        p = p.float() if columns is None else p.float().index_select(0, columns.to(p.device))
        q = q.to(p.device).float()
        k = max(0, min(int(siblings), q.shape[0] - 1))
        top = q.topk(k + 1).indices  # [K + 1] T: q's best first
        overlap = torch.minimum(p, q).sum()
        residual = (p - q).clamp_min(0.0)
        residual = residual / residual.sum().clamp_min(1e-30)
        excess = (q - p).clamp_min(0.0)  # rejection weight of each draw
        outside = excess.sum() - excess[top].sum()  # d: draws outside T
        drawn = overlap + (1.0 - overlap) * residual[top].sum() - outside * residual[top[-1]]
        pair, bucket = (
            torch.stack([p[top].sum(), drawn]).double(),
            self.bucket(confidence) if confidence is not None else -1,
        )
        if defer:
            self._pending.append((pair, bucket))
        else:
            self._update(bucket, *pair.tolist())

    def pending(self) -> torch.Tensor | None:
        """The deferred measures, ``[2 * n]`` float64 on the device, for the caller's next read (``None``: none)."""
        return torch.cat([pair for pair, _ in self._pending]) if self._pending else None

    def settle(self, values: list[float]) -> None:
        """Apply the deferred measures, read by the caller as ``values`` (:meth:`pending`'s, in its order)."""
        if len(values) != 2 * len(self._pending):
            raise ValueError(f"{len(values)} values for {len(self._pending)} pending measures")
        for i, (_, bucket) in enumerate(self._pending):
            self._update(bucket, values[2 * i], values[2 * i + 1])
        self._pending = []

    def _update(self, bucket: int, argmax: float, drawn: float) -> None:
        rate = self.rate[bucket]
        for name, value in (("argmax", argmax), ("draw", drawn)):
            old = rate[name]
            rate[name] = value if old is None else self.decay * old + (1 - self.decay) * value


def _ahead(rate: dict[str, float | None]) -> bool:
    """A bucket draws once both modes were measured and the draw's expected acceptance is higher."""
    return rate["draw"] is not None and rate["argmax"] is not None and rate["draw"] > rate["argmax"]


__all__ = ["ProposalChoice", "WARPERS", "draw", "keep_drawn", "tree_draft_probs", "warped", "warpers"]
