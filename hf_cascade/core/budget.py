"""Hardware-aware tree size: verify only the draft nodes whose expected return pays for their cost.

Not in GLIDE's or ReDrafter's paper: both verify what they draft (CAPE up to 32 tokens, ReDrafter every
beam), as if a forward over 32 tokens cost what a forward over one does, roughly true on a GPU far from its
compute bound. Elsewhere (a CPU, a GPU near its bound, a large batch) the cost of verifying ``n`` nodes
rises in steps with ``n``, and the steps are the machine's own (``VerifyCost()`` measures them on the
running device, :func:`measure_verify_cost`; one CPU's profile and how it changed with the CPU kernels:
``docs/design.md``). So whether a node pays
depends on the node *and* on the step: Sequoia (Chen et al., 2024, "Sequoia: Scalable, Robust, and
Hardware-aware Speculative Decoding", Section 3.3) sizes its tree from a measured forward-time profile;
EAGLE-2 (Li et al., 2024) keeps the nodes of highest draft path probability. This module does both,
per step:

1. the draft's *path probability* of each node (its own probability times its ancestors',
   :func:`path_probabilities`) estimates the chance the target accepts it, so the expected number of
   accepted tokens of any ancestor-closed node set is the sum of its path probabilities (linearity;
   siblings are exclusive events, each counted with its own probability). Measured for the shipped
   GLIDE on training prompts: nodes of path probability 0.05-0.1 / 0.2-0.3 / 0.6-0.7 / > 0.9 were
   accepted 11% / 29% / 61% / 97% of the time;
2. sorting nodes by path probability gives, for each size ``n``, the best ``n``-node set (a child never
   outranks its parent, so every prefix of the order is a tree) with expected gain ``G(n)``;
3. :func:`best_size` picks the ``n`` maximizing ``1 + G(n) - R * cost(n)``, where ``R`` is the
   generation's tokens per unit of cost so far (:class:`RateTracker`): by Dinkelbach's argument, the
   per-step choice that maximizes the long-run tokens per unit of time, ``sum(1 + G) / sum(cost)``,
   once ``R`` is that optimum.

Not modelled: a step whose accepted path leaves the main path (an accepted CAPE sibling) pays a second
output-head call, about a third of a unit, unless the sibling's row fit in the first call's block
(:mod:`hf_cascade.core.rows` computes the main path's rows first, then siblings while the block has room).

The tree stays a deterministic function of the context and the past steps (no random draws of this
step), so greedy decoding stays exact and the point-mass sampling acceptance stays lossless.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..placement import target_device_dtype
from ..timing import interleaved_medians
from .structure import TokenTree

# Gemma-3-270M fp32, 2 CPU threads (the reference machine), n = 0..24 nodes: measure_verify_cost(model) (the loop
# itself, with the session's decoder linears and head: hf_cascade.backends.cpu.verify_linear.fast_verification), 2026-11-23.
_CPU_PROFILE = (1.0, 1.0, 1.039, 1.039, 1.054, 1.153, 1.225, 1.225, 1.271, 1.354, 1.425, 1.454, 1.671, 1.711, 1.93,
                1.93, 1.93, 1.93, 1.93, 1.93, 1.93, 1.93, 1.982, 1.982, 1.982)


#: Node counts the default profile measures (:func:`default_verify_cost`); costs in between are interpolated.
QUICK_GRID = (0, 1, 2, 4, 8, 16, 24)
_MEASURED: dict[tuple, "VerifyCost"] = {}       # profile_key(model) -> the profile measured in this process


@dataclass(frozen=True)
class VerifyCost:
    """The cost of one verification of ``n`` tree nodes, in units of a one-token target forward.

    The rule: a node is verified when its expected return pays for what it adds to the step's cost *on the
    running hardware*, so the profile must be that hardware's. ``VerifyCost()`` (no table) is measured on the
    target, its device and dtype at first use (:meth:`resolve`, :func:`default_verify_cost`: a few steps per
    node count of :data:`QUICK_GRID`, interpolated; seconds) and cached per device kind and model shape for
    the process. A table given here is used as is (e.g. :func:`measure_verify_cost`'s longer measurement,
    :meth:`flat` for a GPU far from its compute bound, or :meth:`reference`, one measured CPU's profile).

    Attributes:
        relative: ``relative[n]`` for ``n = 0 .. len - 1`` nodes (``relative[0] = 1``: the root alone, what a
            step of plain decoding costs), non-decreasing; larger ``n`` extend the mean slope of the table's
            second half (a measured profile rises in steps, so its very last slope is often 0). ``None``:
            measure at first use.
    """

    relative: tuple[float, ...] | None = None

    @property
    def resolved(self) -> bool:
        return self.relative is not None

    def resolve(self, model) -> "VerifyCost":
        """This profile, or (``VerifyCost()``) the one measured for ``model`` on its device (cached)."""
        return self if self.resolved else default_verify_cost(model)

    @classmethod
    def reference(cls) -> "VerifyCost":
        """The profile measured on the reference CPU (Gemma-3-270M, float32, 2 threads; see the module docstring)."""
        return cls(_CPU_PROFILE)

    def __post_init__(self) -> None:
        if self.relative is None:
            return
        rel = tuple(float(c) for c in self.relative)
        if len(rel) < 2:
            raise ValueError(f"VerifyCost needs the cost of at least 0 and 1 nodes, got {rel}")
        if abs(rel[0] - 1.0) > 1e-6:
            raise ValueError(f"relative[0] is the unit (a one-token forward) and must be 1.0, got {rel[0]}")
        if any(b < a for a, b in zip(rel, rel[1:])):
            raise ValueError(f"verification costs must not decrease with the number of nodes, got {rel}")
        object.__setattr__(self, "relative", rel)

    @classmethod
    def flat(cls) -> "VerifyCost":
        """Every tree costs what one token costs (a GPU far from its compute bound): verify everything."""
        return cls((1.0, 1.0))

    def __call__(self, n: int) -> float:
        rel = self.relative
        if rel is None:
            raise RuntimeError("VerifyCost() is measured at first use: call .resolve(target) (the assistants do)")
        if n < len(rel):
            return rel[n]
        half = (len(rel) - 1) // 2
        slope = (rel[-1] - rel[half]) / (len(rel) - 1 - half)
        return rel[-1] + (n - len(rel) + 1) * slope

    def table(self, n: int) -> torch.Tensor:
        """``[n + 1]`` float64 costs of ``0 .. n`` nodes."""
        return torch.tensor([self(i) for i in range(n + 1)], dtype=torch.float64, device="cpu")


def path_probabilities(tree: TokenTree, node_probs: torch.Tensor) -> torch.Tensor:
    """``[n]`` draft probabilities of each node's own token -> ``[n]`` probabilities of each node's path
    (the product over the node and its ancestors)."""
    node_probs = torch.as_tensor(node_probs, dtype=torch.float64)
    if node_probs.shape != (tree.num_nodes,):
        raise ValueError(f"need one probability per node ({tree.num_nodes}), got shape {tuple(node_probs.shape)}")
    if tree.num_nodes == 0:
        return node_probs
    device = tree.tokens.device if tree.tokens.device.type != "mps" else torch.device("cpu")   # no float64 on MPS
    logp = node_probs.clamp_min(1e-30).log().to(device)
    return (tree.ancestor_mask().to(device=device, dtype=torch.float64) @ logp).exp()   # ancestor_mask includes self


def best_size(gains: torch.Tensor, cost: VerifyCost, rate: float) -> int:
    """``gains``: ``[n]`` path probabilities sorted in decreasing order -> the ``m`` in ``0..n`` maximizing
    ``1 + sum(gains[:m]) - rate * cost(m)`` (ties: the smaller ``m``)."""
    gains = torch.as_tensor(gains, dtype=torch.float64).flatten()
    value = 1.0 + torch.cat([gains.new_zeros(1), gains.cumsum(0)]) - float(rate) * cost.table(gains.shape[0])
    return int(torch.argmax(value))                                              # first maximum = smallest m


def _best_size_host(gains: list[float], cost: VerifyCost, rate: float) -> int:
    """:func:`best_size` on host floats (the same float64 sums in the same order, the first maximum): no tensor."""
    rate, best, best_value, total = float(rate), 0, None, 0.0
    for m in range(len(gains) + 1):
        if m:
            total += float(gains[m - 1])
        value = (1.0 + total) - rate * float(cost(m))
        if best_value is None or value > best_value:
            best, best_value = m, value
    return best


def budget_mask(tree: TokenTree, path_probs: torch.Tensor, cost: VerifyCost, rate: float) -> torch.Tensor:
    """``[n]`` bool: the :func:`best_size` nodes of highest path probability (ties: node order, so a parent,
    which precedes its children and is at least as probable, comes first); closed under ancestors."""
    values = torch.as_tensor(path_probs, dtype=torch.float64).tolist()           # one read; the rest on the host
    return torch.tensor(keep_best(values, cost, rate), dtype=torch.bool, device=tree.tokens.device)


def keep_best(path_probs: list[float], cost: VerifyCost, rate: float) -> list[bool]:
    """:func:`budget_mask` on host values: which nodes (node order) are among the :func:`best_size` most
    probable ones."""
    order = sorted(range(len(path_probs)), key=lambda i: (-path_probs[i], i))
    m = _best_size_host([path_probs[i] for i in order], cost, rate)
    keep = [False] * len(path_probs)
    for i in order[:m]:
        keep[i] = True
    return keep


class RateTracker:
    """``R``: tokens emitted per unit of verification cost so far in one ``generate()`` call, starting from
    ``prior_steps`` imaginary plain steps (one token for a cost of 1 each)."""

    def __init__(self, cost: VerifyCost, prior_steps: float = 1.0):
        self.cost = cost
        self.tokens = float(prior_steps)
        self.units = float(prior_steps)

    @property
    def rate(self) -> float:
        return self.tokens / self.units

    def update(self, nodes: int, emitted: int) -> None:
        """Record one verification of ``nodes`` nodes that emitted ``emitted`` tokens (bonus included)."""
        self.tokens += emitted
        self.units += self.cost(nodes)


def profile_key(model) -> tuple:
    """What a measured profile depends on: the device kind (type, name; CPU threads), the model's shape and dtype,
    and whether its attention backend verifies trees or chains only
    (:func:`~hf_cascade.core.forward.verifies_trees`)."""
    from ..placement import target_device_dtype
    from .forward import verifies_trees

    device, dtype = target_device_dtype(model)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "cpu":
        name = f"{torch.get_num_threads()} threads"
    else:
        name = str(device)
    c = model.config.get_text_config()
    shape = tuple(getattr(c, a, None) for a in ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads"))
    return (device.type, name, getattr(model.config, "_name_or_path", None), shape, str(dtype),
            "trees" if verifies_trees(model) else "chains")


def default_verify_cost(model) -> VerifyCost:
    """``VerifyCost()``'s profile for ``model``: :func:`measure_verify_cost` over :data:`QUICK_GRID` with a short
    prompt and a few steps per size (interpolated between the sizes), measured once per :func:`profile_key`."""
    key = profile_key(model)
    if key not in _MEASURED:
        _MEASURED[key] = measure_verify_cost(model, prompt_len=32, steps=4, repeats=1, grid=QUICK_GRID)
    return _MEASURED[key]


@torch.no_grad()
def measure_verify_cost(model, max_nodes: int = 24, prompt_len: int = 64, steps: int = 16,
                        repeats: int = 3, grid=None) -> VerifyCost:
    """Measure the profile in the loop itself: :func:`~hf_cascade.core.loop.speculative_decode` (with the CPU kernels
    of :func:`~hf_cascade.backends.cpu.verify_linear.fast_verification`, as the tree assistants run it) over a random prompt of ``prompt_len``
    tokens, each step verifying ``n`` leaves the target never chooses (so each step emits one token), for
    ``n = 0 .. max_nodes``; seconds per step over those of ``n = 0`` (a tree step without a tree: what a
    step of plain decoding costs in this loop). Where the target's attention backend verifies chains only
    (flash / paged / hub kernels, :func:`~hf_cascade.core.forward.verifies_trees`), the ``n`` nodes are a chain
    of that token instead: what such a target verifies (a step emits more tokens where the target chooses it).
    Median of ``repeats`` generations of ``steps`` steps per ``n`` (after one warm-up), the sizes in alternating
    order, made non-decreasing. About ``repeats * steps *
    (max_nodes + 1)`` target forwards. Pass the result
    as ``verify_cost=`` (``VerifyCost()`` measures a shorter version itself, :func:`default_verify_cost`).
    ``grid``: measure only these node counts (``0`` included; ``max_nodes`` = the largest) and interpolate
    linearly in between. The device is synchronised before each clock read (:func:`~hf_cascade.placement.synchronize`)."""
    from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

    from ..backends import verification_session
    from ..placement import synchronize
    from .forward import verifies_trees
    from .loop import speculative_decode
    from .stats import GenerationStats
    from .strategy import TreeDrafter

    chains = not verifies_trees(model)

    class Leaves(TreeDrafter):
        """``n`` leaves of token 0 below the root, or (``chains``) a chain of ``n`` of them: ``n`` verified nodes per
        step (the generation's stop criterion ends it after ``steps`` tokens, before any chain is pruned)."""

        linear = chains

        def __init__(self, n: int):
            self.n = n

        def draft_tree(self, seq, state):
            parents = torch.arange(-1, self.n - 1, device=seq.device) if chains else seq.new_full((self.n,), -1)
            return TokenTree(seq.new_zeros(self.n), parents), None

    class AfterSteps(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= prompt_len + steps, dtype=torch.bool)

    vocab = int(model.config.get_text_config().vocab_size)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, prompt_len), generator=gen).to(target_device_dtype(model)[0])   # not meta
    sizes = sorted({0, *(int(n) for n in grid)}) if grid is not None else list(range(max_nodes + 1))
    max_nodes = sizes[-1]
    config = GenerationConfig(max_length=prompt_len + steps + max_nodes, do_sample=False, eos_token_id=None)

    def seconds_per_step(n: int) -> float:
        stats = GenerationStats()
        synchronize(model)
        t0 = time.perf_counter()
        speculative_decode(model, Leaves(n), prompt, LogitsProcessorList(), StoppingCriteriaList([AfterSteps()]),
                           config, stats, block_rows=session.block_rows)
        synchronize(model)
        return (time.perf_counter() - t0 - stats.phase_seconds.get("prefill", 0.0)) / max(stats.target_calls, 1)

    with verification_session(model) as session:                 # sizes alternate in order: no drift bias
        times = interleaved_medians({n: (lambda n=n: seconds_per_step(n)) for n in sizes}, repeats, alternate=True,
                                    self_timed=True)
    measured = {n: times[n] / times[0] for n in sizes}
    rel, top = [1.0], 1.0
    for n in range(1, max_nodes + 1):
        lo = max(m for m in sizes if m <= n)
        hi = min(m for m in sizes if m >= n)
        value = measured[lo] if hi == lo else measured[lo] + (measured[hi] - measured[lo]) * (n - lo) / (hi - lo)
        top = max(top, value)
        rel.append(top)
    return VerifyCost(tuple(rel))


__all__ = ["QUICK_GRID", "RateTracker", "VerifyCost", "best_size", "budget_mask", "default_verify_cost", "keep_best",
           "measure_verify_cost", "path_probabilities", "profile_key"]
