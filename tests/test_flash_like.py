"""Flash attention's mask rules on the CPU (issue 72): every strategy under a flash-like attention
(tests/flash_like.py: flash-attention-2's arithmetic -- no 4-D mask, at most a 2-D padding mask, causal attention
bottom-right aligned over the keys it is handed -- registered through transformers' ``AttentionInterface``) gives
plain ``generate``'s output under the same attention, or a clear error before any forward. The real kernel:
tests/cuda/test_cuda_contract.py (``cuda``).

* the stand-in is flash: bottom-right alignment, and plain ``generate`` under it equals plain ``generate`` under sdpa;
* chains (every linear entry of the registry) on a dynamic cache, a static cache eager and compiled: a compiled static
  cache keeps its whole capacity in its layers, and flash, given no mask, would let a query see every column up to
  ``capacity - q + i``: unwritten and rejected ones (``hf_cascade.core.static.StaticSlots.sliced``);
* batches of chains (left-padded ragged rows; dynamic, static eager and compiled): flash is handed a 2-D ownership
  mask (``hf_cascade.core.batch_state.ownership_mask``: padding, holes and padding queries 0), which it unpads,
  causal attention bottom-right aligned over each row's kept columns: tokens and logits of plain batched
  ``generate`` under the same attention; the mask's rule checked against sdpa on attention alone. Owning the holes,
  or the padding, or handing flash the 4-D mask instead, fails every dynamic and eager case;
* trees (GLIDE + CAPE, ReDrafter with beams, Max-Gram trees, Token Recycling) refuse before any forward, the
  verification profile measured at bind time included, batched or not.
"""

from __future__ import annotations

import pytest
import torch

import hf_cascade  # noqa: F401  (installs the generate() hook)
from hf_cascade import ReDrafterAssistant, ReDrafterSettings
from hf_cascade.core.static import static_rollback_supported
from hf_cascade.maxgram_tree import MaxGramTreeAssistant
from tests.contract_registry import REGISTRY, TREE_ASSISTANTS, base_kit, detached_copy, fresh_kit
from tests.flash_like import NAME, flash_like, flash_like_attention
from tests.static_contract import check_second_pass, check_static_parity, static_cases, static_settings
from tests.test_contract import REPETITIVE, greedy_cases
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)

#: entries whose drafts are trees with branches: they need a tree mask, which flash does not apply
BRANCHING = TREE_ASSISTANTS + ["maxgram_tree", "recycling", "suffix_tree"]
#: every entry of the registry whose drafts are chains, and the tree strategies' chain settings
CHAIN_FACTORIES = {
    **{n: REGISTRY[n] for n in REGISTRY if n not in BRANCHING},
    "redrafter_beam1": lambda k: ReDrafterAssistant(k.head, settings=ReDrafterSettings(beam_width=1)),
    "maxgram_tree_branch1": lambda k: MaxGramTreeAssistant(branches=1),
}
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

    assert torch.allclose(out[0, 0, 0], reference(4, 0), atol=1e-6)  # bottom-right: K - q + 0 = 3
    assert torch.allclose(out[0, 1, 0], reference(5, 1), atol=1e-6)
    sliced, _ = flash_like_attention(_Module(), q, k, v, torch.ones(1, 3, dtype=torch.bool))
    assert torch.allclose(sliced[0, 0, 0], reference(2, 0), atol=1e-6)  # keys sliced to the mask's 3 columns


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


_COMPILED: dict = {}


def gemma3_for(mode: str):
    """The shared gemma3 target, or (compiled) this module's detached copy of it: the compiled forward plain
    ``generate`` keeps stays on the copy."""
    if mode != "compiled":
        return base_kit("gemma3").target
    if "gemma3" not in _COMPILED:
        _COMPILED["gemma3"] = detached_copy(base_kit("gemma3").target)
    return _COMPILED["gemma3"]


