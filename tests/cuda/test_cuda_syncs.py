"""On CUDA, ``torch.cuda.set_sync_debug_mode`` agrees with the read counter (issue 72).

``tests/test_host_copies.py`` bounds a step's device reads and blocking host-to-device copies on the CPU, through
:class:`hf_cascade.bench.host_reads.ReadCounter`'s account of which tensors would be host memory. Here the same steps
run on a GPU with CUDA's own account: every synchronising call (a read, a blocking copy) warns under
``set_sync_debug_mode("warn")``. Per verification, the warnings stay within the bound (a greedy Max-Gram chain: one
read and at most one blocking copy; GLIDE + CAPE: three reads or waits and two copies) and within what the counter
counted in the same run (its reads, blocking copies and explicit waits; it also counts reads of host tensors, which CUDA
does not see: it may only count more).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from hf_cascade import (
    CascadeAssistant,
    CascadeSettings,
    GlideAssistant,
    GlideSettings,
    MaxGram,
    Policy,
    backends,
    placement,
)
from hf_cascade.bench.host_reads import ReadCounter
from hf_cascade.bench.tiny import echo_glide
from hf_cascade.core.payoff import VerifyCost
from tests import tiny_models as tm
from tests.tiny_models import ids

CHAIN_PROMPT = ids(1, 5, 6, 7, 5, 6, 7, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17)
TREE_PROMPT = ids(1, 5, 6, 7, 5, 6, 7, 5, 6)


class SyncWarnings:
    """CUDA's synchronising calls, counted from the target's first verification on (``set_sync_debug_mode``)."""

    def __init__(self, target):
        self.target, self.forwards, self.syncs, self.per_forward = target, 0, 0, []

    def _forward(self, module, args):
        self.forwards += 1
        if self.forwards > 1:
            self.per_forward.append(0)

    def _warned(self, message, *args, **kwargs):
        if "synchroniz" in str(message) and self.forwards > 1:
            self.syncs += 1
            self.per_forward[-1] += 1

    def __enter__(self):
        self._hook = self.target.get_decoder().register_forward_pre_hook(self._forward)
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("always")
        self._show, warnings.showwarning = warnings.showwarning, self._warned
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = self._show
        self._catch.__exit__(*exc)
        self._hook.remove()


def _run(target, assistant, prompt, monkeypatch):
    monkeypatch.setattr(backends, "default_session", lambda model: backends.VerifySession("model", None))
    monkeypatch.setattr(placement, "DEFER_READS", True)
    prompt = prompt.to(target.device)
    target.generate(prompt, do_sample=False, max_new_tokens=8, assistant_model=assistant)  # warm: kernels, pins
    with ReadCounter(target, skip_forwards=1) as counter, SyncWarnings(target) as syncs:
        out = target.generate(prompt, do_sample=False, max_new_tokens=60, assistant_model=assistant)
    assert torch.equal(out, target.generate(prompt, do_sample=False, max_new_tokens=60))
    return counter, syncs


@pytest.mark.parametrize("layers", [2, 6])
def test_chain_syncs_agree_with_the_counter(cuda, monkeypatch, layers):
    target = tm.llama(layers=layers, seed=0, block_scale=0.005, eos_token_id=None).to(cuda)
    assistant = CascadeAssistant([MaxGram(adaptive=False, max_tokens=10)], settings=CascadeSettings(k_matrix=[[10]]))
    counter, syncs = _run(target, assistant, CHAIN_PROMPT, monkeypatch)
    assert max(syncs.per_forward) <= 2, syncs.per_forward  # one read, at most one blocking copy
    assert syncs.syncs <= counter.reads + counter.copies + counter.syncs, (syncs.syncs, counter.reads, counter.copies)


@pytest.mark.parametrize("layers", [2, 6])
def test_tree_syncs_agree_with_the_counter(cuda, monkeypatch, layers):
    target = tm.llama(layers=layers, seed=0, block_scale=0.005, eos_token_id=None).to(cuda)
    assistant = GlideAssistant(
        echo_glide(target, 0.0),
        settings=GlideSettings(cape=True, draft_length=6),
        policy=Policy(verify_cost=VerifyCost.flat(), lookup=False),
    )
    counter, syncs = _run(target, assistant, TREE_PROMPT, monkeypatch)
    assert max(syncs.per_forward) <= 5, syncs.per_forward  # three reads, two blocking copies at most
    assert syncs.syncs <= counter.reads + counter.copies + counter.syncs, (syncs.syncs, counter.reads, counter.copies)
