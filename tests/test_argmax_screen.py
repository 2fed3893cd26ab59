"""The output head's exact argmax through an int8 screen (hf_cascade/backends/cpu/argmax_screen.py,
``panel_linear_i8`` of csrc/panel_linear.cpp, ``panel_screen_vnni`` of csrc/screen.cpp): the widened, scaled int8
product and the integer product (AVX512-VNNI builds) against their definitions, the error bound
the screen relies on, the argmax on near-ties the int8 copy cannot tell apart, its use by the core's rows
(greedy acceptance unchanged; a row read in full afterwards is computed in full), and where the core uses it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LogitsProcessorList

from hf_cascade.backends.cpu.argmax_screen import ArgmaxScreen, argmax_screen, screen_choices
from hf_cascade.backends.cpu.panel import PANEL, extension
from hf_cascade.core.accept import greedy_tree_accept
from hf_cascade.core.rows import TreeRows
from hf_cascade.core.structure import TokenTree

pytestmark = pytest.mark.skipif(not PANEL.available(), reason="the panel kernel did not build on this machine")

#: whether the kernel was built with the integer product (it needs AVX512-VNNI)
HAS_VNNI = PANEL.available() and hasattr(extension(), "panel_screen_vnni")
needs_vnni = pytest.mark.skipif(not HAS_VNNI, reason="the kernel was built without AVX512-VNNI (this CPU lacks it)")
#: the screen's products; the integer cases are collected everywhere and skip, with the reason, where not built
PRODUCTS = ["float", pytest.param("integer", marks=needs_vnni)]
#: the products built here
BUILT = ["float"] + (["integer"] if HAS_VNNI else [])


def _int8_copy(w: torch.Tensor) -> torch.Tensor:
    """What ``pack_panels_i8`` stores, as float64 rows: ``a_j round(w_j / a_j)``, ``a_j = max|w_j| / 127``."""
    a = w.abs().amax(dim=1, keepdim=True) / 127
    return (w / torch.where(a > 0, a, torch.ones_like(a))).round().clamp(-127, 127).double() * a.double()


def test_int8_panel_product_is_the_widened_scaled_int8_product():
    """Golden: each row's int8 copy widened to float32 exactly, products and sums in float32 (up to order), the
    sum times the row's scale; a zero row stays zero; more than 16 outputs (several panels, a partial last one)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(37, 24, generator=g)
    w[5] = 0.0
    panels, scale = extension().pack_panels_i8(w)
    assert panels.dtype == torch.int8 and panels.shape == (3, 24, 16) and scale.shape == (48,)
    assert torch.equal(scale[:37], w.abs().amax(dim=1) / 127) and scale[37:].eq(0).all()
    for m in (1, 3, 8, 11):  # one pass, and chunks of 8 rows
        x = torch.randn(m, 24, generator=g)
        got = extension().panel_linear_i8(x, panels, scale, 37)
        want = F.linear(x.double(), _int8_copy(w))
        assert got.shape == (m, 37) and torch.allclose(got.double(), want, atol=1e-4, rtol=1e-5)
        assert got[:, 5].eq(0).all()
    for n in (8, 27):  # half a panel; a last panel ending in its second half
        w = torch.randn(n, 24, generator=g)
        panels, scale = extension().pack_panels_i8(w)
        for m in (1, 5, 7, 13):  # every row count of a pass (6 or 8), and chunks
            x = torch.randn(m, 24, generator=g)
            got = extension().panel_linear_i8(x, panels, scale, n)
            assert got.shape == (m, n) and torch.allclose(
                got.double(), F.linear(x.double(), _int8_copy(w)), atol=1e-4, rtol=1e-5
            )
    exact = torch.tensor([[1.0, 0.0, 2.0]])
    w = torch.tensor([[127.0, -3.0, 5.0], [0.0, 0.0, -1.0]])  # integers: the copy is the weight
    panels, scale = extension().pack_panels_i8(w)
    assert extension().panel_linear_i8(exact, panels, scale, 2).tolist() == [[137.0, -2.0]]