@pytest.mark.parametrize("mode", ["dynamic", "eager"] + [pytest.param("compiled", marks=static_only)])
@pytest.mark.parametrize("name", CHAINS)
def test_chains_equal_plain_under_flash(name, mode):
    if mode == "eager" and not static_rollback_supported():
        pytest.skip("static caches need transformers >= 5")
    target = gemma3_for(mode)
    assistant = CHAIN_FACTORIES[name](fresh_kit("gemma3", target))
    with flash_like(target):
        cases = static_cases(target, _settings(mode))  # plain generate under the same attention
        if mode == "compiled":
            check_second_pass(target, assistant, cases, exact=True)
        else:
            check_static_parity(target, assistant, cases, exact=True)


@pytest.mark.measured_costs  # the verification profile measured at bind time, as users get it
@pytest.mark.parametrize("mode", ["dynamic", pytest.param("compiled", marks=static_only)])
@pytest.mark.parametrize("name", BRANCHING)
def test_trees_refused_before_any_forward(name, mode, monkeypatch):
    from hf_cascade import measure

    monkeypatch.setattr(measure, "_MEASURED", {})
    monkeypatch.setenv("HF_CASCADE_PROFILE_ROUNDS", "0")  # nothing read or kept on disk
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


# -- batches ------------------------------------------------------------------------------------------------------


def _count_holes(monkeypatch) -> list[int]:
    """A list that counts the batched steps whose rows kept different numbers of columns (holes)."""
    from hf_cascade.core.batch_state import BatchRun

    holes, keep = [], BatchRun.keep

    def counted(self, kept):
        holes.extend([1] if len({len(k) for k in kept}) > 1 else [])
        return keep(self, kept)

    monkeypatch.setattr(BatchRun, "keep", counted)
    return holes


@pytest.mark.parametrize(
    "name,mode",
    [(n, m) for m in ("dynamic", "eager") for n in CHAINS]
    + [pytest.param(n, "compiled", marks=static_only) for n in ("maxgram", "glide")],
)
def test_batches_of_chains_equal_plain_under_flash(name, mode, free_drafts, open_gate, monkeypatch):
    """A left-padded batch of chains under flash: its padding, its rejected drafts' holes and the finished rows'
    columns hidden by a 2-D ownership mask (``hf_cascade.core.batch_state.ownership_mask``), which flash unpads,
    aligning causal attention (and Gemma3's sliding window) bottom-right over each row's own columns. Plain batched
    ``generate``'s rows under the same attention, float32, identical: dynamic cache on 4 ragged rows (1, 2, 9 and 25
    tokens: compaction), static cache on 2 and 3 ragged rows (rows finishing apart), eager and compiled."""
    from tests.static_contract import (
        check_static_batch_parity,
        default_recompile_limit,
        static_batch_cases,
        strict_recompiles,
    )
    from tests.test_batch import assert_batch_parity, batch_cases, flat_profile

    if mode == "eager" and not static_rollback_supported():
        pytest.skip("static caches need transformers >= 5")
    target = gemma3_for(mode)
    assistant = flat_profile(CHAIN_FACTORIES[name](fresh_kit("gemma3", target)))
    holes = _count_holes(monkeypatch)
    with flash_like(target):
        if mode == "dynamic":
            cases = batch_cases(target)  # plain batched generate, same attention
            assert_batch_parity(target, assistant, cases)
        else:
            cases = static_batch_cases(target, _settings(mode))
            if mode == "compiled":
                # flash's mask (``flash_attention_mask``: ``.all()``) breaks the graph, and transformers' shared
                # frames (deprecation and output wrappers) resume once per function: test_static_contract's limit
                import torch._dynamo

                torch._dynamo.reset()
                with strict_recompiles(recompile_limit=4 * default_recompile_limit()):
                    assert (
                        check_second_pass(target, assistant, cases, exact=True, parity=check_static_batch_parity) == []
                    )
            else:
                assert check_static_batch_parity(target, assistant, cases, exact=True) == []
    assert holes  # rows kept different counts: holes were masked
    if mode != "compiled":
        with flash_like(target):
            _assert_logits_match(target, assistant, mode)


