"""Measuring the target's verification cost on its device: the assistants' job when they bind to a target.

The payoff layer (:mod:`hf_cascade.core.payoff`) sizes trees from a :class:`~hf_cascade.core.payoff.VerifyCost`
profile it is given; it never measures. :func:`measure_verify_cost` measures one in the decoding loop itself, with
the verification backend the tree assistants run (:mod:`hf_cascade.backends`); :func:`measured_verify_cost` is the
short measurement of the defaults, made once per device kind and model shape in the process (:func:`profile_key`);
:func:`bound_verify_cost` is what an assistant asks when it binds.
"""

from __future__ import annotations

import time

import torch

from . import placement
from .backends import verification_session, wants_cpu_kernels
from .core.forward import verifies_trees
from .core.loop import speculative_decode
from .core.payoff import VerifyCost
from .core.stats import GenerationStats, synchronized_phases
from .core.strategy import TreeDrafter
from .core.structure import TokenTree
from .placement import target_device_dtype
from .profile_rounds import keep_rounds, kept_rounds, rounds_to_measure, store_key
from .timing import median_ratios, monotone_profile, round_ratios

#: Node counts the default profile measures (:func:`measured_verify_cost`); costs in between are interpolated.
QUICK_GRID = (0, 1, 2, 4, 8, 16, 24)
#: The default profile's steps per generation and prompt length (short: it is measured when an assistant binds).
QUICK_SETTINGS = {"grid": list(QUICK_GRID), "steps": 3, "prompt_len": 32}
_MEASURED: dict[tuple, VerifyCost] = {}  # profile_key(model) -> the profile measured in this process
_ROUNDS: dict[tuple, dict] = {}  # profile_key(model) -> its rounds: measured here, kept from before


def bound_verify_cost(policy, model) -> VerifyCost | None:
    """The profile an assistant's cost rules use for ``model`` under ``policy`` (a :class:`hf_cascade.options.Policy`):
    ``None`` where ``policy.cost_aware`` is off, its ``verify_cost`` where it gives one, else the profile measured
    for ``model``'s device kind (:func:`measured_verify_cost`)."""
    if not policy.cost_aware:
        return None
    return policy.verify_cost if policy.verify_cost is not None else measured_verify_cost(model)


def profile_key(model) -> tuple:
    """What a measured profile depends on: the device kind (type, name; CPU threads), the model's shape and dtype,
    whether its attention backend verifies trees or chains only (:func:`~hf_cascade.core.forward.verifies_trees`),
    and whether the measurement's verification runs on the CPU kernels
    (:func:`~hf_cascade.backends.wants_cpu_kernels`)."""
    device, dtype = target_device_dtype(model)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "cpu":
        name = f"{torch.get_num_threads()} threads"
    else:
        name = str(device)
    c = model.config.get_text_config()
    shape = tuple(
        getattr(c, a, None) for a in ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads")
    )
    return (
        device.type,
        name,
        getattr(model.config, "_name_or_path", None),
        shape,
        str(dtype),
        "trees" if verifies_trees(model) else "chains",
        "cpu kernels" if wants_cpu_kernels(model, None) else "model",
    )


def measured_verify_cost(model) -> VerifyCost:
    """The defaults' profile for ``model``, made once per :func:`profile_key` in the process: the per-size median of
    symmetric rounds (:func:`measure_verify_cost`'s, over :data:`QUICK_GRID`, a short prompt and a few steps per
    size), this process's round and the last ones kept on disk for the same machine and model
    (:mod:`hf_cascade.profile_rounds`: a round spoiled by a transient is outvoted; while fewer are kept, this process
    measures more; under ``HF_CASCADE_PROFILE_ROUNDS=reuse`` none once enough are kept), interpolated between the
    sizes. The trees of every later call are sized from it."""
    key = profile_key(model)
    if key not in _MEASURED:
        filed = store_key(key, QUICK_SETTINGS)
        kept = kept_rounds(filed)
        count = rounds_to_measure(len(kept))
        new = (
            _rounds(
                model,
                rounds=count,
                grid=QUICK_GRID,
                steps=QUICK_SETTINGS["steps"],
                prompt_len=QUICK_SETTINGS["prompt_len"],
            )
            if count
            else []
        )
        keep_rounds(filed, new)
        _MEASURED[key] = VerifyCost(monotone_profile(median_ratios(kept + new)))
        _ROUNDS[key] = {"measured": len(new), "kept": len(kept)}
    return _MEASURED[key]


