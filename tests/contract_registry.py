"""The registry of the contract (tests/test_contract.py, tests/cuda): every assistant in its main
configurations, the tiny targets and the target settings it runs on."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hf_cascade import (
    CascadeAssistant,
    CascadeSettings,
    DynamicWindowAssistant,
    DynamicWindowSettings,
    GlideAssistant,
    GlideSettings,
    MaxGram,
    Policy,
    ReDrafterAssistant,
    ReDrafterSettings,
)
from hf_cascade.maxgram_tree import MaxGramTreeAssistant
from hf_cascade.recycling import RecyclingAssistant
from tests import tiny_models as tm
from tests.redrafter_helpers import fit_head
from tests.test_glide_decode import echo_glide

# -- the registry ---------------------------------------------------------------------------------------


@dataclass
class Kit:
    """A target and what the assistants are built from: ``drafter`` (a noisy copy of the target: drafts
    get accepted and rejected), ``big`` (a closer noisy copy: HSDDW's verifier), ``glide`` (a GLIDE tied to
    this target), ``head`` (a ReDrafter head trained on the target's outputs). All fp32, on the CPU."""

    target: torch.nn.Module
    drafter: torch.nn.Module
    big: torch.nn.Module
    glide: torch.nn.Module
    head: torch.nn.Module

    def models(self) -> list:
        return [self.drafter, self.big, self.glide, self.head]


def suffix_decoding(**settings) -> Callable[[Kit], object]:
    """A :class:`~hf_cascade.suffix.SuffixAssistant` factory; the test skips where ArcticInference's suffix trees
    are not installed (its C++ build does not fit CI's time: ``pip install -e '.[suffix]'``)."""

    def make(kit: Kit):
        import pytest

        pytest.importorskip(
            "arctic_inference.suffix_decoding",
            reason="SuffixDecoding needs arctic-inference (pip install -e '.[suffix]'; not in CI)",
        )
        from hf_cascade.suffix import SuffixAssistant, SuffixSettings

        return SuffixAssistant(settings=SuffixSettings(**settings))

    return make


REGISTRY: dict[str, Callable[[Kit], object]] = {
    "maxgram": lambda k: CascadeAssistant([MaxGram()]),
    "drafter+maxgram": lambda k: CascadeAssistant([k.drafter, MaxGram()]),
    "lenience3": lambda k: CascadeAssistant(
        [k.drafter, MaxGram(adaptive=False, max_tokens=5)], settings=CascadeSettings(lenience=3.0)
    ),
    "maxgram_first_cost_aware": lambda k: CascadeAssistant(
        [k.drafter, MaxGram()], settings=CascadeSettings(k_matrix=[[6, 10], [0, 10]])
    ),
    "hsddw": lambda k: DynamicWindowAssistant(
        k.drafter, k.big, settings=DynamicWindowSettings(max_window=4, tau_init=2.0, tau2_init=2.0)
    ),
    "glide": lambda k: GlideAssistant(k.glide, settings=GlideSettings.chain()),
    "glide_cape": lambda k: GlideAssistant(k.glide),
    "redrafter": lambda k: ReDrafterAssistant(k.head, settings=ReDrafterSettings(beam_width=4, beam_length=4)),
    # with a memory of the earlier calls' answers (its state between calls, by design: drafts only, so outputs
    # still equal a fresh assistant's; the statistics do not: STATEFUL)
    "maxgram_memory": lambda k: CascadeAssistant([MaxGram()], policy=Policy(memory=10_000)),
    "maxgram_tree": lambda k: MaxGramTreeAssistant(),
    "recycling": lambda k: RecyclingAssistant(),
    # without the global tree of earlier calls' outputs (its only state between calls, by design: the contract's
    # "no state leak" holds for the rest); drafting from it across calls is tests/test_suffix.py's
    "suffix": suffix_decoding(max_cached_requests=0),
    "suffix_tree": suffix_decoding(max_cached_requests=0, use_tree_spec=True, max_spec_factor=2.0),
}
#: the entries whose drafts are one path (transformers ``CandidateGenerator`` s: they also run in its own loop)
LINEAR = ["maxgram", "maxgram_memory", "drafter+maxgram", "lenience3", "maxgram_first_cost_aware", "hsddw", "suffix"]

#: entries that keep state between calls on purpose (the answer memory): a reused one gives a fresh one's outputs, not
#: its statistics
STATEFUL = ["maxgram_memory"]

#: entries drafting with a model (drafter or head): the placement rules apply to them
WITH_MODELS = ["drafter+maxgram", "lenience3", "maxgram_first_cost_aware", "hsddw", "glide", "glide_cape", "redrafter"]
TREE_ASSISTANTS = ["glide_cape", "redrafter"]


def models_used(assistant, kit: Kit) -> list:
    """The kit's models ``assistant`` holds (in its attributes, lists and tuples)."""
    held = []
    for value in vars(assistant).values():
        held += list(value) if isinstance(value, (list, tuple)) else [value]
    return [m for m in kit.models() if any(m is h for h in held)]


def assert_placed(models, device: torch.device, dtype: torch.dtype) -> None:
    """Every floating-point parameter of ``models`` is on ``device`` in ``dtype`` (where binding puts them)."""
    for m in models:
        for name, p in m.named_parameters():
            assert p.device == device, (type(m).__name__, name, p.device)
            if p.is_floating_point():
                assert p.dtype == dtype, (type(m).__name__, name, p.dtype)


# -- targets --------------------------------------------------------------------------------------------

_BASE: dict = {}


def base_kit(arch: str) -> Kit:
    """The fp32 sdpa target of ``arch`` ("llama", "gemma3", "small": a 16-token vocabulary) and its
    drafters, built once per session (``glide`` is built per test: it ties to a target)."""
    if arch not in _BASE:
        if arch == "small":
            target = tm.llama(vocab_size=16, layers=1, hidden=16, seed=3)
            target.generation_config.eos_token_id = None  # every sampled run has the same length
            drafter, big = tm.noisy_copy(target, noise=0.6, seed=2), tm.noisy_copy(target, noise=0.3, seed=4)
            head = fit_head(target, "small", steps=60, L=3)
        else:
            target = tm.llama_target() if arch == "llama" else tm.gemma3_target()
            drafter, big = tm.noisy_copy(target, noise=0.3), tm.noisy_copy(target, noise=0.15, seed=7)
            head = fit_head(target, arch, steps=80)
        _BASE[arch] = Kit(target, drafter, big, None, head)
    return _BASE[arch]


#: what transformers keeps on a model whose plain ``generate`` compiled its forward (bound to that model: a
#: ``copy.deepcopy`` carries it, and the copy would run the original)
COMPILED_STATE = ("_compiled_call", "_last_compile_config")


def detached_copy(model):
    """A deep copy of ``model`` without the compiled forward transformers keeps on it (:data:`COMPILED_STATE`): a
    shared target of :func:`base_kit` or :func:`setting_target` may hold one (a module compiles it in place and keeps
    its graphs across its tests), and a plain ``copy.deepcopy`` would carry it: the copy (in bf16, say) would then run
    the shared model's compiled call. Every copy of a shared target is made with this."""
    out = copy.deepcopy(model)
    for name in COMPILED_STATE:
        out.__dict__.pop(name, None)
    return out


def fresh_kit(arch: str, target) -> Kit:
    """Fresh fp32 CPU copies of ``arch``'s drafters and head (binding may move and cast them in place: no
    test sees another's) and a GLIDE tied to ``target``."""
    base = base_kit(arch)
    return Kit(
        target, copy.deepcopy(base.drafter), copy.deepcopy(base.big), echo_glide(target, 0.3), copy.deepcopy(base.head)
    )


def input_device(model) -> torch.device:
    """Where ``model`` takes its input ids: its input embeddings' device, or accelerate's execution device
    when they are offloaded (``meta``)."""
    emb = model.get_input_embeddings()
    if emb.weight.device.type != "meta":
        return emb.weight.device
    for module in (emb, model):
        hook = getattr(module, "_hf_hook", None)
        for h in getattr(hook, "hooks", None) or [hook]:
            device = getattr(h, "execution_device", None)
            if device is not None:
                return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    return torch.device("cpu")


def with_attention(model, impl: str):
    model = detached_copy(model)
    model.set_attn_implementation(impl)
    return model


def offloaded(model):
    """``model`` dispatched by accelerate with CPU offload: weights on ``meta`` between forwards."""
    import accelerate

    model = detached_copy(model)
    accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    assert next(model.parameters()).device.type == "meta"
    return model


#: setting -> (architecture, target from the fp32 base target)
SETTINGS: dict[str, tuple[str, Callable]] = {
    "llama-sdpa": ("llama", lambda t: with_attention(t, "sdpa")),
    "gemma3-eager": ("gemma3", lambda t: with_attention(t, "eager")),
    "gemma3-sdpa": ("gemma3", lambda t: with_attention(t, "sdpa")),
    "gemma3-bf16": ("gemma3", lambda t: detached_copy(t).to(torch.bfloat16)),
    "gemma3-offload": ("gemma3", offloaded),
}

_TARGETS: dict = {}


def setting_target(setting: str):
    if setting not in _TARGETS:
        arch, make = SETTINGS[setting]
        _TARGETS[setting] = make(base_kit(arch).target)
    return _TARGETS[setting]