def test_int8_copy_rounds_half_to_even_and_its_norms_are_float64():
    """Golden: ``pack_panels_i8`` rounds ``w / a`` half to even (as ``torch.round``) and stores row ``j``'s ``q`` at
    ``[j // 16, :, j % 16]``; ``screen_norms`` gives ``||w - w~||``, ``||w||``, ``||w~||`` per row in float64, what the
    screen's bound is made of."""
    w = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -2.5], [0.0] * 6, [254.0, 1.0, 3.0, -5.0, 0.0, 2.0]])
    w = torch.cat([w, torch.randn(30, 6, generator=torch.Generator().manual_seed(3))])
    panels, scale = extension().pack_panels_i8(w)
    assert panels[0, :, 0].tolist() == [127, 0, 2, 2, 0, -2] and panels[0, :, 1].eq(0).all()
    assert panels[0, :, 2].tolist() == [127, 0, 2, -2, 0, 1]  # 3 / 2 -> 2, -5 / 2 -> -2, 1 / 2 -> 0
    q = torch.stack([panels[j // 16, :, j % 16] for j in range(33)])
    a = w.abs().amax(dim=1, keepdim=True) / 127
    assert torch.equal(q, (w / torch.where(a > 0, a, torch.ones_like(a))).round().clamp(-127, 127).to(torch.int8))
    norms = extension().screen_norms(w, panels, scale)
    copy = _int8_copy(w)
    want = torch.stack([(w.double() - copy).norm(dim=1), w.double().norm(dim=1), copy.norm(dim=1)], dim=1)
    assert norms.dtype == torch.float64 and torch.allclose(norms, want, rtol=1e-12, atol=0)
    with pytest.raises(RuntimeError, match="not pack_panels_i8's"):
        extension().screen_norms(w[:20], panels, scale)


def test_integer_layout_is_the_panels_regrouped():
    """Golden: ``pack_vnni`` lays the int8 panels ``[P, K, 16]`` out as ``[P, Kp / 4, 64]`` (byte ``4 r + i`` of
    block ``t``: input ``4 t + i`` of output ``r``; zeros past ``K``) and sums ``q`` per group of inputs and output."""
    w = torch.randn(40, 70, generator=torch.Generator().manual_seed(4))  # K not a multiple of 4 or 64
    panels, _ = extension().pack_panels_i8(w)
    vnni, qsum = extension().pack_vnni(panels, 64)
    q = F.pad(panels, (0, 0, 0, 128 - 70))  # [P, Kp, 16]
    assert torch.equal(vnni, q.view(3, -1, 4, 16).transpose(2, 3).reshape(3, -1, 64))
    assert torch.equal(qsum, q.view(3, -1, 64, 16).sum(dim=2, dtype=torch.int32))


def _reach(screen: ArgmaxScreen, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The screen's logits of ``x`` and how far each may be from the float32 logit (its bound)."""
    approx, term = screen.screen_logits(x)
    reach = x.norm(dim=1, keepdim=True) * screen.margin
    return approx, reach if term is None else reach + term[:, None] * screen.copy_norm


@pytest.mark.parametrize("product", PRODUCTS)
def test_the_bound_holds_and_the_argmax_is_exact_on_near_ties(product):
    """Rows of the weight that differ below int8's resolution: the screen cannot tell them apart, the bound
    keeps them all as candidates, and their float32 logits decide."""
    g = torch.Generator().manual_seed(1)
    base = torch.randn(4096, 64, generator=g) / 8
    twins = base[:16] + torch.randn(16, 64, generator=g) * 1e-5  # near-copies of rows 0..15
    w = torch.cat([base, twins])
    screen = ArgmaxScreen(w, product)
    x = torch.cat([w[:16] * 40, torch.randn(32, 64, generator=g) * 30])  # rows aimed at a twin pair, and random
    approx, reach = _reach(screen, x)
    exact = F.linear(x, w)
    assert ((exact - approx).abs() <= reach).all()  # the bound the screen relies on
    assert screen(x) == exact.argmax(dim=1).tolist()
    assert screen.candidates > x.shape[0]  # near-ties were settled in float32


@pytest.mark.parametrize("product", PRODUCTS)
def test_the_bound_holds_on_rows_with_outliers_and_zero_rows(product):
    """Rows whose largest weight is far above the rest (the int8 steps are coarse for everything else), a zero row,
    rows of very different norms, inputs with an outlier coordinate (a hidden state's), a zero input group and an
    input count that is not a whole number of groups: the bound still covers every output, argmax and top-k
    candidates are exact."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(2000, 96, generator=g) * torch.logspace(-2, 1, 2000)[:, None]
    w[::7, 0] *= 300.0  # one outlier per row
    w[11] = 0.0
    screen = ArgmaxScreen(w, product)
    x = torch.randn(24, 96, generator=g) * torch.logspace(-1, 2, 24)[:, None]
    x[::3, 70] *= 50.0  # an outlier coordinate
    x[5, :64] = 0.0  # a zero group
    exact = F.linear(x, w)
    approx, reach = _reach(screen, x)
    assert ((exact - approx).abs() <= reach).all()
    assert screen(x) == exact.argmax(dim=1).tolist()
    top = screen.top(x, 20)
    assert torch.equal(top.topk(20, dim=1).indices.sort(dim=1).values, exact.topk(20, dim=1).indices.sort(dim=1).values)


@needs_vnni
def test_integer_product_is_the_grouped_exact_integer_product():
    """Golden: ``panel_screen_vnni`` against its definition in float64: per output ``j`` and row, ``a_j sum_g b_g
    sum_(i in g) x~_i q_ji`` with the row quantized per group of 64 inputs; outputs past whole panels, inputs padded
    to whole groups, 1 to 17 rows (every row count of a pass, and chunks of 8 over blocks of panels)."""
    from hf_cascade.backends.cpu.argmax_screen import GROUP

    g = torch.Generator().manual_seed(4)
    for n, k in ((37, 24), (700, 130), (16, 64)):
        w = torch.randn(n, k, generator=g)
        screen = ArgmaxScreen(w, "integer")
        a = w.abs().amax(dim=1, keepdim=True) / 127
        q = (w / a).round().clamp(-127, 127).double()  # q_j (no zero rows here)
        for m in (1, 2, 3, 5, 8, 9, 17):
            x = torch.randn(m, k, generator=g) * 4
            got, term = screen.screen_logits(x)
            padded = F.pad(x, (0, screen.padded - k)).view(m, -1, GROUP)
            b = padded.abs().amax(dim=2, keepdim=True) / 127
            b = torch.where(b > 0, b, torch.ones_like(b))
            t = (torch.round(padded / b).clamp(-127, 127) * b).double().view(m, -1)[:, :k]  # the row multiplied
            want = F.linear(t, q) * a.double().view(1, -1)
            assert got.shape == (m, n) and torch.allclose(got.double(), want, atol=1e-5, rtol=1e-6)
            assert term.shape == (m,) and (term.double() >= (x.double() - t).norm(dim=1)).all()
    exact = torch.tensor([[127.0, 0.0, -127.0, 1.0]])  # integers: x~ = x, w~ = w
    w = torch.tensor([[127.0, -3.0, 5.0, 0.0], [0.0, 0.0, -127.0, 2.0]])
    got, term = ArgmaxScreen(w, "integer").screen_logits(exact)
    assert got.tolist() == [[16129.0 - 635.0, 16129.0 + 2.0]] and term.item() < 1e-2


def test_screen_products_by_name():
    w = torch.randn(40, 8)
    assert ArgmaxScreen(w, "float").product == "float" and ArgmaxScreen(w).product in BUILT
    with pytest.raises(ValueError, match="product"):
        ArgmaxScreen(w, "int4")
    if not HAS_VNNI:
        with pytest.raises(RuntimeError, match="VNNI"):
            ArgmaxScreen(w, "integer")


@pytest.mark.parametrize("n, m", [(5000, 4), (64, 1), (65, 2)])
def test_candidates_with_a_second_bound_term(n, m):
    """Golden: ``screen_candidates`` with ``reach_j = norm_i c_j + norm2_i c2_j`` (the integer product's bound)
    against the elementwise rule."""
    g = torch.Generator().manual_seed(n + 1)
    y, c, c2 = torch.randn(m, n, generator=g) * 5, torch.rand(n, generator=g) * 0.02, torch.rand(n, generator=g) * 3
    norm, norm2 = torch.rand(m, generator=g) * 100 + 1, torch.rand(m, generator=g) * 0.5
    reach = norm[:, None] * c + norm2[:, None] * c2
    for k in (1, 5, 50):
        low = y - reach
        floor = low.max(dim=1, keepdim=True).values if min(k, n) == 1 else low.topk(min(k, n), dim=1).values[:, -1:]
        want = [r.nonzero().flatten().tolist() for r in (y + reach >= floor)]
        got = [t.tolist() for t in extension().screen_candidates(y, norm, c, k, norm2, c2)]
        assert all(set(w) <= set(h) and len(h) <= len(w) + 2 and h == sorted(h) for w, h in zip(want, got))


@pytest.mark.parametrize("n, m", [(5000, 4), (1000, 3), (37, 2), (64, 1), (65, 2)])
def test_candidates_are_every_output_whose_upper_bound_reaches_the_kth_lower_bound(n, m):
    """Golden: ``screen_candidates`` against the elementwise rule (blocks of 64 outputs, a partial last one, fewer
    blocks than ``k``): every output the rule keeps is kept, and at most rounding's worth more."""
    g = torch.Generator().manual_seed(n)
    y, c, norm = (
        torch.randn(m, n, generator=g) * 5,
        torch.rand(n, generator=g) * 0.02,
        torch.rand(m, generator=g) * 100 + 1,
    )
    reach = norm[:, None] * c
    for k in (1, 5, 50):
        low = y - reach
        floor = low.max(dim=1, keepdim=True).values if min(k, n) == 1 else low.topk(min(k, n), dim=1).values[:, -1:]
        want = [r.nonzero().flatten().tolist() for r in (y + reach >= floor)]
        got = [t.tolist() for t in extension().screen_candidates(y, norm, c, k)]
        assert all(set(w) <= set(h) and len(h) <= len(w) + 2 and h == sorted(h) for w, h in zip(want, got))


def test_the_screen_is_made_once_per_weight_and_again_after_an_update():
    w = torch.randn(64, 16)
    first = argmax_screen(w)
    assert argmax_screen(w) is first
    with torch.no_grad():
        w.mul_(2.0)
    assert argmax_screen(w) is not first


def test_screen_choices_record_what_was_timed():
    """A run records what the screens of its process chose (``screen_choices``): the product, and per rows and use
    whether the screen was measured faster than the head."""
    w = torch.randn(72, 16)
    screen = argmax_screen(w, lambda x: x @ w.T, rows=3)
    mine = [c for c in screen_choices() if c["weight"] == [72, 16]]
    assert len(mine) == 1 and mine[0]["product"] == argmax_screen(w).product
    assert mine[0]["faster"] == {"4 rows": screen is not None}


def _rows(tree, hidden, weight, screen=None):
    return TreeRows(
        tree,
        torch.tensor([5, 6]),
        LogitsProcessorList(),
        hidden=hidden,
        head=lambda h: F.linear(h, weight),
        block_rows=2,
        argmax_head=screen,
    )


def test_greedy_acceptance_with_the_screen_is_unchanged_and_full_rows_still_come():
    g = torch.Generator().manual_seed(2)
    weight = torch.randn(300, 32, generator=g)
    hidden = torch.randn(6, 32, generator=g) * 5
    best = F.linear(hidden, weight).argmax(dim=1).tolist()
    # a tree that follows the target's argmax for two levels, with a wrong sibling
    tree = TokenTree(torch.tensor([best[0], (best[0] + 1) % 300, best[1], 7, 8]), torch.tensor([-1, -1, 0, 2, 1]))
    plain = greedy_tree_accept(tree, _rows(tree, hidden, weight))
    rows = _rows(tree, hidden, weight, ArgmaxScreen(weight))
    screened = greedy_tree_accept(tree, rows)
    assert screened.path.tolist() == plain.path.tolist() == [0, 2] and screened.bonus == plain.bonus
    assert rows.computed() == [] and rows.rows_computed >= 3  # argmax only, no float32 rows
    assert torch.allclose(rows.raw(0), F.linear(hidden[0], weight), atol=1e-4)  # a full row when asked for


def test_processors_turn_the_screen_off():
    from transformers import RepetitionPenaltyLogitsProcessor

    weight, hidden = torch.randn(50, 8), torch.randn(3, 8)
    tree = TokenTree.chain(torch.tensor([1, 2]))
    rows = TreeRows(
        tree,
        torch.tensor([5]),
        LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5)]),
        hidden=hidden,
        head=lambda h: F.linear(h, weight),
        argmax_head=ArgmaxScreen(weight),
    )
    assert rows.argmax_head is None


@pytest.mark.parametrize("name", ["maxgram", "recycling"])
def test_greedy_with_the_screen_matches_plain_generate(name, monkeypatch, free_drafts, open_gate):
    """Batch 1 and a batch: each row equals plain greedy ``generate``'s with the screen forced on, rows finishing at
    different steps. Max-Gram reads argmaxes alone: the batched loop screens every row's first block in one call
    (rows of several trees) and the blocks after it, asking for the row count of each call (its speed is decided
    per count). Token Recycling records each row's top candidates: it gets the screen's top-``k`` rows instead
    (``rows_top_k``), whose argmax is the full rows', except at a batch's plain steps (nothing recorded: the argmax)."""
    from contextlib import contextmanager

    from hf_cascade import CascadeAssistant, MaxGram, RecyclingAssistant, assistant
    from hf_cascade.backends import VerifySession
    from tests.contract_registry import base_kit
    from tests.test_batch import ROWS, left_pad

    target = base_kit("gemma3").target  # (a vocabulary too small for the CPU backend's head)
    screen, asked = ArgmaxScreen(target.get_output_embeddings().weight), []

    @contextmanager
    def session(model, cpu_kernels=None, kind=None):
        yield VerifySession("cpu", 2, lambda rows, top_k=None: asked.append((rows, top_k)) or screen)

    monkeypatch.setattr(assistant, "verification_session", session)
    make = (lambda: CascadeAssistant([MaxGram()])) if name == "maxgram" else RecyclingAssistant
    kw = dict(do_sample=False, max_new_tokens=20, eos_token_id=None, pad_token_id=0)
    for batch in (left_pad(ROWS[2:3]), left_pad(ROWS)):
        plain = target.generate(batch[0], attention_mask=batch[1], **kw)
        a = make()
        assert target.generate(batch[0], attention_mask=batch[1], assistant_model=a, **kw).tolist() == plain.tolist()
        stats = a.last_stats.rows if hasattr(a.last_stats, "rows") else [a.last_stats]
        assert sum(sum(r.accepted_per_call) for r in stats) > 0  # drafts were accepted
    assert screen.candidates > 0 and max(rows for rows, _ in asked) > 2  # first blocks of several rows at once
    # the drafter's top-k where rows are recorded; the argmax alone where they are not (maxgram; a batch's plain steps)
    assert {k for _, k in asked} - {None} == (set() if name == "maxgram" else {64}) and None in {k for _, k in asked}


@pytest.mark.real_model
def test_gemma_greedy_uses_the_screen_and_matches_plain():
    """On the embedded Gemma-3-270M (262k-row head): Max-Gram's greedy output equals plain ``generate``'s with
    the screen deciding the rows' argmax; with a logits processor the screen is not used."""
    from hf_cascade import CascadeAssistant, MaxGram
    from hf_cascade.backends.cpu import argmax_screen as module
    from hf_cascade.bench.loading import load_model

    model, tok = load_model(None)
    ids = tok(
        "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox", return_tensors="pt"
    ).input_ids
    plain = model.generate(ids, do_sample=False, max_new_tokens=24)
    weight = model.get_output_embeddings().weight
    screen = ArgmaxScreen(weight)  # in use whatever this machine's timing would decide
    screen.faster = {(1 << i, top): True for i in range(12) for top in (False, True)}
    saved = module._SCREENS.get(id(weight))
    module._SCREENS[id(weight)] = (weight._version, screen)
    try:
        got = model.generate(ids, do_sample=False, max_new_tokens=24, assistant_model=CascadeAssistant([MaxGram()]))
        assert got.tolist() == plain.tolist() and screen.candidates > 0
        used = screen.candidates
        penalized = dict(do_sample=False, max_new_tokens=12, repetition_penalty=1.3)
        got = model.generate(ids, assistant_model=CascadeAssistant([MaxGram()]), **penalized)
        assert got.tolist() == model.generate(ids, **penalized).tolist() and screen.candidates == used
    finally:
        module._SCREENS.pop(id(weight), None)
        if saved is not None:
            module._SCREENS[id(weight)] = saved