def measured_profiles() -> list[dict]:
    """The profiles :func:`measured_verify_cost` measured in this process (a run's record: like the CPU kernels'
    block, a timed choice made once per process, which sizes every later tree), each at the sizes it measured."""
    return [
        {
            "profile": " / ".join(str(k) for k in key),
            "relative": {n: round(cost(n), 4) for n in QUICK_GRID},
            "rounds": _ROUNDS.get(key),
        }
        for key, cost in _MEASURED.items()
    ]


def measure_verify_cost(
    model, max_nodes: int = 24, prompt_len: int = 64, steps: int = 16, repeats: int = 3, grid=None
) -> VerifyCost:
    """Measure the profile in the loop itself: :func:`~hf_cascade.core.loop.speculative_decode` (in the verification
    session the tree assistants run, :func:`~hf_cascade.backends.verification_session`) over a random prompt of
    ``prompt_len`` tokens, each step verifying ``n`` leaves the target never chooses (so each step emits one token),
    for ``n = 0 .. max_nodes``; seconds per step over those of ``n = 0`` (a tree step without a tree: what a step of
    plain decoding costs in this loop). Where the target's attention backend verifies chains only (flash / paged /
    hub kernels, :func:`~hf_cascade.core.forward.verifies_trees`), the ``n`` nodes are a chain of that token instead:
    what such a target verifies (a step emits more tokens where the target chooses it). Each round is symmetric (the
    sizes in order, then in reverse; its value of ``n`` the mean of the two generations of ``steps`` steps, over its
    value of ``0``); the profile is the per-size median over ``repeats`` rounds after one warm-up round, made
    non-decreasing by :func:`monotone_profile`: about ``(2 * repeats + 1) * steps * (max_nodes + 1)`` target
    forwards. ``grid``: measure only these node counts
    (``0`` included; ``max_nodes`` = the largest) and interpolate linearly in between. The device is
    synchronised before each clock read (:func:`~hf_cascade.placement.synchronize`)."""
    return VerifyCost(monotone_profile(median_ratios(_rounds(model, max_nodes, prompt_len, steps, repeats, grid))))


@torch.no_grad()
def _rounds(
    model, max_nodes: int = 24, prompt_len: int = 64, steps: int = 16, rounds: int = 3, grid=None
) -> list[dict[int, float]]:
    """Each symmetric round's ``{n: seconds per step / those of 0}`` (:func:`measure_verify_cost`'s measurement)."""
    from transformers import (
        GenerationConfig,
        LogitsProcessorList,
        StoppingCriteria,
        StoppingCriteriaList,
    )

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
    prompt = torch.randint(0, vocab, (1, prompt_len), generator=gen).to(target_device_dtype(model)[0])  # not meta
    sizes = sorted({0, *(int(n) for n in grid)}) if grid is not None else list(range(max_nodes + 1))
    max_nodes = sizes[-1]
    config = GenerationConfig(max_length=prompt_len + steps + max_nodes, do_sample=False, eos_token_id=None)

    def seconds_per_step(n: int) -> float:
        stats = GenerationStats()
        placement.synchronize(model)
        t0 = time.perf_counter()
        with synchronized_phases():  # the prefill's time is subtracted: a timing that decides, synchronised
            speculative_decode(
                model,
                Leaves(n),
                prompt,
                LogitsProcessorList(),
                StoppingCriteriaList([AfterSteps()]),
                config,
                stats,
                block_rows=session.block_rows,
            )
        placement.synchronize(model)
        return (time.perf_counter() - t0 - stats.phase_seconds.get("prefill", 0.0)) / max(stats.target_calls, 1)

    with verification_session(model) as session:  # symmetric rounds: a drift over a round cancels
        return round_ratios({n: (lambda n=n: seconds_per_step(n)) for n in sizes}, 0, rounds, self_timed=True)


__all__ = [
    "QUICK_GRID",
    "QUICK_SETTINGS",
    "bound_verify_cost",
    "measure_verify_cost",
    "measured_verify_cost",
    "measured_profiles",
    "monotone_profile",
    "profile_key",
]
