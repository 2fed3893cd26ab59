"""Flash attention's mask rules on the CPU (issue 72): every strategy under a flash-like attention
(tests/flash_like.py: flash-attention-2's arithmetic -- no 4-D mask, at most a 2-D padding mask, causal attention
bottom-right aligned over the keys it is handed -- registered through transformers' ``AttentionInterface``) gives
plain ``generate``'s output under the same attention, or a clear error before any forward. The real kernel:
tests/cuda/test_cuda_contract.py (``cuda``).

* the stand-in is flash: bottom-right alignment, and plain ``generate`` under it equals plain ``generate`` under sdpa;
* chains (every linear entry of the registry) on a dynamic cache, a static cache eager and compiled: a compiled static
  cache keeps its whole capacity in its layers, and flash, given no mask, would let a query see every column up to
  ``capacity - q + i``: unwritten and rejected ones (``hf_cascade.core.static.StaticSlots.sliced``);
* trees (GLIDE + CAPE, ReDrafter with beams, Max-Gram trees, Token Recycling) refuse before any forward, the
  verification profile measured at bind time included.
"""

from __future__ import annotations

import pytest
import torch

import hf_cascade  # noqa: F401  (installs the generate() hook)
from hf_cascade import ReDrafterAssistant, ReDrafterSettings
from hf_cascade.core.static import static_rollback_supported
from hf_cascade.maxgram_tree import MaxGramTreeAssistant
from tests.contract_registry import REGISTRY, TREE_ASSISTANTS, base_kit, fresh_kit
from tests.flash_like import NAME, flash_like, flash_like_attention
from tests.static_contract import check_second_pass, check_static_parity, static_cases, static_settings
from tests.test_contract import REPETITIVE, greedy_cases
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

#: entries whose drafts are trees with branches: they need a tree mask, which flash does not apply
BRANCHING = TREE_ASSISTANTS + ["maxgram_tree", "recycling", "suffix_tree"]
#: every entry of the registry whose drafts are chains, and the tree strategies' chain settings
CHAIN_FACTORIES = {**{n: REGISTRY[n] for n in REGISTRY if n not in BRANCHING},
                   "redrafter_beam1": lambda k: ReDrafterAssistant(k.head, settings=ReDrafterSettings(beam_width=1)),
                   "maxgram_tree_branch1": lambda k: MaxGramTreeAssistant(branches=1)}
CHAINS = list(CHAIN_FACTORIES)
static_only = pytest.mark.skipif(not static_rollback_supported(), reason="static caches need transformers >= 5")


class _Module:
    is_causal = True


def test_stand_in_is_bottom_right_causal():
    """Given no mask, query ``i`` of ``q`` sees keys ``0 .. K - q + i``; given a 2-D mask, the layer is sliced to its
    columns and its zeros are not attended."""
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 5, 4), torch.randn(1, 1, 5, 4)
    out, _ = flash_like_attention(_Module(), q, k, v, None)

    def reference(keys: int, query: int) -> torch.Tensor:
        w = torch.softmax(q[0, 0, query] @ k[0, 0, :keys].T * 0.5, -1)
        return w @ v[0, 0, :keys]

    assert torch.allclose(out[0, 0, 0], reference(4, 0), atol=1e-6)          # bottom-right: K - q + 0 = 3
    assert torch.allclose(out[0, 1, 0], reference(5, 1), atol=1e-6)
    sliced, _ = flash_like_attention(_Module(), q, k, v, torch.ones(1, 3, dtype=torch.bool))
    assert torch.allclose(sliced[0, 0, 0], reference(2, 0), atol=1e-6)       # keys sliced to the mask's 3 columns


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_plain_generate_under_the_stand_in_is_plain_sdpa(arch):
    target = base_kit(arch).target
    expected = [out for _, _, _, out in greedy_cases(target)]
    with flash_like(target):
        assert target.config._attn_implementation == NAME
        got = [target.generate(prompt, do_sample=False, **kw).tolist() for _, prompt, kw, _ in greedy_cases(target)]
    assert got == expected


def _settings(mode: str) -> dict:
    return {} if mode == "dynamic" else static_settings(mode, "cpu")


@pytest.mark.parametrize("mode", ["dynamic", "eager"] + [pytest.param("compiled", marks=static_only)])
@pytest.mark.parametrize("name", CHAINS)
def test_chains_equal_plain_under_flash(name, mode):
    if mode == "eager" and not static_rollback_supported():
        pytest.skip("static caches need transformers >= 5")
    target = base_kit("gemma3").target
    assistant = CHAIN_FACTORIES[name](fresh_kit("gemma3", target))
    with flash_like(target):
        cases = static_cases(target, _settings(mode))                  # plain generate under the same attention
        if mode == "compiled":
            check_second_pass(target, assistant, cases, exact=True)
        else:
            check_static_parity(target, assistant, cases, exact=True)


@pytest.mark.measured_costs                   # the verification profile measured at bind time, as users get it
@pytest.mark.parametrize("mode", ["dynamic", "compiled"])
@pytest.mark.parametrize("name", BRANCHING)
def test_trees_refused_before_any_forward(name, mode, monkeypatch):
    from hf_cascade import measure

    monkeypatch.setattr(measure, "_MEASURED", {})
    monkeypatch.setenv("HF_CASCADE_PROFILE_ROUNDS", "0")        # nothing read or kept on disk
    target = base_kit("gemma3").target
    assistant = REGISTRY[name](fresh_kit("gemma3", target))
    forwards = []
    handle = target.register_forward_pre_hook(lambda *a, **k: forwards.append(1))
    try:
        with flash_like(target), pytest.raises(ValueError, match=NAME) as err:
            target.generate(REPETITIVE, do_sample=False, max_new_tokens=5, assistant_model=assistant, **_settings(mode))
    finally:
        handle.remove()
    assert "tree" in str(err.value) and "sdpa" in str(err.value)
    assert forwards == []


@pytest.mark.measured_costs
def test_batches_refused_before_any_forward(monkeypatch):
    """A batch keeps padding and rejected drafts' columns in its rows, which only the core's 4-D mask hides: under
    flash even a batch of chains is refused, before binding measures anything."""
    from hf_cascade import CascadeAssistant, MaxGram, measure
    from tests.static_contract import left_padded

    monkeypatch.setattr(measure, "_MEASURED", {})
    monkeypatch.setenv("HF_CASCADE_PROFILE_ROUNDS", "0")
    target = base_kit("gemma3").target
    ids, mask = left_padded([REPETITIVE[0].tolist(), REPETITIVE[0, 3:].tolist()], "cpu")
    forwards = []
    handle = target.register_forward_pre_hook(lambda *a, **k: forwards.append(1))
    try:
        with flash_like(target), pytest.raises(ValueError, match="batches") as err:
            target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=5,
                            assistant_model=CascadeAssistant([MaxGram()]))
    finally:
        handle.remove()
    assert NAME in str(err.value)
    assert forwards == []
