"""The cost tables of the standardized walltime improvement (:mod:`hf_cascade.bench.swi`), built once per
bench from the loaded models: :func:`build_costs`.

``params`` (CS Drafting's "model size" SWI): a forward costs its model's parameter count over the target's.

* the target and every neural drafter: ``sum(p.numel() for p in model.parameters())`` (shared tensors
  once; embeddings included, as a model's parameter count does). A drafter made of the target's own first
  layers counts the parameters its forward runs, although they are the target's;
* a GLIDE (:class:`~hf_cascade.heads.GlideForCausalLM`) counts its own parameters; one that shares the
  target's embeddings computes its logits with the target's LM head, whose parameters are then counted
  too (the lookup in the target's embedding table is not: a lookup reads a few rows, not the table);
* a ReDrafter head counts its own parameters (its LM head is its own); the target-embedding lookups of
  its beam tokens are not counted.

``measured``: this machine's costs, inside the target's verification backend
(:func:`~hf_cascade.backends.verification_session`), as the assistants draft and verify:

* the target: :func:`~hf_cascade.measure.measured_verify_cost`, the relative cost of verifying ``n``
  nodes in hf_cascade's loop (measured once per process and model; transformers' loops are charged the same);
* a drafter: the median time of its forward over one new token after a 32-token context, over that of a
  one-token target forward timed the same way, plus a slope per extra token from a forward over 8 tokens
  (rows: live beams for a ReDrafter head). A drafter whose measurement fails has no cost: no SWI.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from transformers import DynamicCache

from ..compat import cache_kwargs
from ..placement import synchronize
from ..timing import interleaved_medians
from .swi import STATISTICAL, Costs, DrafterCost, flat_target

CONTEXT = 32  # tokens before the timed forward
WIDE = 8  # tokens (rows) of the second timed forward, for the per-token slope
REPEATS = 7


def parameter_count(module: torch.nn.Module) -> int:
    """Parameters of ``module`` (a tensor shared inside it counted once)."""
    return int(sum(p.numel() for p in module.parameters()))


def _kind(module: Any) -> str:
    if all(hasattr(module, a) for a in ("target_kv", "tie_to_target")):
        return "glide"
    if all(hasattr(module, a) for a in ("init_state", "step", "logits", "to_target_ids")):
        return "redrafter"
    return "lm"


def _name(module: Any) -> str:
    return getattr(getattr(module, "config", None), "_name_or_path", None) or type(module).__name__


def params_cost(module: Any, target: torch.nn.Module) -> DrafterCost:
    """A drafter's ``params`` cost (see the module docstring): its parameters over the target's."""
    own, kind = parameter_count(module), _kind(module)
    total, note = own, f"{own} parameters"
    if kind == "glide" and getattr(module.config, "share_target_embeddings", False):
        head = target.get_output_embeddings()
        total += parameter_count(head)
        note = (
            f"{own} own parameters + the target's LM head ({parameter_count(head)}), which computes its logits "
            "(it shares the target's embeddings; the embedding lookup is not counted)"
        )
    elif kind == "glide":
        note += " (own embeddings and LM head)"
    elif kind == "redrafter":
        note += " (own LM head; the lookups in the target's embedding table are not counted)"
    else:
        target_tensors = {p.data_ptr() for p in target.parameters()}
        shared = sum(p.numel() for p in module.parameters() if p.data_ptr() in target_tensors)
        if shared:
            note += f" ({shared} of them the target's own, run again by the drafter's forward)"
    return DrafterCost(_name(module), total / parameter_count(target), 0.0, note)


# -- measured --------------------------------------------------------------------------------------------------


def _median_seconds(fn: Callable[[], None], device: Any, repeats: int = REPEATS) -> float:
    return interleaved_medians({0: fn}, repeats, warmup=2, sync=lambda: synchronize(device))[0]


def _ids(model: Any, vocab: int, n: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    device = next(model.parameters()).device
    return torch.randint(0, vocab, (1, n), generator=gen).to(device)


def _keep(model: Any, rows: int) -> dict:
    return {"logits_to_keep": rows} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def _crop(cache: DynamicCache) -> None:
    """Back to the ``CONTEXT`` cached tokens (``crop`` with a negative count: transformers 4.57 and 5.x)."""
    extra = cache.get_seq_length() - CONTEXT
    if extra > 0:
        cache.crop(-extra)


def _lm_forward(model: Any, vocab: int) -> tuple[Callable[[int], None], Any]:
    """``run(m)``: a forward of ``m`` new tokens after a cached context (then cropped back), logits of the
    ``m`` rows (a review's), over the drafter's reduced vocabulary when it has one."""
    ids = _ids(model, vocab, CONTEXT + WIDE)
    cache = DynamicCache()
    reduced = (
        {"full_vocab": False}
        if (getattr(model.config, "draft_vocab_size", None) is not None and hasattr(model, "vocab_subset"))
        else {}
    )
    model(input_ids=ids[:, :CONTEXT], **cache_kwargs(model, cache), **_keep(model, 1), **reduced)

    def run(m: int) -> None:
        model(input_ids=ids[:, CONTEXT : CONTEXT + m], **cache_kwargs(model, cache), **_keep(model, m), **reduced)
        _crop(cache)

    return run, model


def _glide_forward(glide: Any, target: Any, vocab: int) -> tuple[Callable[[int], None], Any]:
    """``run(m)``: a GLIDE forward of ``m`` new tokens reading the target's cached K/V of the context."""
    from ..glide.assistant import check_glide_matches

    check_glide_matches(glide, target)  # ties shared embeddings
    ids = _ids(target, vocab, CONTEXT + WIDE)
    target_cache, own = DynamicCache(), DynamicCache()
    target(input_ids=ids[:, :CONTEXT], **cache_kwargs(target, target_cache), **_keep(target, 1))
    kv = glide.target_kv(target_cache) if glide.config.cross_attention else None
    glide(
        input_ids=ids[:, :CONTEXT], **cache_kwargs(glide, own), target_key_values=kv, full_vocab=False, logits_to_keep=1
    )

    def run(m: int) -> None:
        glide(
            input_ids=ids[:, CONTEXT : CONTEXT + m],
            **cache_kwargs(glide, own),
            target_key_values=kv,
            full_vocab=False,
            logits_to_keep=1,
        )
        _crop(own)

    return run, glide


def _redrafter_forward(head: Any, target: Any, vocab: int) -> tuple[Callable[[int], None], Any]:
    """``run(m)``: one beam-search step of the head over ``m`` beams (recurrent step on the target embeddings
    of the beams' last tokens, then the logits)."""
    emb = target.get_input_embeddings()
    ids = _ids(target, vocab, WIDE)[0]
    x = torch.randn(1, head.config.hidden_size, generator=torch.Generator().manual_seed(0)).to(head.device, head.dtype)
    state = head.init_state(x.expand(WIDE, -1))

    def run(m: int) -> None:
        s = head.step(state[:m], emb(ids[:m]).to(device=head.device, dtype=head.dtype))
        head.logits(s, x, full_vocab=False)

    return run, head


def measured_cost(module: Any, target: Any, unit_seconds: float) -> DrafterCost:
    """A drafter's ``measured`` cost: one-token forward time over ``unit_seconds`` (a one-token target
    forward), plus the slope per extra token between that and an 8-token forward."""
    vocab = int(target.config.get_text_config().vocab_size)
    kind = _kind(module)
    build = {
        "glide": lambda: _glide_forward(module, target, vocab),
        "redrafter": lambda: _redrafter_forward(module, target, vocab),
        "lm": lambda: _lm_forward(module, vocab),
    }[kind]
    run, device = build()
    seconds = interleaved_medians(
        {1: lambda: run(1), WIDE: lambda: run(WIDE)}, REPEATS, warmup=2, sync=lambda: synchronize(device)
    )
    one, wide = seconds[1], seconds[WIDE]
    slope = max(wide - one, 0.0) / (WIDE - 1)
    rows = "beams" if kind == "redrafter" else "tokens"
    return DrafterCost(
        _name(module),
        one / unit_seconds,
        slope / unit_seconds,
        f"{one * 1e3:.3f} ms per one-token forward, +{slope * 1e3:.3f} ms per extra {rows[:-1]} "
        f"(this machine; a one-token target forward: {unit_seconds * 1e3:.3f} ms)",
    )


def target_forward_seconds(target: Any) -> float:
    """Median time of a one-token target forward after a ``CONTEXT``-token context (the unit of drafter costs)."""
    run, device = _lm_forward(target, int(target.config.get_text_config().vocab_size))
    return _median_seconds(lambda: run(1), device)


# -- the tables ------------------------------------------------------------------------------------------------


def build_costs(cost_models: Sequence[str], target: Any, levels: Mapping[str, list | None]) -> tuple[dict, dict]:
    """``({cost model: {method: Costs}}, description)`` for methods whose statistics' levels are backed by
    ``levels[method]`` (:meth:`~hf_cascade.bench.methods.Method.level_models`). Each distinct drafter is
    costed once; the description (for the results JSON) lists the target's and each drafter's costs."""
    from ..backends import verification_session
    from ..measure import measured_verify_cost

    tables: dict[str, dict[str, Costs]] = {}
    description: dict[str, dict] = {}
    drafters = {id(m): m for ms in levels.values() if ms for m in ms if m is not None and not isinstance(m, str)}
    for model in cost_models:
        per_drafter: dict[int, DrafterCost | None] = {}
        errors: dict[str, str] = {}
        if model == "params":
            target_cost = flat_target
            info: dict = {
                "target": {"name": _name(target), "parameters": parameter_count(target)},
                "target_verification": "1 per verification, any number of rows",
            }
            for key, m in drafters.items():
                per_drafter[key] = params_cost(m, target)
        elif model == "measured":
            try:
                target_cost = measured_verify_cost(target)  # enters the backend itself
                with torch.inference_mode(), verification_session(target):
                    unit = target_forward_seconds(target)
            except Exception as exc:  # no unit: no measured SWI at all
                why = f"the target's costs could not be measured: {type(exc).__name__}: {exc}"
                tables[model] = {method: Costs(flat_target, (), why) for method in levels}
                description[model] = {"unavailable": why}
                continue
            with torch.inference_mode(), verification_session(target):
                for key, m in drafters.items():
                    try:
                        per_drafter[key] = measured_cost(m, target, unit)
                    except Exception as exc:  # no cost, no SWI for its methods; the bench goes on
                        per_drafter[key] = None
                        errors[_name(m)] = f"{type(exc).__name__}: {exc}"
            info = {
                "target": {"name": _name(target), "one_token_forward_seconds": unit},
                "target_verify_cost": list(target_cost.relative),
            }
        else:
            raise ValueError(f"unknown cost model {model!r}")
        tables[model] = {}
        for method, ms in levels.items():
            if ms is None:
                tables[model][method] = Costs(target_cost, (), "the models behind this method's statistics are unknown")
                continue
            costs = tuple(STATISTICAL if m is None else None if isinstance(m, str) else per_drafter[id(m)] for m in ms)
            tables[model][method] = Costs(target_cost, costs)
        info["drafters"] = [c.to_dict() for c in per_drafter.values() if c is not None]
        if errors:
            info["errors"] = errors
        info["methods"] = {method: c.to_dict() for method, c in tables[model].items()}
        description[model] = info
    return tables, description


__all__ = ["build_costs", "measured_cost", "params_cost", "parameter_count", "target_forward_seconds"]
