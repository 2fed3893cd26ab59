"""Options as data (:mod:`hf_cascade.options`): every public assistant takes its drafter or head and a few keyword
options, the rest in frozen dataclasses; every keyword an assistant took before raises a ``TypeError`` that names its
new place."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import hf_cascade
from hf_cascade import (
    CapeSettings,
    CascadeAssistant,
    CascadeSettings,
    DynamicWindowAssistant,
    DynamicWindowSettings,
    GlideAssistant,
    GlideSettings,
    Loading,
    MaxGram,
    Policy,
    RecyclingAssistant,
    RecyclingSettings,
    ReDrafterAssistant,
    ReDrafterSettings,
    VerifyCost,
)
from hf_cascade.assistant import Assistant, LinearAssistant, TreeAssistant
from hf_cascade.maxgram_tree import MaxGramTreeAssistant
from hf_cascade.suffix import SuffixAssistant, SuffixSettings

#: What each assistant's __init__ took before its options became data (keyword names, in their old order).
OLD_KEYWORDS = {
    CascadeAssistant: (
        "k_matrix",
        "lenience",
        "tokenizer",
        "maxgram_lenience",
        "min_confidence",
        "maxgram_first",
        "keep_unsure",
        "cost_aware",
        "revision",
        "token",
        "cache_dir",
        "dtype",
        "device_map",
        "place_drafters",
    ),
    DynamicWindowAssistant: (
        "max_window",
        "tau_init",
        "tau2_init",
        "max_target_window",
        "tokenizer",
        "revision",
        "token",
        "cache_dir",
        "dtype",
        "device_map",
        "place_drafters",
        "lookup",
        "cost_aware",
    ),
    GlideAssistant: (
        "cape",
        "draft_length",
        "cape_sizes",
        "cape_thresholds",
        "max_tree_nodes",
        "min_confidence",
        "min_expansion_prob",
        "verify_cost",
        "lookup",
        "revision",
        "token",
        "cache_dir",
        "dtype",
        "device_map",
        "place_drafters",
    ),
    ReDrafterAssistant: (
        "beam_width",
        "beam_length",
        "dedupe",
        "min_confidence",
        "verify_cost",
        "lookup",
        "revision",
        "token",
        "cache_dir",
        "dtype",
        "device_map",
        "place_drafters",
    ),
    RecyclingAssistant: ("top_k", "max_nodes", "max_depth", "max_ngram", "max_matches", "verify_cost", "hot_start"),
    SuffixAssistant: (
        "num_speculative_tokens",
        "max_tree_depth",
        "max_cached_requests",
        "max_spec_factor",
        "min_token_prob",
        "use_tree_spec",
    ),
}
#: The model each assistant is built from in these tests (never loaded: the old keyword is refused first).
FIRST = {
    CascadeAssistant: ([MaxGram()],),
    DynamicWindowAssistant: ("org/drafter",),
    GlideAssistant: ("org/glide",),
    ReDrafterAssistant: ("org/redrafter",),
    RecyclingAssistant: (),
    SuffixAssistant: (),
}


def public_assistants() -> set[type]:
    """Every concrete assistant class of the package (subclasses of :class:`Assistant`, bases left out)."""
    found, todo = set(), [Assistant]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("hf_cascade.") and sub not in (TreeAssistant, LinearAssistant):
                found.add(sub)
    return found


def test_every_public_assistant_takes_at_most_six_parameters():
    classes = public_assistants()
    exported = {getattr(hf_cascade, n) for n in hf_cascade.__all__}
    assert {
        CascadeAssistant,
        DynamicWindowAssistant,
        GlideAssistant,
        ReDrafterAssistant,
        RecyclingAssistant,
        MaxGramTreeAssistant,
        SuffixAssistant,
    } <= classes
    assert {c for c in exported if isinstance(c, type) and issubclass(c, Assistant) and c is not Assistant} <= classes
    for cls in classes:
        params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"]
        assert len(params) <= 6, (cls.__name__, [p.name for p in params])
        options = [p for p in params if p.kind is not p.KEYWORD_ONLY]  # the model(s) alone are positional
        assert len(options) <= 2 and not any(p.kind is p.VAR_KEYWORD for p in params), (cls.__name__, options)


@pytest.mark.parametrize("cls", list(OLD_KEYWORDS), ids=lambda c: c.__name__)
def test_every_old_keyword_names_its_new_place(cls):
    """Each keyword the assistant took before raises a TypeError naming where it went: a field of the strategy's
    settings, of :class:`Policy` or of :class:`Loading` (pre-1.0: no silent aliases)."""
    for name in OLD_KEYWORDS[cls]:
        with pytest.raises(TypeError) as info:
            cls(*FIRST[cls], **{name: None})
        text = str(info.value)
        assert f"{cls.__name__}({name}=...) is now {cls.__name__}(..., " in text, text
        place = text.split(" is now ")[1]
        assert any(f"{option}=" in place for option in ("settings", "policy", "loading")), text


def test_old_keywords_error_examples():
    with pytest.raises(TypeError, match=r"GlideAssistant\(\.\.\., settings=GlideSettings\(cape=CapeSettings\(sizes="):
        GlideAssistant("org/glide", cape_sizes=(3, 1))
    with pytest.raises(TypeError, match=r"policy=Policy\(lookup=\.\.\.\)\) \[Max-Gram's match first"):
        CascadeAssistant([MaxGram()], maxgram_first=False)
    with pytest.raises(TypeError, match=r"Policy\(cost_aware=False\)"):  # verify_cost=None: the paper
        ReDrafterAssistant("org/redrafter", verify_cost=None)
    with pytest.raises(TypeError) as info:  # every old keyword of the call is named
        DynamicWindowAssistant("org/drafter", max_window=4, revision="main", place_drafters=False)
    for place in ("settings=DynamicWindowSettings(max_window=", "loading=Loading(revision=", "loading=Loading(place="):
        assert place in str(info.value)
    with pytest.raises(TypeError, match="positional"):  # options are keywords
        ReDrafterAssistant("org/redrafter", ReDrafterSettings())


def test_options_are_frozen_checked_data():
    for value in (
        Loading(),
        Policy(),
        Policy.paper(),
        CascadeSettings(k_matrix=[[2, 10], [0, 10]]),
        DynamicWindowSettings(),
        GlideSettings(),
        GlideSettings.chain(),
        ReDrafterSettings(),
        RecyclingSettings(),
        SuffixSettings(),
    ):
        assert dataclasses.is_dataclass(value) and type(value).__dataclass_params__.frozen
    assert CascadeSettings(k_matrix=[[2, 10], [0, 10]]).k_matrix == ((2, 10), (0, 10))
    assert GlideSettings(cape=True).cape == CapeSettings() and GlideSettings(cape=False).cape is None
    assert GlideSettings.chain(3) == GlideSettings(3, None)
    assert Policy.paper() == Policy(cost_aware=False, lookup=False)
    with pytest.raises(TypeError, match="VerifyCost"):
        Policy(verify_cost=(1.0, 1.5))
    with pytest.raises(TypeError, match="settings must be a GlideSettings"):
        GlideAssistant("org/glide", settings=ReDrafterSettings())
    with pytest.raises(ValueError, match="lenience"):
        CascadeSettings(lenience=0.5)
    with pytest.raises(ValueError, match="beam_width >= 1"):
        ReDrafterSettings(beam_width=0)
    assert Policy(verify_cost=VerifyCost.flat()).verify_cost(40) == 1.0


def test_policy_reaches_the_strategies():
    """One policy, read the same way by every strategy: the cost rule and the lookup are on by default; the paper's
    preset turns both off (GLIDE's and ReDrafter's lookup branch needs the cost rule's cut)."""
    cascade = CascadeAssistant([MaxGram()], policy=Policy.paper())
    assert cascade.policy == Policy.paper() and cascade.k_matrix == [[10]]
    recycling = RecyclingAssistant(policy=Policy(cost_aware=False))
    assert not recycling.policy.cost_aware and recycling.policy.lookup
