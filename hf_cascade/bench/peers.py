"""The peers a benchmark measures against in their own loops: transformers' prompt lookup and assisted generation
(forwards counted by :class:`~hf_cascade.bench.counting.ForwardCounter`), and economize's prompt lookup."""

from __future__ import annotations

import copy
from typing import Any

import transformers

from ..compat import CACHE
from ..drafters.neural import model_name
from .counting import UNKNOWN, ForwardCounter, economize_stats, transformers_loop_stats
from .methods import Method, MethodUnavailable

ECONOMIZE_VERSION = "0.3.2"
#: Whether economize (if installed) can run here: 0.3.2 predates transformers 5.24's ``cache`` keyword.
ECONOMIZE_RUNS_HERE = CACHE == "past_key_values"
#: Default draft window of the fixed-window assisted baselines: HSDDW's K (App. A.1), ``DynamicWindowAssistant``'s
#: max_window (``BenchConfig.window`` / ``--window`` changes both).
ASSISTED_WINDOW = 10


def assisted_settings(name: str, window: int = ASSISTED_WINDOW) -> dict | None:
    """transformers' assisted-generation settings of the named ``hf-assisted-*`` baselines: ``constant`` is vanilla
    speculative decoding with a fixed window, ``confidence`` adds ``assistant_confidence_threshold=0.4`` (its
    default); ``hf-assisted`` (``None``) keeps the draft model's own generation config."""
    threshold = {"hf-assisted-constant": 0.0, "hf-assisted-confidence": 0.4}.get(name)
    if threshold is None:
        return None
    return {
        "num_assistant_tokens": window,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": threshold,
    }


class _Counted(Method):
    """A baseline in transformers' assisted loop: its target (and draft) forwards are counted while it runs
    (:class:`~hf_cascade.bench.counting.ForwardCounter`) and returned as statistics."""

    has_stats = True
    drafts: tuple = ()

    def run(self, input_ids, attention_mask, gen_kwargs):
        with ForwardCounter(self.model, *self.drafts) as counter:
            out = self.generate(input_ids, attention_mask, gen_kwargs)
        prompt = int(input_ids.shape[-1])
        levels = [(model_name(d), tokens) for d, tokens in zip(self.drafts, counter.tokens[1:])]
        return out, transformers_loop_stats(counter.tokens[0], prompt, int(out.shape[-1]) - prompt, levels)

    def generate(self, input_ids, attention_mask, gen_kwargs):
        return super().run(input_ids, attention_mask, gen_kwargs)[0]

    def level_models(self) -> list:
        return list(self.drafts)


class PromptLookup(_Counted):
    """transformers' prompt lookup decoding (``prompt_lookup_num_tokens=...``)."""

    def __init__(self, name: str, model: Any, num_tokens: int, max_ngram: int | None = None):
        super().__init__(name, model)
        self.kwargs = {"prompt_lookup_num_tokens": num_tokens}
        if max_ngram is not None:
            self.kwargs["max_matching_ngram_size"] = max_ngram

    def extra_kwargs(self) -> dict:
        return dict(self.kwargs)


class HFAssisted(_Counted):
    """transformers' own assisted generation with a draft model; ``settings`` (e.g.
    ``num_assistant_tokens_schedule``) are set on a copy of the draft's generation config for each call."""

    def __init__(self, name: str, model: Any, draft: Any, settings: dict | None = None):
        super().__init__(name, model)
        self.draft = draft
        self.drafts = (draft,)
        self.settings = dict(settings or {})

    def extra_kwargs(self) -> dict:
        return {"assistant_model": self.draft}

    def generate(self, input_ids, attention_mask, gen_kwargs):
        if not self.settings:
            return super().generate(input_ids, attention_mask, gen_kwargs)
        saved = self.draft.generation_config
        self.draft.generation_config = copy.deepcopy(saved)  # transformers 4.x also writes to it
        for key, value in self.settings.items():
            setattr(self.draft.generation_config, key, value)
        try:
            return super().generate(input_ids, attention_mask, gen_kwargs)
        finally:
            self.draft.generation_config = saved


class Economize(Method):
    """economize's prompt-lookup drafter: ``LookupConfig(max_ngram=3)``, ``DecodeConfig(cycle_length=6)``."""

    has_stats = True

    def __init__(self, name: str, model: Any, sampling: bool):
        super().__init__(name, model)
        try:
            import economize
            from economize.techniques.lookup import LookupConfig
        except ImportError as exc:
            raise MethodUnavailable(
                f"baseline 'economize' needs economize=={ECONOMIZE_VERSION}: "
                f"pip install economize=={ECONOMIZE_VERSION} ({exc})"
            ) from exc
        version = getattr(economize, "__version__", "?")
        if version != ECONOMIZE_VERSION:
            raise MethodUnavailable(
                f"baseline 'economize' is defined for economize=={ECONOMIZE_VERSION}, found {version}: "
                f"pip install economize=={ECONOMIZE_VERSION}"
            )
        if CACHE != "past_key_values":
            raise MethodUnavailable(
                f"baseline 'economize': economize=={ECONOMIZE_VERSION} does not run on transformers "
                f"{transformers.__version__} (its generate refuses the cache keyword transformers 5.24 renamed, "
                "past_key_values -> cache); it needs transformers<5.24"
            )
        # Sampling needs a verifier that accepts stochastic selectors (lossless speculative sampling).
        decoding = economize.DecodeConfig(cycle_length=6, verifier="rejection" if sampling else None)
        try:
            self.wrapped = economize.apply(model, LookupConfig(max_ngram=3), decoding=decoding)
        except Exception as exc:  # economize raises its own errors for unsupported architectures
            raise MethodUnavailable(
                f"economize cannot wrap {type(model).__name__}: {type(exc).__name__}: {exc}"
            ) from exc

    def run(self, input_ids, attention_mask, gen_kwargs):
        results: list = []
        out = self.wrapped.generate(input_ids, attention_mask=attention_mask, on_results=results.extend, **gen_kwargs)
        return out, (economize_stats(results[0]) if results else None)

    def level_models(self) -> list:
        return [UNKNOWN]  # its drafter's calls (none for prompt lookup) have no known cost
