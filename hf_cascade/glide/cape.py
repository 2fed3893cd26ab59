"""CAPE, Confidence-Aware Proposal Expansion (Du et al., ICML 2024, "GLIDE with a CAPE", Section 4.2 and
Appendix A, Algorithms 1-2).

The draft proposes a main path ``x_{t+1} .. x_{t+gamma}`` greedily. At step ``i`` its confidence is
``p_i = max p_D(. | x_{<t+i})``; a step function ``S(p_i)`` gives the size ``K_i`` of the expansion set
``X_i``: the ``K_i`` next-best tokens of the same distribution, excluding ``x_{t+i}``. Expansion tokens are
leaves: siblings of ``x_{t+i}`` that nothing is drafted after. The linearized proposal
``[main, X_0, X_1, ...]``, its position ids (``input_pi``: ``i`` for ``x_{t+i}`` and for every token of
``X_i``) and the verification mask (each token sees the main tokens before its position, and itself) are
those of :func:`cape_tree` (see there for the erratum in Algorithm 2).

``S`` (:class:`CapeSettings`): Section 4.2 sets 7, 5, 3, 1 for ``p`` in ``(0, .3]``, ``(.3, .6]``,
``(.6, .8]``, ``(.8, 1]``. Algorithm 1 writes it as a bin array over ``floor(10 p)`` whose entries count
the argmax too (``topk(p, 8)`` = the argmax + 7 others), and the authors' run script uses
``--bin 8 8 8 6 6 6 4 4 2 2 2 2``: the same four sizes with the boundaries at ``floor``-rounded deciles
(``p = 0.3`` falls in the second bin there, in the first here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..core import TokenTree
from ..placement import defer_reads


@dataclass(frozen=True)
class CapeSettings:
    """The expansion-size function ``S(p)`` of CAPE and a cap on the verified tree.

    Attributes:
        sizes: ``K`` for each confidence bin, lowest confidence first (paper: ``(7, 5, 3, 1)``).
        thresholds: the increasing upper bounds of every bin but the last (paper: ``(0.3, 0.6, 0.8)``):
            ``p`` in ``(0, t_0]`` -> ``sizes[0]``, ``(t_0, t_1]`` -> ``sizes[1]``, ..., ``(t_last, 1]`` ->
            ``sizes[-1]``.
        max_nodes: most tree nodes (main path + expansions) sent to the target, ``None`` = no cap. Expansion
            tokens of early steps are kept first (a deeper one only matters if every main token above it
            is accepted). The paper verifies at most 32 tokens per step.
        min_prob: leave out expansion tokens whose path the draft gives probability ``< min_prob`` (0 = the
            paper's CAPE): the token's own probability times the confidences of the main tokens above it,
            the draft's estimate that the target accepts it. Not in the paper: where every verified node costs a
            noticeable share of a target forward (a CPU, far more than the paper's GPUs; measured in
            ``docs/design.md``), a sibling the draft itself finds unlikely costs more than it is expected to
            return.
    """

    sizes: tuple[int, ...] = (7, 5, 3, 1)
    thresholds: tuple[float, ...] = (0.3, 0.6, 0.8)
    max_nodes: int | None = None
    min_prob: float = 0.0

    def __post_init__(self) -> None:
        sizes, thresholds = tuple(int(s) for s in self.sizes), tuple(float(t) for t in self.thresholds)
        if len(sizes) != len(thresholds) + 1:
            raise ValueError(
                f"CAPE needs one size per confidence bin: {len(thresholds)} thresholds make "
                f"{len(thresholds) + 1} bins, got sizes {sizes}"
            )
        if any(s < 0 for s in sizes):
            raise ValueError(f"CAPE expansion sizes must be >= 0, got {sizes}")
        if any(not 0.0 < t < 1.0 for t in thresholds) or any(b <= a for a, b in zip(thresholds, thresholds[1:])):
            raise ValueError(f"CAPE thresholds must increase strictly inside (0, 1), got {thresholds}")
        if self.max_nodes is not None and int(self.max_nodes) < 1:
            raise ValueError(f"max_nodes must be >= 1 or None, got {self.max_nodes}")
        if not 0.0 <= float(self.min_prob) < 1.0:
            raise ValueError(f"min_prob must be in [0, 1), got {self.min_prob}")
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "thresholds", thresholds)

    @property
    def max_size(self) -> int:
        return max(self.sizes)

    def expansion_sizes(self, confidence: torch.Tensor) -> torch.Tensor:
        """``S(p)``: ``[k]`` confidences (the draft's max probability at each step) -> ``[k]`` LongTensor ``K_i``."""
        confidence = torch.as_tensor(confidence, dtype=torch.float32)
        key = (self.thresholds, self.sizes, confidence.device)
        tables = _TABLES.get(key)  # made once per settings and device
        if tables is None:
            tables = _TABLES[key] = (
                torch.tensor(self.thresholds, dtype=torch.float32, device=confidence.device),
                torch.tensor(self.sizes, dtype=torch.long, device=confidence.device),
            )
        bounds, sizes = tables
        return sizes[torch.bucketize(confidence, bounds, right=False)]  # p <= t_0 -> bin 0, ...


_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # (thresholds, sizes, device) -> S(p)'s bounds, sizes


def expansion_sets(
    probs: torch.Tensor, main: torch.Tensor, sizes: torch.Tensor, min_prob: float = 0.0
) -> list[torch.Tensor]:
    """The expansion sets ``X_i`` of Section 4.2.

    Args:
        probs: ``[k, N]`` the draft's distribution at each main step (any scores with the same order work).
        main: ``[k]`` the main path's ids (in the same id space as ``probs``' columns).
        sizes: ``[k]`` the wanted ``K_i`` (e.g. :meth:`CapeSettings.expansion_sizes`).
        min_prob: drop ids whose path probability ``probs[i, x] * prod_{j < i} probs[j, main[j]]`` is below
            it (0: keep all).

    Returns ``k`` LongTensors: the ``min(K_i, N - 1)`` highest-probability ids of row ``i`` other than
    ``main[i]``, best first (ties: ``torch.topk``'s order), less those below ``min_prob``.
    """
    return [
        torch.tensor(x, dtype=torch.long, device=probs.device) for x in expansion_lists(probs, main, sizes, min_prob)
    ]


def expansion_lists(
    probs: torch.Tensor, main: torch.Tensor, sizes: torch.Tensor, min_prob: float = 0.0, max_size: int | None = None
) -> list[list[int]]:
    """:func:`expansion_sets` as lists of ids, computed on ``probs``' device and read in one transfer
    (``max_size``: an upper bound of ``sizes``, e.g. :attr:`CapeSettings.max_size`, saves reading it; the
    ``topk`` then runs wider, which can order tied probabilities differently)."""
    return _read_expansions(probs, main, sizes, min_prob, max_size)[0]


def _read_expansions(
    probs: torch.Tensor,
    main: torch.Tensor,
    sizes: torch.Tensor,
    min_prob: float = 0.0,
    max_size: int | None = None,
    to_target=None,
) -> tuple[list[list[int]], list[list[float]], list[list[int]]]:
    """:func:`expansion_lists`, with each set's draft probabilities and target ids (``to_target`` applied on the
    device; the draft ids when ``None``), all in the one read (ids are exact in float64)."""
    flat, layout = expansion_read(probs, main, sizes, min_prob, max_size, to_target)
    return parse_expansions(flat.tolist(), layout)  # the one read


def expansion_read(
    probs: torch.Tensor,
    main: torch.Tensor,
    sizes: torch.Tensor,
    min_prob: float = 0.0,
    max_size: int | None = None,
    to_target=None,
) -> tuple[torch.Tensor, tuple]:
    """The expansion sets of :func:`_read_expansions` as one float64 tensor still on the device, and its layout for
    :func:`parse_expansions`: a caller may read it together with what it reads anyway. Row ``i``'s set depends on
    rows ``0 .. i`` only (its size and its path-probability floor), so the first ``m`` sets of ``k`` rows are those
    of the first ``m`` rows."""
    parts, layout = expansion_parts(probs, main, sizes, min_prob, max_size, to_target)
    return torch.cat(parts), layout


def expansion_parts(
    probs: torch.Tensor,
    main: torch.Tensor,
    sizes: torch.Tensor,
    min_prob: float = 0.0,
    max_size: int | None = None,
    to_target=None,
    conf: torch.Tensor | None = None,
) -> tuple[list[torch.Tensor], tuple]:
    """:func:`expansion_read`'s tensor as the parts that ``torch.cat`` joins into it (their last is float64, so the
    join is float64: ids and flags exactly), for a caller that joins them with parts of its own, and the layout.
    ``conf``: the rows' probabilities of ``main`` when the caller has them (read only for a path floor,
    ``min_prob > 0``). The path floor's flags and the target ids are left out where they say nothing
    (``min_prob <= 0``; ``to_target=None``: the target ids are the draft ids)."""
    k, n = probs.shape
    if main.shape != (k,) or sizes.shape != (k,):
        raise ValueError(f"main and sizes must be [k] = [{k}], got {tuple(main.shape)} and {tuple(sizes.shape)}")
    main, sizes = _long_on(main, probs.device), _long_on(sizes, probs.device)
    bound = (int(max_size) if max_size is not None else int(sizes.max())) if k else 0
    width = min(bound + 1, n)
    top = probs.topk(width, dim=-1).indices  # [k, width]
    top_p = probs.gather(1, top)  # [k, width]
    parts = [top.flatten(), sizes, main]
    floor = min_prob > 0
    if floor:
        conf = probs.gather(1, main[:, None])[:, 0] if conf is None else conf  # [k] p_i of the main tokens
        reach = torch.cat([conf.new_ones(1), conf.cumprod(0)[:-1]])  # [k] prod_{j<i} p_j
        parts.append((top_p * reach[:, None] >= min_prob).flatten())  # [k * width] path prob >= floor
    if to_target is not None:
        parts.append(to_target(top.flatten()).reshape(-1).to(probs.device))
    parts.append(top_p.flatten().double())
    return parts, (k, n, width, min_prob, floor, to_target is not None)


def _long_on(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``x`` as a LongTensor on ``device`` (itself when it is one there)."""
    return x if x.dtype == torch.long and x.device == device else x.to(device).long()


def parse_expansions(
    flat: Sequence[float],
    layout: tuple,
    rows: int | None = None,
) -> tuple[list[list[int]], list[list[float]], list[list[int]]]:
    """The host lists of :func:`expansion_read`'s tensor (read by the caller): the sets of the first ``rows`` rows
    (all by default), their draft probabilities and their target ids."""
    k, n, width, min_prob, floor, mapped = layout
    kw = k * width
    top_h, sizes_h, main_h = flat[:kw], flat[kw : kw + k], flat[kw + k : kw + 2 * k]
    at = kw + 2 * k
    ok_h = flat[at : at + kw] if floor else None
    at += kw if floor else 0
    mapped_h = flat[at : at + kw] if mapped else top_h
    at += kw if mapped else 0
    p_h = flat[at : at + kw]
    sets, set_probs, set_targets = [], [], []
    for i in range(k if rows is None else min(rows, k)):
        ids, probs, targets = [], [], []
        size, main, taken = min(int(sizes_h[i]), n - 1), main_h[i], 0
        for j in range(i * width, (i + 1) * width):  # the first ``size`` ids but the main one, above the floor
            if taken >= size:
                break
            if top_h[j] == main:
                continue
            taken += 1
            if floor and not ok_h[j]:
                continue
            ids.append(int(top_h[j]))
            probs.append(p_h[j])
            targets.append(int(mapped_h[j]))
        sets.append(ids)
        set_probs.append(probs)
        set_targets.append(targets)
    return sets, set_probs, set_targets


def cap_expansions(expansions: Sequence[torch.Tensor], main_len: int, max_nodes: int | None) -> list[torch.Tensor]:
    """Cut the expansion sets so that ``main_len + sum |X_i| <= max_nodes``, earliest steps first."""
    if max_nodes is None:
        return list(expansions)
    room = max(int(max_nodes) - main_len, 0)
    out = []
    for x in expansions:
        out.append(x[:room])
        room -= len(out[-1])
    return out


def cape_tree(
    main: torch.Tensor | Sequence[int],
    expansions: Sequence[torch.Tensor | Sequence[int]],
    dedupe: bool = True,
    device: torch.device | str | None = None,
) -> TokenTree:
    """The verification tree of an expanded proposal (Du et al., 2024, §4.2; Appendix A, Algorithms 1-2).

    ``main`` (``[k]``) is the draft path; ``expansions[t]`` (``[K_t]``, possibly empty) holds the
    alternative tokens for step ``t``. The node order is Algorithm 2's linearized input: ``main``
    first, then ``expansions[0]``, ``expansions[1]``, ... Each expansion token of step ``t`` is a
    sibling of ``main[t]`` (parent ``t - 1``, the root for ``t = 0``) and a leaf ("tokens in the
    expansion sets are not used for predicting future tokens", §4.2). Hence

    * ``position_offsets()`` is Algorithm 2's ``input_pi``: ``t`` for ``main[t]`` and for every
      token of ``expansions[t]``;
    * ``ancestor_mask()`` is §4.2's ``Mask_CAPE``: token ``i`` attends to itself and to the main
      tokens ``j`` with ``pos(i) > j``. (Algorithm 2's line ``VAM[:, γ:] <- CAM[:, γ:]`` must read
      ``VAM[:γ, :] <- CAM[:γ, :]``: as printed, main tokens would not see each other and
      expansion tokens would see earlier expansion tokens, contradicting ``Mask_CAPE`` and the text.)

    ``dedupe`` drops expansion tokens equal to ``main[t]`` or repeated within ``expansions[t]``
    (Algorithm 1 takes ``topk`` including the argmax, while §4.2 excludes ``x_{t+i}``); with
    ``dedupe=False`` the tokens are kept exactly as given.

    ``main`` and the sets are target ids, tensors (read to the host in one transfer) or lists of ints (no read;
    ``device``: where the tree's tensors go, default ``main``'s device or the CPU).
    """
    if device is None:
        device = main.device if isinstance(main, torch.Tensor) else torch.device("cpu")
    main_list, sets = _host_lists(main, expansions)
    k = len(main_list)
    if len(sets) != k:
        raise ValueError(f"need one expansion set per main token: {k} main tokens, {len(sets)} sets")
    tokens, parents = list(main_list), list(range(-1, k - 1))
    for t, x in enumerate(sets):
        if dedupe and x:
            seen, keep = {main_list[t]}, []
            for tok in x:
                if tok not in seen:
                    seen.add(tok)
                    keep.append(tok)
            x = keep
        tokens += x
        parents += [t - 1] * len(x)
    return TokenTree.from_host(tokens, parents, device)


def _host_lists(main, expansions) -> tuple[list[int], list[list[int]]]:
    """``main`` and the expansion sets as lists of ints, the tensors among them read in one transfer."""
    parts = [main, *expansions]
    tensors = [torch.as_tensor(x).reshape(-1) for x in parts if isinstance(x, torch.Tensor)]
    flat = torch.cat([t.to(tensors[0].device).long() for t in tensors]).tolist() if tensors else []
    out, at = [], 0
    for x in parts:
        if isinstance(x, torch.Tensor):
            m = x.numel()
            out.append(flat[at : at + m])
            at += m
        else:
            out.append([int(t) for t in x])
    return out[0], out[1:]


def expanded_proposal(
    probs: torch.Tensor,
    main: torch.Tensor,
    settings: CapeSettings | None,
    to_target=None,
    main_target=None,
    device=None,
    main_probs: list[float] | None = None,
    read: tuple | None = None,
) -> tuple[TokenTree, list[torch.Tensor], list[float]]:
    """Algorithm 1 end to end: the draft's ``[k, N]`` distributions along its main path ``main`` (``[k]``,
    normally the rows' argmax) -> the verification tree, the expansion sets (``to_target`` maps draft ids
    to target ids, e.g. through a reduced vocabulary; identity when ``None``) and, as host floats, the draft's
    probability of each node's token at its step (node order). ``settings=None``: no expansion, the tree is
    the chain ``main``. ``main_target`` / ``main_probs``: the main path's target ids / probabilities when the
    caller has them on the host; ``device``: where the tree goes (default ``probs``' device). Reads the device
    once (the sets, their target ids and probabilities together), and not at all for a chain whose
    ``main_target`` and ``main_probs`` are given, nor when ``read`` holds the sets already read
    (:func:`parse_expansions` of the rows' :func:`expansion_read`, at least ``k`` rows of them)."""
    device = probs.device if device is None else device
    tree, expansions, node_probs = expanded_lists(
        probs, main, settings, to_target, main_target, device, main_probs, read
    )
    return tree, [torch.tensor(x, dtype=torch.long, device=device) for x in expansions], node_probs


def expanded_lists(
    probs: torch.Tensor,
    main: torch.Tensor,
    settings: CapeSettings | None,
    to_target=None,
    main_target=None,
    device=None,
    main_probs: list[float] | None = None,
    read: tuple | None = None,
) -> tuple[TokenTree, list[list[int]], list[float]]:
    """:func:`expanded_proposal` with the expansion sets as host lists of target ids (no tensor made per set). The
    main path's probabilities are gathered from ``probs`` only where needed (``main_probs`` not given, or the sets
    still to be read)."""
    device = probs.device if device is None else device
    conf = None
    if main_probs is None or main_target is None or (settings is not None and read is None):
        main = main.to(probs.device)
        conf = probs.gather(1, main[:, None])[:, 0]  # [k] p_i
    main_t = list(main_target) if main_target is not None else (to_target or (lambda x: x))(main)
    main_p = list(main_probs) if main_probs is not None else conf.double().tolist()
    k = main.shape[0]
    if settings is None:
        return cape_tree(main_t, [[] for _ in range(k)], device=device), [], main_p
    if read is not None:
        sets, set_probs, set_targets = (x[:k] for x in read)
    else:
        bound = settings.max_size if defer_reads(probs.device) else None  # CPU: reads are free, exact width
        sets, set_probs, set_targets = _read_expansions(
            probs, main, settings.expansion_sizes(conf), settings.min_prob, bound, to_target
        )
    keep = [len(x) for x in cap_expansions(sets, k, settings.max_nodes)]
    expansions = [t[:c] for t, c in zip(set_targets, keep)]
    node_probs = main_p + [p for x, c in zip(set_probs, keep) for p in x[:c]]  # Algorithm 2's node order
    tree = cape_tree(main_t, expansions, device=device)
    if tree.num_nodes != len(node_probs):  # sets exclude main[i], unique
        raise RuntimeError("CAPE expansion sets must not repeat the main token or each other")
    return tree, expansions, node_probs


__all__ = [
    "CapeSettings",
    "cap_expansions",
    "cape_tree",
    "expanded_lists",
    "expanded_proposal",
    "expansion_lists",
    "expansion_parts",
    "expansion_read",
    "expansion_sets",
    "parse_expansions",
]
