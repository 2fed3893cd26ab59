"""The compiled ``panel`` kernel (hf_cascade/backends/cpu/panel.py, csrc/panel_linear.cpp): its layout on a hand-made
weight, its products against ``F.linear`` for every row-count path (1-8 rows in one pass, more in
chunks of 8 over each cached block of panels) on 1 and 2 threads, the copies' bookkeeping, and what
happens where it cannot be built."""

from __future__ import annotations

import gc
import warnings

import pytest
import torch
import torch.nn.functional as F

from hf_cascade.backends.cpu import panel
from hf_cascade.backends.cpu.panel import PANEL, PanelPacker
from tests.test_verify_linear import threads

pytestmark = pytest.mark.skipif(not PANEL.available(), reason="the panel kernel did not build on this machine")


def test_panel_layout_golden():
    """W [18, 2] -> [2 panels, K=2, 16]: panel p, row k holds W[16p:16p+16, k], zeros past W's rows."""
    w = torch.arange(36, dtype=torch.float32).reshape(18, 2)  # w[n, k] = 2n + k
    got = panel.extension().pack_panels(w)
    assert got.shape == (2, 2, 16)
    assert got[0, 0].tolist() == [float(2 * n) for n in range(16)]
    assert got[0, 1].tolist() == [float(2 * n + 1) for n in range(16)]
    assert got[1, 0].tolist() == [32.0, 34.0] + [0.0] * 14
    assert got[1, 1].tolist() == [33.0, 35.0] + [0.0] * 14


def test_panel_product_golden():
    """Hand-checked: x = [[1, 2], [3, 4]], W = [[1, 0], [0, 1], [1, 1]] -> x @ W.T = [[1, 2, 3], [3, 4, 7]]."""
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert PanelPacker().product(w, x).tolist() == [[1.0, 2.0, 3.0], [3.0, 4.0, 7.0]]


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("d_out, d_in", [(1, 1), (8, 5), (16, 7), (27, 33), (37, 19), (100, 64), (257, 640)])
def test_products_equal_linear(d_out, d_in, n_threads):
    torch.manual_seed(d_out + d_in)
    packer = PanelPacker()
    lin = torch.nn.Linear(d_in, d_out)
    with threads(n_threads):
        for m in list(range(1, 18)) + [33]:  # one pass, then chunks (8 rows with AVX-512, 6 elsewhere)
            x = torch.randn(m, d_in)
            out = packer.product(lin.weight, x, lin.bias)
            assert out.shape == (m, d_out) and out.is_contiguous()
            torch.testing.assert_close(out, F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    assert len(packer._packed) == 1  # one copy for all those calls


def test_copies_are_made_once_remade_after_an_update_and_dropped_with_the_weight():
    packer = PanelPacker()
    lin = torch.nn.Linear(24, 40, bias=False)
    x = torch.randn(3, 24)
    first = packer.packed(lin.weight)
    assert packer.packed(lin.weight) is first
    with torch.no_grad():
        lin.weight.mul_(-2.0)
    assert packer.packed(lin.weight) is not first
    torch.testing.assert_close(packer.product(lin.weight, x), x @ lin.weight.T, rtol=1e-5, atol=1e-5)
    del lin, first
    gc.collect()
    assert packer._packed == {}


def test_offers_float32_cpu_matrices_only():
    w = torch.randn(8, 4)
    assert PanelPacker().offers(w) and not PanelPacker(enabled=False).offers(w)
    assert not PanelPacker().offers(w.to(torch.bfloat16)) and not PanelPacker().offers(torch.randn(8))


def test_bad_panels_raise_a_clear_error():
    ext = panel.extension()
    w = torch.randn(20, 8)
    with pytest.raises(RuntimeError, match="do not fit"):
        ext.panel_linear(torch.randn(2, 9), ext.pack_panels(w), 20)  # d_in 9 against 8
    with pytest.raises(RuntimeError, match="do not fit"):
        ext.panel_linear(torch.randn(2, 8), ext.pack_panels(w), 40)  # 40 outputs from 2 panels
    with pytest.raises(RuntimeError, match="float32"):
        ext.pack_panels(w.double())


def test_not_offered_when_the_build_fails(monkeypatch):
    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr("torch.utils.cpp_extension.load", no_compiler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert panel.extension.__wrapped__() is None
    assert any("could not be built" in str(w.message) for w in caught)


def test_builds_are_kept_apart_per_cpu_kind(monkeypatch):
    """The build directory's name carries a tag of the CPU's model and flags (code built with
    ``-march=native`` must not load on another kind of CPU sharing the cache)."""
    tag = panel.cpu_tag()
    assert len(tag) == 10 and int(tag, 16) >= 0 and panel.cpu_tag() == tag
    monkeypatch.setattr(panel.platform, "processor", lambda: "another-cpu")
    assert panel.cpu_tag() != tag


def test_builds_are_kept_apart_per_torch_installation(monkeypatch, tmp_path):
    """The name also carries a tag of the torch installation: two environments on one machine build against their
    own headers, so each keeps its own build instead of rebuilding (or building over) the other's."""
    tag = panel.install_tag()
    assert len(tag) == 8 and int(tag, 16) >= 0 and panel.install_tag() == tag
    assert tag in panel.build_name()
    monkeypatch.setattr(panel.torch, "__file__", str(tmp_path / "other-venv" / "torch" / "__init__.py"))
    assert panel.install_tag() != tag


def test_march_target_from_the_environment(monkeypatch):
    """``HF_CASCADE_MARCH`` picks the ``-march`` target and a build of its own; ``native`` keeps the plain name;
    a value that is not a target name is refused (it would reach the compiler's command line)."""
    monkeypatch.delenv("HF_CASCADE_MARCH", raising=False)
    base = f"hf_cascade_panel_{panel.cpu_tag()}_{panel.install_tag()}"
    assert panel.march() == "native" and panel.build_name() == base
    monkeypatch.setenv("HF_CASCADE_MARCH", "x86-64-v3")
    assert panel.march() == "x86-64-v3" and panel.build_name() == base + "_x86_64_v3"
    seen = {}

    def fake_load(name, sources, extra_cflags, **kwargs):
        seen.update(name=name, cflags=extra_cflags)
        return "built"

    monkeypatch.setattr("torch.utils.cpp_extension.load", fake_load)
    assert panel.extension.__wrapped__() == "built"
    assert seen["name"].endswith("_x86_64_v3") and "-march=x86-64-v3" in seen["cflags"]
    monkeypatch.setenv("HF_CASCADE_MARCH", "native; rm -rf /")
    with pytest.raises(ValueError, match="HF_CASCADE_MARCH"):
        panel.march()
