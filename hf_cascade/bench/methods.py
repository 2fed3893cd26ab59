"""The methods a benchmark compares, as one contract: :class:`Method` (plain ``generate``), the plain baselines with the
CPU kernels and compiled, and ours (an hf_cascade assistant; SuffixDecoding and Token Recycling in our core).
transformers' own loops and economize are in :mod:`.peers`; :func:`~hf_cascade.bench.build.build_method` makes any
of them by name.

Every method is a :class:`Method`: ``run(input_ids, attention_mask, gen_kwargs)`` returns the output
ids and, where the method reports it, per-call statistics (a dict in the format of
:meth:`hf_cascade.GenerationStats.to_dict`, at least ``target_calls`` and ``new_tokens``; for transformers'
loops and economize the forwards are counted by :mod:`hf_cascade.bench.counting`). :meth:`Method.level_models`
names the model behind each level of those statistics, for the standardized walltime improvement
(:mod:`hf_cascade.bench.swi`). A method that
cannot be built (a missing package, a missing draft model) raises :class:`MethodUnavailable` with a
message that says what to do; the runner records it and goes on with the others.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers

from ..assistant import Assistant
from ..backends import cpu_kernels_apply
from .counting import assistant_levels


class MethodUnavailable(RuntimeError):
    """A method cannot run in this environment or with these settings (the message says why)."""


class Method:
    """One way of calling ``generate``; subclasses override :meth:`run`. ``one_forward_per_token``: the method
    is plain decoding (one target forward per new token), the reference of every SWI."""

    #: whether ``run`` returns per-call statistics
    has_stats = False

    def __init__(self, name: str, model: Any, one_forward_per_token: bool = False):
        self.name, self.model = name, model
        self.one_forward_per_token = bool(one_forward_per_token)

    def level_models(self) -> list | None:
        """The model behind each level of :meth:`run`'s statistics (``stats["levels"]``), top first: a module,
        ``None`` for a statistical drafter, a string (:data:`~hf_cascade.bench.counting.UNKNOWN`) for a drafter the
        bench cannot cost; ``None`` as a whole when unknown."""
        return []

    def run(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, gen_kwargs: dict
    ) -> tuple[torch.Tensor, dict | None]:
        out = self.model.generate(input_ids, attention_mask=attention_mask, **gen_kwargs, **self.extra_kwargs())
        return out, None

    def extra_kwargs(self) -> dict:
        return {}

    def after_warmup(self) -> None:
        """Called once after the method's untimed warm-up ``generate``: a method that keeps state across calls
        on purpose (SuffixDecoding's cache of earlier responses) forgets the warm-up's here."""


class PlainKernels(Method):
    """Plain greedy ``generate`` (no assistant) inside ``hf_cascade.cpu_kernels(model)``: the CPU kernels
    our assistants verify with (float32 targets on CPU only). On a CPU where those kernels make a
    one-token forward faster than the model's own, part of every strategy's speedup over ``plain`` is
    the kernels'; the speedup over this baseline is what drafting and verifying adds."""

    def __init__(self, name: str, model: Any):
        if not cpu_kernels_apply(model):
            raise MethodUnavailable(f"baseline {name!r} needs a float32 target on CPU (hf_cascade's CPU kernels)")
        super().__init__(name, model, one_forward_per_token=True)

    def run(self, input_ids, attention_mask, gen_kwargs):
        from ..backends.cpu import cpu_kernels  # the backend, imported only for this baseline

        with cpu_kernels(self.model):
            return super().run(input_ids, attention_mask, gen_kwargs)


class PlainCompiled(Method):
    """Plain greedy ``generate`` with a static cache, compiled by transformers (``CompileConfig`` with
    ``_compile_all_devices = True`` so it compiles on a CPU too; the backend's default mode): the baseline a GPU
    user compares with. The cache length is the call's rounded up to :data:`CACHE_STEP` columns, so a run's prompts
    share a few cache shapes (each new one recompiles; the warm-up compiles the first)."""

    CACHE_STEP = 256
    BACKEND = "inductor"  # CompileConfig's default; tests use a backend that generates no code

    def __init__(self, name: str, model: Any):
        from transformers import CompileConfig, GenerationConfig

        super().__init__(name, model, one_forward_per_token=True)
        self.config = CompileConfig(backend=self.BACKEND)
        self.config._compile_all_devices = True
        self.sized = hasattr(GenerationConfig(), "max_cache_len")  # 4.57 sizes the cache by max_length

    def run(self, input_ids, attention_mask, gen_kwargs):
        extra = {"cache_implementation": "static", "compile_config": self.config}
        if self.sized:
            need = input_ids.shape[-1] + int(gen_kwargs.get("max_new_tokens") or 0)
            extra["max_cache_len"] = -(-need // self.CACHE_STEP) * self.CACHE_STEP
        return self.model.generate(input_ids, attention_mask=attention_mask, **gen_kwargs, **extra), None


class Ours(Method):
    """``generate(..., assistant_model=<an hf_cascade Assistant>)``; statistics from ``last_stats``."""

    has_stats = True

    def __init__(self, name: str, model: Any, assistant: Assistant):
        super().__init__(name, model)
        self.assistant = assistant

    def run(self, input_ids, attention_mask, gen_kwargs):
        out = self.model.generate(
            input_ids,
            attention_mask=attention_mask,
            assistant_model=self.assistant,
            **gen_kwargs,
            **self.extra_kwargs(),
        )
        stats = self.assistant.last_stats
        return out, (stats.to_dict() if stats is not None else None)

    def level_models(self) -> list | None:
        return assistant_levels(self.assistant)


class Suffix(Ours):
    """SuffixDecoding (:class:`~hf_cascade.suffix.SuffixAssistant`, vLLM's defaults) in our decoding core,
    with the same verification backend as Max-Gram. Its global cache of earlier responses grows over the prompts
    of a run, as vLLM's over requests; the warm-up's response is forgotten (:meth:`after_warmup`)."""

    def __init__(self, name: str, model: Any, **settings):
        try:
            from ..suffix import SuffixAssistant, SuffixSettings

            assistant = SuffixAssistant(settings=SuffixSettings(**settings))
        except ImportError as exc:
            raise MethodUnavailable(
                f"baseline {name!r} needs ArcticInference's suffix trees: pip install arctic-inference ({exc})"
            ) from exc
        super().__init__(name, model, assistant)

    def after_warmup(self) -> None:
        self.assistant.clear()


class Recycling(Ours):
    """Token Recycling (:class:`~hf_cascade.recycling.RecyclingAssistant`, defaults: one table per call).
    With ``hot_start`` its table would grow over the prompts of a run; the warm-up's is forgotten either way
    (:meth:`after_warmup`)."""

    def __init__(self, name: str, model: Any):
        from ..recycling import RecyclingAssistant

        super().__init__(name, model, RecyclingAssistant())

    def after_warmup(self) -> None:
        self.assistant.reset()


#: a method name's suffix for the same method with ``cache_implementation="static"`` (eager: the core's static path)
STATIC = "-static"


def static(method: Method, name: str) -> Method:
    """``method`` with ``cache_implementation="static"``, named ``name`` (plain ``generate`` and ours only)."""
    from ..core.static import static_rollback_supported

    if not isinstance(method, Ours) and type(method) is not Method:
        raise ValueError(f"{name!r}: a static-cache variant exists for plain generate and hf_cascade's assistants")
    if isinstance(method, Ours) and not static_rollback_supported():
        raise MethodUnavailable(
            f"{name!r}: hf_cascade runs static caches on transformers >= 5 (found {transformers.__version__})"
        )
    method.name = name
    kwargs = method.extra_kwargs()
    method.extra_kwargs = lambda: {**kwargs, "cache_implementation": "static"}
    return method
