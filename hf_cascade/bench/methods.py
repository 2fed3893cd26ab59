"""The methods a benchmark compares: plain ``generate``, transformers' baselines, economize, SuffixDecoding, and ours.

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

import copy
from typing import Any, Callable

import torch
import transformers

from ..assistant import Assistant
from ..backends import cpu_kernels_apply
from ..compat import CACHE
from ..cascade import CascadeAssistant, CascadeSettings
from ..core.payoff import VerifyCost
from ..drafters import CorpusNGrams, MaxGram
from ..drafters.neural import model_name
from ..glide import CapeSettings, GlideAssistant, GlideSettings
from ..hsddw import DynamicWindowAssistant, DynamicWindowSettings
from ..options import Policy
from ..redrafter import ReDrafterAssistant, ReDrafterSettings
from .counting import UNKNOWN, ForwardCounter, assistant_levels, economize_stats, transformers_loop_stats

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
    return {"num_assistant_tokens": window, "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": threshold}


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

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, gen_kwargs: dict) -> tuple[torch.Tensor, dict | None]:
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
        from ..backends.cpu import cpu_kernels              # the backend, imported only for this baseline

        with cpu_kernels(self.model):
            return super().run(input_ids, attention_mask, gen_kwargs)


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


class PlainCompiled(Method):
    """Plain greedy ``generate`` with a static cache, compiled by transformers (``CompileConfig`` with
    ``_compile_all_devices = True`` so it compiles on a CPU too; the backend's default mode): the baseline a GPU
    user compares with. The cache length is the call's rounded up to :data:`CACHE_STEP` columns, so a run's prompts
    share a few cache shapes (each new one recompiles; the warm-up compiles the first)."""

    CACHE_STEP = 256
    BACKEND = "inductor"                  # CompileConfig's default; tests use a backend that generates no code

    def __init__(self, name: str, model: Any):
        from transformers import CompileConfig, GenerationConfig

        super().__init__(name, model, one_forward_per_token=True)
        self.config = CompileConfig(backend=self.BACKEND)
        self.config._compile_all_devices = True
        self.sized = hasattr(GenerationConfig(), "max_cache_len")      # 4.57 sizes the cache by max_length

    def run(self, input_ids, attention_mask, gen_kwargs):
        extra = {"cache_implementation": "static", "compile_config": self.config}
        if self.sized:
            need = input_ids.shape[-1] + int(gen_kwargs.get("max_new_tokens") or 0)
            extra["max_cache_len"] = -(-need // self.CACHE_STEP) * self.CACHE_STEP
        return self.model.generate(input_ids, attention_mask=attention_mask, **gen_kwargs, **extra), None


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
        self.draft.generation_config = copy.deepcopy(saved)   # transformers 4.x also writes to it
        for key, value in self.settings.items():
            setattr(self.draft.generation_config, key, value)
        try:
            return super().generate(input_ids, attention_mask, gen_kwargs)
        finally:
            self.draft.generation_config = saved


class Ours(Method):
    """``generate(..., assistant_model=<an hf_cascade Assistant>)``; statistics from ``last_stats``."""

    has_stats = True

    def __init__(self, name: str, model: Any, assistant: Assistant):
        super().__init__(name, model)
        self.assistant = assistant

    def run(self, input_ids, attention_mask, gen_kwargs):
        out = self.model.generate(input_ids, attention_mask=attention_mask, assistant_model=self.assistant, **gen_kwargs,
                                  **self.extra_kwargs())
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
            raise MethodUnavailable(f"baseline {name!r} needs ArcticInference's suffix trees: pip install arctic-inference "
                                    f"({exc})") from exc
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
                f"baseline 'economize' needs economize=={ECONOMIZE_VERSION}: pip install economize=={ECONOMIZE_VERSION} ({exc})"
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
            raise MethodUnavailable(f"economize cannot wrap {type(model).__name__}: {type(exc).__name__}: {exc}") from exc

    def run(self, input_ids, attention_mask, gen_kwargs):
        results: list = []
        out = self.wrapped.generate(input_ids, attention_mask=attention_mask, on_results=results.extend, **gen_kwargs)
        return out, (economize_stats(results[0]) if results else None)

    def level_models(self) -> list:
        return [UNKNOWN]          # its drafter's calls (none for prompt lookup) have no known cost


def build_method(name: str, model: Any, drafts: list, *, strategy_kwargs: dict | None = None, sampling: bool = False,
                 verifier: Any = None, assisted_draft: Any = None, window: int | None = None,
                 tree: dict | None = None, corpus: CorpusNGrams | None = None, maxgram_kwargs: dict | None = None,
                 maxgram_corpus: CorpusNGrams | None = None) -> Method:
    """The :class:`Method` named ``name`` (a baseline of :data:`~hf_cascade.bench.config.BASELINES` or a
    strategy of :data:`~hf_cascade.bench.config.STRATEGIES`), with ``drafts`` the draft models of its strategy.

    Rule: an assistant gets only the options given here; everything else is its library default.
    ``strategy_kwargs``: the cascade's options of the ``cascade``, flat (:func:`cascade_options`);
    ``maxgram_kwargs`` those of Max-Gram alone (``maxgram``, ``maxgram-hf-loop``); ``window``: HSDDW's
    ``max_window`` and the fixed window of the ``hf-assisted-constant`` / ``-confidence`` baselines (``None``:
    HSDDW's default, :data:`ASSISTED_WINDOW` for them); ``tree``: settings of the tree strategies
    (``draft_length``, ``max_tree_nodes``, ``min_confidence``, ``min_expansion_prob``, ``verify_cost`` for GLIDE;
    ``beam_width``, ``beam_length``, ``min_confidence`` for ReDrafter; a ``None`` value counts as not given);
    ``corpus``: the corpus n-grams of the cascade's Max-Gram and of the ``maxgram-corpus`` baseline,
    ``maxgram_corpus`` those of Max-Gram alone."""
    tree = {k: v for k, v in (tree or {}).items() if v is not None}
    cascade_kwargs, maxgram_kwargs = cascade_options(strategy_kwargs or {}), cascade_options(maxgram_kwargs or {})
    glide = {k: tree[k] for k in ("draft_length", "min_confidence") if k in tree}
    cape = {new: tree[old] for old, new in (("max_tree_nodes", "max_nodes"), ("min_expansion_prob", "min_prob"))
            if old in tree}
    glide_options = {"settings": GlideSettings(**glide, cape=CapeSettings(**cape))} if glide or cape else {}
    chain_options = {"settings": GlideSettings(**glide, cape=None)}
    cost = tree.get("verify_cost")
    if cost:                                      # True / "reference": the reference CPU's profile; or a measured one
        policy = Policy(verify_cost=cost if isinstance(cost, VerifyCost) else VerifyCost.reference())
        glide_options, chain_options = {**glide_options, "policy": policy}, {**chain_options, "policy": policy}
    beams = {k: tree[k] for k in ("beam_width", "beam_length", "min_confidence") if k in tree}
    hf_drafts = [assisted_draft] if assisted_draft is not None else drafts
    hsddw = {} if window is None else {"settings": DynamicWindowSettings(max_window=window)}
    builders: dict[str, Callable[[], Method]] = {
        "plain": lambda: Method("plain", model, one_forward_per_token=True),
        "plain-kernels": lambda: PlainKernels("plain-kernels", model),
        "plain-compiled": lambda: PlainCompiled("plain-compiled", model),
        "pld": lambda: PromptLookup("pld", model, num_tokens=10),
        "pld-tuned": lambda: PromptLookup("pld-tuned", model, num_tokens=5, max_ngram=3),
        "hf-assisted": lambda: _hf_assisted("hf-assisted", model, hf_drafts, window),
        "hf-assisted-constant": lambda: _hf_assisted("hf-assisted-constant", model, hf_drafts, window),
        "hf-assisted-confidence": lambda: _hf_assisted("hf-assisted-confidence", model, hf_drafts, window),
        "economize": lambda: Economize("economize", model, sampling),
        "maxgram": lambda: Ours("maxgram", model, CascadeAssistant([MaxGram(corpus=maxgram_corpus)], **maxgram_kwargs)),
        # the same Max-Gram in transformers' own assisted loop instead of the decoding core (loop A/B)
        "maxgram-hf-loop": lambda: _in_transformers_loop(Ours("maxgram-hf-loop", model, CascadeAssistant(
            [MaxGram(corpus=maxgram_corpus)], **maxgram_kwargs))),
        # Max-Gram alone, continuing weak matches from the corpus n-grams (--corpus)
        "maxgram-corpus": lambda: _maxgram_corpus(model, corpus),
        "cascade": lambda: _cascade(model, drafts, cascade_kwargs, corpus),
        "hsddw": lambda: _hsddw("hsddw", model, drafts, verifier, hsddw),
        # HSDDW's one-draft-model form (Algorithm 1) beside the hierarchical one (--verifier), same run
        "hsddw-single": lambda: _hsddw("hsddw-single", model, drafts, None, hsddw),
        # HSDDW's draft models at every step the lookup leaves (cost_aware=False: the paper's, no payoff rule)
        "hsddw-every-step": lambda: _hsddw("hsddw-every-step", model, drafts, verifier,
                                           {**hsddw, "policy": Policy(cost_aware=False)}),
        # GLIDE with the library's defaults (the strategy) and as a chain without CAPE (the paper's GLIDE alone)
        "glide": lambda: _tree("glide", model, drafts, GlideAssistant, **glide_options),
        "glide-chain": lambda: _tree("glide-chain", model, drafts, GlideAssistant, **chain_options),
        # ReDrafter: beams packed into a prefix tree (the strategy), beam width 1, and the beams verified flat
        "redrafter": lambda: _tree("redrafter", model, drafts, ReDrafterAssistant,
                                   **({"settings": ReDrafterSettings(**beams)} if beams else {})),
        "redrafter-w1": lambda: _tree("redrafter-w1", model, drafts, ReDrafterAssistant,
                                      settings=ReDrafterSettings(**{**beams, "beam_width": 1})),
        "redrafter-flat": lambda: _tree("redrafter-flat", model, drafts, ReDrafterAssistant,
                                        settings=ReDrafterSettings(**beams, dedupe=False)),
        # Token Recycling: the target's own earlier top-k candidates as a tree (no draft model)
        "recycling": lambda: Recycling("recycling", model),
        # SuffixDecoding (ArcticInference's suffix trees, vLLM's defaults): linear drafts as vLLM runs it, and trees
        "suffix": lambda: Suffix("suffix", model),
        "suffix-tree": lambda: Suffix("suffix-tree", model, use_tree_spec=True),
    }
    if name.endswith(STATIC) and name[: -len(STATIC)] in builders:
        return _static(builders[name[: -len(STATIC)]](), name)
    if name not in builders:
        raise ValueError(f"unknown method {name!r}")
    return builders[name]()


#: a method name's suffix for the same method with ``cache_implementation="static"`` (eager: the core's static path)
STATIC = "-static"


def _static(method: Method, name: str) -> Method:
    from ..core.static import static_rollback_supported

    if not isinstance(method, Ours) and type(method) is not Method:
        raise ValueError(f"{name!r}: a static-cache variant exists for plain generate and hf_cascade's assistants")
    if isinstance(method, Ours) and not static_rollback_supported():
        raise MethodUnavailable(f"{name!r}: hf_cascade runs static caches on transformers >= 5 "
                                f"(found {transformers.__version__})")
    method.name = name
    kwargs = method.extra_kwargs()
    method.extra_kwargs = lambda: {**kwargs, "cache_implementation": "static"}
    return method


def cascade_options(flat: dict) -> dict:
    """The cascade's options given flat (the bench's names: :class:`~hf_cascade.cascade.CascadeSettings`' fields,
    ``cost_aware``, ``maxgram_first``) as ``CascadeAssistant``'s keywords; only what is given."""
    flat = dict(flat)
    policy = {"cost_aware": flat.pop("cost_aware")} if "cost_aware" in flat else {}
    if "maxgram_first" in flat:
        policy["lookup"] = flat.pop("maxgram_first")
    options = {"settings": CascadeSettings(**flat)} if flat else {}
    return {**options, "policy": Policy(**policy)} if policy else options


def _in_transformers_loop(method: "Ours") -> "Ours":
    method.assistant.loop = "transformers"
    return method


def _hf_assisted(name: str, model: Any, drafts: list, window: int | None) -> Method:
    if not drafts:
        raise MethodUnavailable(f"baseline {name!r} needs a draft model: pass --draft PATH or --assisted-draft PATH")
    return HFAssisted(name, model, drafts[0], assisted_settings(name, ASSISTED_WINDOW if window is None else window))


def _maxgram_corpus(model: Any, corpus: CorpusNGrams | None) -> Method:
    if corpus is None:
        raise MethodUnavailable("baseline 'maxgram-corpus' needs corpus n-grams: pass --corpus FILE (hf-cascade corpus)")
    return Ours("maxgram-corpus", model, CascadeAssistant([MaxGram(corpus=corpus)]))


def _cascade(model: Any, drafts: list, strategy_kwargs: dict, corpus: CorpusNGrams | None = None) -> Method:
    if not drafts:
        raise MethodUnavailable("strategy 'cascade' needs at least one draft model: pass --draft cascade=PATH "
                                "(repeated for several, largest first)")
    return Ours("cascade", model, CascadeAssistant([*drafts, MaxGram(corpus=corpus)], **strategy_kwargs))


def _hsddw(name: str, model: Any, drafts: list, verifier: Any, options: dict) -> Method:
    if not drafts:
        raise MethodUnavailable(f"{name!r} needs a draft model: pass --draft hsddw=PATH (and optionally --verifier PATH)")
    return Ours(name, model, DynamicWindowAssistant(drafts[0], verifier, **options))


def _tree(name: str, model: Any, drafts: list, assistant: type, **kwargs) -> Method:
    if not drafts:
        family = name.split('-')[0]
        raise MethodUnavailable(f"{name!r} needs its trained head: pass --draft {family}=PATH (hf-cascade train {family})")
    return Ours(name, model, assistant(drafts[0], **kwargs))
