"""What runs a verification forward: the target's decoder, eager or compiled, or the user's compiled forward.

* **The user compiled the target's forward** (``model.forward = torch.compile(model.forward)``): verification calls
  the model itself, so that compiled forward runs (the full logits of every query), never bypassed for the decoder.
* **transformers would compile plain decoding for this call** (``model._valid_auto_compile_criteria``: a static
  cache on an accelerator, or ``CompileConfig._compile_all_devices`` on a CPU; never with ``disable_compile``):
  the decoder runs through ``torch.compile`` with the call's :class:`~transformers.CompileConfig` (on CUDA its
  default mode ``reduce-overhead`` takes CUDA graphs). Query counts are padded to a few buckets
  (:data:`~hf_cascade.core.static.QUERY_BUCKETS`) and positions and masks are tensors, so after the buckets have
  been seen nothing recompiles. The compiled decoder is kept per decoder and configuration, across calls.
* Otherwise the decoder runs eagerly.

transformers compiles plain decoding only where it measured that it pays (accelerators), and leaves CPUs to the user
(``_compile_all_devices``); the core follows the same rule, so an assisted call compiles exactly where the same
call without an assistant would.
"""

from __future__ import annotations

import weakref

import torch

from ..compat import CACHE, given_cache
from .static import StaticSlots, call_capacity, is_static

_COMPILED: weakref.WeakKeyDictionary[torch.nn.Module, tuple[dict, object]] = weakref.WeakKeyDictionary()


def user_compiled(model) -> bool:
    """Whether the user replaced ``model``'s forward with a ``torch.compile``'d one."""
    forward = getattr(model, "forward", None)
    return (
        getattr(forward, "_torchdynamo_orig_callable", None) is not None
        or getattr(getattr(forward, "__func__", None), "_torchdynamo_orig_callable", None) is not None
    )


def compiles(target, cache, generation_config) -> bool:
    """Whether transformers would compile ``target``'s forward for this call's decoding steps."""
    criteria = getattr(target, "_valid_auto_compile_criteria", None)
    if criteria is None or cache is None:
        return False
    try:
        return bool(criteria({CACHE: cache}, generation_config))
    except (AttributeError, TypeError, KeyError):  # a release whose criteria read other inputs: do not compile
        return False


def call_compiles(target, model_kwargs: dict, generation_config) -> bool:
    """Whether this ``generate`` call's verifications run compiled: the user compiled the target's forward
    (:func:`user_compiled`), or a static cache (given, or asked for with ``cache_implementation="static"``) and
    :func:`compiles`. The CPU kernels then stay off: compiling is what replaces them, and dynamo would trace into
    them."""
    if user_compiled(target):
        return True
    cache = given_cache(model_kwargs)
    if not is_static(cache):
        if getattr(generation_config, "cache_implementation", None) != "static":
            return False
        from transformers import StaticCache

        cache = StaticCache(config=target.config, max_cache_len=1)  # allocates nothing until used
    return compiles(target, cache, generation_config)


def compiled_decoder(decoder: torch.nn.Module, compile_config):
    """``decoder.__call__`` compiled with ``compile_config`` (a :class:`~transformers.CompileConfig`), kept for
    later calls with the same configuration."""
    from transformers import CompileConfig

    config = compile_config or CompileConfig()
    options = config.to_dict()
    kept = _COMPILED.get(decoder)
    if kept is not None and kept[0] == options:
        return kept[1]
    compiled = WithinLimit(torch.compile(decoder.__call__, **options))
    _COMPILED[decoder] = (options, compiled)
    return compiled


def records_graphs(compile_config) -> bool:
    """Whether a forward compiled with ``compile_config`` (a :class:`~transformers.CompileConfig`; ``None``: its
    defaults) may record CUDA graphs, whose outputs live in the graph's own memory and are overwritten by its next
    replay: a caller keeps such an output past the next call only as a copy. inductor records them where its
    ``triton.cudagraphs`` option is on: set by the mode (``reduce-overhead``, ``max-autotune``:
    ``torch._inductor.list_mode_options``), by ``options``, or by inductor's global configuration (the
    ``TORCHINDUCTOR_CUDAGRAPHS`` environment variable); dynamo's ``cudagraphs`` backend always does. A backend given as
    a callable cannot be inspected: it is taken to record them (a copy costs little; an overwritten output would change
    the drafts). Devices do not enter: on a CPU no graph is recorded, and the copies are a few rows."""
    from transformers import CompileConfig

    config = compile_config or CompileConfig()
    backend = config.backend
    if not isinstance(backend, str):
        return True
    if backend != "inductor":
        return "cudagraphs" in backend
    from torch._inductor import config as inductor
    from torch._inductor import list_mode_options

    mode = config.mode
    options = {**(list_mode_options(mode) if mode and mode != "default" else {}), **(config.options or {})}
    return bool(options.get("triton.cudagraphs", inductor.triton.cudagraphs))


