"""The CPU decoder linears (hf_cascade/backends/cpu/verify_linear.py): which rows they take, same products, restored
afterwards, and greedy parity with them on two threads (where they are used)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hf_cascade
from hf_cascade import CascadeSettings, GlideAssistant, MaxGram, Policy
from hf_cascade.backends.cpu.kernels import PACKER, TUNER, KernelTuner
from hf_cascade.backends.cpu.panel import PANEL
from hf_cascade.backends.cpu.verify_linear import RowsLinear, fast_decoder_linears, fast_verification
from tests import tiny_models as tm
from tests.test_glide_decode import echo_glide
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)


@contextmanager
def threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_rows_taken_and_products(bias, n_threads, copy_kernel):
    torch.manual_seed(0)
    lin = nn.Linear(24, 40, bias=bias)
    ref = lambda x: F.linear(x, lin.weight, lin.bias)  # noqa: E731
    with threads(n_threads):
        for force in ("rows", "linear", copy_kernel, None):  # None: tuned by timing
            rl = RowsLinear(lin, max_rows=8, tuner=KernelTuner(force=force))
            for shape in [(9, 24), (1, 9, 24)]:  # more than max_rows
                x = torch.randn(*shape)
                assert torch.equal(rl(x), ref(x))
            x = torch.randn(1, 1, 24)  # 1 row: linear or the copy
            torch.testing.assert_close(rl(x), ref(x), rtol=1e-5, atol=1e-6)
            if force == "linear":
                assert torch.equal(rl(x), ref(x))
            for shape in [(2, 24), (1, 5, 24), (2, 4, 24), (1, 8, 24)] * 5:  # 2 .. max_rows rows
                x = torch.randn(*shape)
                out = rl(x)
                assert out.shape == shape[:-1] + (40,) and out.is_contiguous()
                torch.testing.assert_close(out, ref(x), rtol=1e-5, atol=1e-6)
                if force == "linear":
                    assert torch.equal(out, ref(x))
            assert set(rl.tuner.choices().values()) <= {"rows", "linear", copy_kernel}
            decided = {key.rows for key in rl.tuner.choices()}  # row buckets with a choice
            assert (8 in decided) == (force is None)  # 8 rows: 10 calls, tuned
    with pytest.raises(ValueError, match="max_rows"):
        RowsLinear(lin, max_rows=1)


def test_one_row_is_plain_linear_without_a_copy_kernel(monkeypatch):
    """Without a kernel that copies the weight, one row takes ``F.linear`` unchanged (no tuning)."""
    monkeypatch.setattr(PANEL, "enabled", False)
    monkeypatch.setattr(PACKER, "enabled", False)
    lin = nn.Linear(24, 40)
    rl = RowsLinear(lin, max_rows=8, tuner=KernelTuner())
    for _ in range(8):
        x = torch.randn(1, 24)
        assert torch.equal(rl(x), F.linear(x, lin.weight, lin.bias))
    assert rl.tuner.choices() == {} and rl.tuner._times == {}


class _Sub(nn.Linear):
    pass


class _Model(nn.Module):
    """A decoder with a plain, a bfloat16 and a subclassed linear, and an output head."""

    def __init__(self):
        super().__init__()
        self.decoder = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Linear(4, 4).to(torch.bfloat16), "c": _Sub(4, 4)})
        self.lm_head = nn.Linear(4, 8)

    def get_decoder(self):
        return self.decoder

    def get_output_embeddings(self):
        return self.lm_head


def test_switches_plain_float32_decoder_linears_only_and_restores():
    m = _Model()
    with fast_decoder_linears(m) as switched:
        assert switched == 1
        assert isinstance(vars(m.decoder["a"]).get("forward"), RowsLinear)
        assert all("forward" not in vars(x) for x in (m.decoder["b"], m.decoder["c"], m.lm_head))
    assert all("forward" not in vars(x) for x in m.modules())
    target = tm.llama_target()
    with fast_verification(target) as applied:
        assert applied  # 2 layers x 7 linears; the head is too small
        assert sum(isinstance(vars(x).get("forward"), RowsLinear) for x in target.modules()) == 14
        assert "forward" not in vars(target.lm_head)
    assert all("forward" not in vars(x) for x in target.modules())


@pytest.mark.parametrize("kernel", ["rows", "panel", "packed"])
@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_greedy_parity_on_two_threads(name, kernel, monkeypatch):
    """Linear (cascade) and tree (GLIDE + CAPE) verification with the decoder linears in use, each
    multi-row kernel forced (whatever this CPU prefers)."""
    if kernel == "panel" and not PANEL.available():
        pytest.skip("the panel kernel did not build on this machine")
    if kernel == "packed":
        monkeypatch.setattr(PANEL, "enabled", False)  # offered where panel is not
    target = tm.llama_target() if name == "llama" else tm.gemma3_target()
    multi_row = []
    call = RowsLinear.__call__

    def counting(self, x):
        rows = x.reshape(-1, x.shape[-1]).shape[0]
        multi_row.append(2 <= rows <= self.max_rows)
        return call(self, x)

    monkeypatch.setattr(RowsLinear, "__call__", counting)
    monkeypatch.setattr(TUNER, "force", kernel)
    assistants = [
        hf_cascade.CascadeAssistant(
            [tm.noisy_copy(target), MaxGram()],
            settings=CascadeSettings(k_matrix=[[2, 6], [0, 6]]),
            policy=Policy(cost_aware=False),
        ),
        GlideAssistant(echo_glide(target, 0.3), policy=Policy(cost_aware=False)),
    ]  # multi-row verifications
    with threads(2):
        for prompt in (ids(1, 5, 9), ids(1, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39)):
            expected = target.generate(prompt, do_sample=False, max_new_tokens=32)
            for a in assistants:
                multi_row.clear()
                got = target.generate(prompt, do_sample=False, max_new_tokens=32, assistant_model=a)
                assert got.tolist() == expected.tolist()
                assert any(multi_row) and a.last_stats.tokens_per_target_call > 1
    assert all("forward" not in vars(x) for x in target.modules())