def _assert_logits_match(target, assistant, mode: str) -> None:
    """Every row's logits at every generated position are plain batched ``generate``'s under the same attention, up to
    float32 rounding (a hole or a padding column attended moves them by ~0.5 on gemma3 while greedy tokens may hold:
    the tokens alone are too blunt a witness of the mask)."""
    from tests.static_contract import THREE, left_padded
    from tests.test_batch import ROWS

    ids, mask = left_padded(ROWS if mode == "dynamic" else THREE, "cpu")
    kw = dict(
        do_sample=False,
        max_new_tokens=16,
        return_dict_in_generate=True,
        output_logits=True,
        pad_token_id=0,
        **_settings(mode),
    )
    plain = target.generate(ids, attention_mask=mask, **kw)
    got = target.generate(ids, attention_mask=mask, assistant_model=assistant, **kw)
    assert got.sequences.tolist() == plain.sequences.tolist()
    assert sum(sum(r.accepted_per_call) for r in assistant.last_stats.rows) > 0
    expected, logits = torch.stack(plain.logits), torch.stack(got.logits)
    assert logits.shape == expected.shape
    assert (logits - expected).abs().max().item() < 1e-4


def test_ownership_mask_is_flash_exact():
    """The mask's rule, on attention alone: rows with left padding, holes and padding queries; flash-like attention
    over the 2-D ownership mask equals sdpa under the core's 4-D mask (its chains' causal mask) on every real query,
    with and without a sliding window."""
    from hf_cascade.core.attention import additive, batch_tree_allowed
    from hf_cascade.core.batch_state import ownership_mask

    torch.manual_seed(0)
    past = torch.tensor(
        [
            [-1, -1, 0, 1, -1, 2, 3, -1],  # padding, a hole between, a hole at the end
            [0, 1, 2, 3, 4, 5, 6, 7],
            [-1, -1, -1, -1, -1, 0, -1, 1],
        ]
    )
    query = torch.tensor([[4, 5, 6, -1], [8, -1, -1, -1], [2, 3, 4, 5]])
    n = query.shape[1]
    ancestors = torch.stack(
        [
            torch.ones(n, n, dtype=torch.bool).tril() & ((query[b] >= 0)[None, :] | torch.eye(n, dtype=torch.bool))
            for b in range(3)
        ]
    )
    q, k, v = torch.randn(3, 2, n, 8), torch.randn(3, 2, 8 + n, 8), torch.randn(3, 2, 8 + n, 8)
    for window in (None, 3):
        out, _ = flash_like_attention(_Module(), q, k, v, ownership_mask(past, query), sliding_window=window)
        allowed = batch_tree_allowed(past, query, ancestors, window)
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, additive(allowed, torch.float32))
        real = query >= 0
        assert torch.allclose(out[real], ref.transpose(1, 2)[real], atol=1e-5), window


@pytest.mark.measured_costs
@pytest.mark.parametrize("name", BRANCHING)
def test_batches_of_trees_refused_before_any_forward(name, monkeypatch):
    """A batch of trees under flash is refused before binding measures anything (siblings would see each other
    under flash's causal attention); a batch of chains runs (above)."""
    from hf_cascade import measure
    from tests.static_contract import left_padded

    monkeypatch.setattr(measure, "_MEASURED", {})
    monkeypatch.setenv("HF_CASCADE_PROFILE_ROUNDS", "0")
    target = base_kit("gemma3").target
    assistant = REGISTRY[name](fresh_kit("gemma3", target))
    ids, mask = left_padded([REPETITIVE[0].tolist(), REPETITIVE[0, 3:].tolist()], "cpu")
    forwards = []
    handle = target.register_forward_pre_hook(lambda *a, **k: forwards.append(1))
    try:
        with flash_like(target), pytest.raises(ValueError, match=NAME) as err:
            target.generate(
                ids, attention_mask=mask, do_sample=False, max_new_tokens=5, pad_token_id=0, assistant_model=assistant
            )
    finally:
        handle.remove()
    assert "tree" in str(err.value) and "sdpa" in str(err.value)
    assert forwards == []
