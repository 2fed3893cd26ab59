"""Every benchmark method by name (:func:`build_method`): the baselines of :data:`~hf_cascade.bench.config.BASELINES`
and the strategies of :data:`~hf_cascade.bench.config.STRATEGIES`, with only the options the run gives (the rest are
the library's defaults)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..cascade import CascadeAssistant, CascadeSettings
from ..core.payoff import VerifyCost
from ..drafters import CorpusNGrams, MaxGram
from ..glide import CapeSettings, GlideAssistant, GlideSettings
from ..hsddw import DynamicWindowAssistant, DynamicWindowSettings
from ..options import Policy
from ..redrafter import ReDrafterAssistant, ReDrafterSettings
from .methods import STATIC, Method, MethodUnavailable, Ours, PlainCompiled, PlainKernels, Recycling, Suffix, static
from .peers import ASSISTED_WINDOW, Economize, HFAssisted, PromptLookup, assisted_settings


def build_method(
    name: str,
    model: Any,
    drafts: list,
    *,
    strategy_kwargs: dict | None = None,
    sampling: bool = False,
    verifier: Any = None,
    assisted_draft: Any = None,
    window: int | None = None,
    tree: dict | None = None,
    corpus: CorpusNGrams | None = None,
    maxgram_kwargs: dict | None = None,
    maxgram_corpus: CorpusNGrams | None = None,
) -> Method:
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
    cape = {
        new: tree[old]
        for old, new in (("max_tree_nodes", "max_nodes"), ("min_expansion_prob", "min_prob"))
        if old in tree
    }
    glide_options = {"settings": GlideSettings(**glide, cape=CapeSettings(**cape))} if glide or cape else {}
    chain_options = {"settings": GlideSettings(**glide, cape=None)}
    cost = tree.get("verify_cost")
    if cost:  # True / "reference": the reference CPU's profile; or a measured one
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
        "maxgram-hf-loop": lambda: _in_transformers_loop(
            Ours("maxgram-hf-loop", model, CascadeAssistant([MaxGram(corpus=maxgram_corpus)], **maxgram_kwargs))
        ),
        # Max-Gram alone, continuing weak matches from the corpus n-grams (--corpus)
        "maxgram-corpus": lambda: _maxgram_corpus(model, corpus),
        "cascade": lambda: _cascade(model, drafts, cascade_kwargs, corpus),
        "hsddw": lambda: _hsddw("hsddw", model, drafts, verifier, hsddw),
        # HSDDW's one-draft-model form (Algorithm 1) beside the hierarchical one (--verifier), same run
        "hsddw-single": lambda: _hsddw("hsddw-single", model, drafts, None, hsddw),
        # HSDDW's draft models at every step the lookup leaves (cost_aware=False: the paper's, no payoff rule)
        "hsddw-every-step": lambda: _hsddw(
            "hsddw-every-step", model, drafts, verifier, {**hsddw, "policy": Policy(cost_aware=False)}
        ),
        # GLIDE with the library's defaults (the strategy) and as a chain without CAPE (the paper's GLIDE alone)
        "glide": lambda: _tree("glide", model, drafts, GlideAssistant, **glide_options),
        "glide-chain": lambda: _tree("glide-chain", model, drafts, GlideAssistant, **chain_options),
        # ReDrafter: beams packed into a prefix tree (the strategy), beam width 1, and the beams verified flat
        "redrafter": lambda: _tree(
            "redrafter",
            model,
            drafts,
            ReDrafterAssistant,
            **({"settings": ReDrafterSettings(**beams)} if beams else {}),
        ),
        "redrafter-w1": lambda: _tree(
            "redrafter-w1", model, drafts, ReDrafterAssistant, settings=ReDrafterSettings(**{**beams, "beam_width": 1})
        ),
        "redrafter-flat": lambda: _tree(
            "redrafter-flat", model, drafts, ReDrafterAssistant, settings=ReDrafterSettings(**beams, dedupe=False)
        ),
        # Token Recycling: the target's own earlier top-k candidates as a tree (no draft model)
        "recycling": lambda: Recycling("recycling", model),
        # SuffixDecoding (ArcticInference's suffix trees, vLLM's defaults): linear drafts as vLLM runs it, and trees
        "suffix": lambda: Suffix("suffix", model),
        "suffix-tree": lambda: Suffix("suffix-tree", model, use_tree_spec=True),
    }
    if name.endswith(STATIC) and name[: -len(STATIC)] in builders:
        return static(builders[name[: -len(STATIC)]](), name)
    if name not in builders:
        raise ValueError(f"unknown method {name!r}")
    return builders[name]()


def cascade_options(flat: dict) -> dict:
    """The cascade's options given flat (the bench's names: :class:`~hf_cascade.cascade.CascadeSettings`' fields,
    ``cost_aware``, ``maxgram_first``) as ``CascadeAssistant``'s keywords; only what is given."""
    flat = dict(flat)
    policy = {"cost_aware": flat.pop("cost_aware")} if "cost_aware" in flat else {}
    if "maxgram_first" in flat:
        policy["lookup"] = flat.pop("maxgram_first")
    options = {"settings": CascadeSettings(**flat)} if flat else {}
    return {**options, "policy": Policy(**policy)} if policy else options


def _in_transformers_loop(method: Ours) -> Ours:
    method.assistant.loop = "transformers"
    return method


def _hf_assisted(name: str, model: Any, drafts: list, window: int | None) -> Method:
    if not drafts:
        raise MethodUnavailable(f"baseline {name!r} needs a draft model: pass --draft PATH or --assisted-draft PATH")
    return HFAssisted(name, model, drafts[0], assisted_settings(name, ASSISTED_WINDOW if window is None else window))


def _maxgram_corpus(model: Any, corpus: CorpusNGrams | None) -> Method:
    if corpus is None:
        raise MethodUnavailable(
            "baseline 'maxgram-corpus' needs corpus n-grams: pass --corpus FILE (hf-cascade corpus)"
        )
    return Ours("maxgram-corpus", model, CascadeAssistant([MaxGram(corpus=corpus)]))


def _cascade(model: Any, drafts: list, strategy_kwargs: dict, corpus: CorpusNGrams | None = None) -> Method:
    if not drafts:
        raise MethodUnavailable(
            "strategy 'cascade' needs at least one draft model: pass --draft cascade=PATH "
            "(repeated for several, largest first)"
        )
    return Ours("cascade", model, CascadeAssistant([*drafts, MaxGram(corpus=corpus)], **strategy_kwargs))


def _hsddw(name: str, model: Any, drafts: list, verifier: Any, options: dict) -> Method:
    if not drafts:
        raise MethodUnavailable(
            f"{name!r} needs a draft model: pass --draft hsddw=PATH (and optionally --verifier PATH)"
        )
    return Ours(name, model, DynamicWindowAssistant(drafts[0], verifier, **options))


def _tree(name: str, model: Any, drafts: list, assistant: type, **kwargs) -> Method:
    if not drafts:
        family = name.split("-")[0]
        raise MethodUnavailable(
            f"{name!r} needs its trained head: pass --draft {family}=PATH (hf-cascade train {family})"
        )
    return Ours(name, model, assistant(drafts[0], **kwargs))