_DRAFTS: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, tuple[dict, object]]] = weakref.WeakKeyDictionary()


def compiled_draft(owner: torch.nn.Module, fn, compile_config, key):
    """``fn``, a drafter's forward passes over ``owner``'s weights (ReDrafter's beam search, a drafter model's forward
    over its static cache), compiled with the call's :class:`~transformers.CompileConfig` and kept per owner and
    configuration across calls; ``key(args, kwargs)``: what makes one of its graphs (its shapes and the ints it
    unrolls), for :class:`WithinLimit`. A drafter compiles where the target's verification does
    (:func:`call_compiles`): the same rule, so a call that runs compiled runs its drafter compiled too."""
    from transformers import CompileConfig

    options = (compile_config or CompileConfig()).to_dict()
    kept = _DRAFTS.setdefault(owner, {})
    entry = kept.get(fn.__qualname__)
    if entry is not None and entry[0] == options:
        return entry[1]
    compiled = WithinLimit(torch.compile(fn, **options), key)
    kept[fn.__qualname__] = (options, compiled)
    return compiled


def _decoder_key(args, kwargs) -> tuple:
    ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
    return (
        tuple(ids.shape) if ids is not None else None,
        mask is not None,
        id(kwargs.get(CACHE, kwargs.get("past_key_values"))),
    )


class WithinLimit:
    """A compiled decoder call that compiles each of its own shapes whatever else shares dynamo's recompile limit.

    dynamo keeps at most ``recompile_limit`` graphs (8 by default) per code object, and then runs the frame eagerly
    without an error. Every compiled call of one model class shares the decoder's ``forward`` code: transformers'
    compiled plain decoding, and verification's query buckets (:data:`~hf_cascade.core.static.QUERY_BUCKETS`) for
    each batch size and cache. A process that runs batch 1 and batch B would otherwise fall back to eager
    verification after its eighth graph, silently. So a call with a shape not seen before (input ids' shape, tree
    mask or none, cache) runs with the limit raised by the number of shapes this decoder has compiled; a known shape
    runs as is (one set lookup). The user's own setting stays the base and is restored after the call. ``key(args,
    kwargs)``: what makes a shape (default: the decoder's, above)."""

    def __init__(self, call, key=_decoder_key):
        self.call, self.key, self.seen = call, key, set()

    def __call__(self, *args, **kwargs):
        key = self.key(args, kwargs)
        if key in self.seen:
            return self.call(*args, **kwargs)
        from torch._dynamo import config

        self.seen.add(key)
        name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # torch < 2.7
        with config.patch(**{name: getattr(config, name) + len(self.seen)}):
            return self.call(*args, **kwargs)


def verify_call(target, cache, generation_config):
    """``(call, full)``: the function a verification forward calls with the model's inputs, and whether it is the
    full model (it returns logits) rather than its decoder (final hidden states)."""
    if user_compiled(target):
        return target, True
    decoder = target.get_decoder()
    if compiles(target, cache, generation_config):
        return compiled_decoder(decoder, getattr(generation_config, "compile_config", None)), False
    return decoder, False


def open_slots(target, cfg, given) -> StaticSlots | None:
    """The static cache the core verifies in, for one row or a batch, where the call asks for one
    (``cache_implementation="static"``: ``generate`` built a cache sized for plain decoding, not filled yet, and
    the core builds its own; or ``given``, the user's ``StaticCache``); ``None`` for a dynamic cache. Its capacity has
    room for the last bucket of drafts (:func:`~hf_cascade.core.static.call_capacity`). Compiled (or a user's
    compiled forward), shapes are fixed: the largest capacity per target, queries padded to buckets; eager, neither
    (padding and unused columns are work a forward does for nothing)."""
    mine = getattr(cfg, "cache_implementation", None) == "static"
    if not (mine or is_static(given)):
        return None
    fixed = user_compiled(target) or call_compiles(target, {CACHE: given}, cfg)
    return StaticSlots(target, None if mine else given, call_capacity(target, cfg, fixed), fixed)


__all__ = [
    "WithinLimit",
    "call_compiles",
    "compiled_decoder",
    "compiled_draft",
    "compiles",
    "open_slots",
    "records_graphs",
    "user_compiled",
    "verify_call",
]
