"""A decoding step waits for the device a bounded number of times, whatever the target's depth (issue 72).

On an accelerator a step waits for the device at every device-to-host read and every blocking host-to-device copy;
the bound per verification: a greedy Max-Gram chain step reads once and copies at most once, a GLIDE + CAPE tree step
reads (or waits) at most three times and copies at most twice, on a target of 2 layers as on one of 6 (the cache update
after a path that leaves the first branch gathers every layer's K/V with one index on the device). Counted on this CPU
by :class:`hf_cascade.bench.host_reads.ReadCounter`, which follows which tensors would be host memory on an
accelerator (its docstring says what counts); ``tests/cuda/test_cuda_syncs.py`` checks it against
``torch.cuda.set_sync_debug_mode``. Phase timings synchronise only where asked for
(:class:`hf_cascade.core.stats.PhaseTimer`).
"""

from __future__ import annotations

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
from hf_cascade.core.stats import PhaseTimer, synchronized_phases
from tests import tiny_models as tm
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

CHAIN_PROMPT = ids(1, 5, 6, 7, 5, 6, 7, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17)
TREE_PROMPT = ids(1, 5, 6, 7, 5, 6, 7, 5, 6)
DEPTHS = (2, 6)
_HERE = __file__


@pytest.fixture(scope="module", params=DEPTHS, ids=[f"{n}_layers" for n in DEPTHS])
def target(request):
    return tm.llama(layers=request.param, seed=0, block_scale=0.005, eos_token_id=None)  # no early stop


def counted(monkeypatch, target, assistant, prompt, new: int = 60) -> ReadCounter:
    """``ReadCounter`` over a greedy ``generate`` on the accelerator schedule (deferred drafting reads, every row in
    one head call), from the first verification on (the prefill, which makes the cache layers, left out)."""
    monkeypatch.setattr(backends, "default_session", lambda model: backends.VerifySession("model", None))
    monkeypatch.setenv(backends.ENV, "0")
    monkeypatch.setattr(placement, "DEFER_READS", True)
    with ReadCounter(target, skip_files=[_HERE], skip_forwards=1) as counter:
        out = target.generate(prompt, do_sample=False, max_new_tokens=new, assistant_model=assistant)
    plain = target.generate(prompt, do_sample=False, max_new_tokens=new)
    assert torch.equal(out, plain)  # lossless under the counter
    return counter


def _report(counter: ReadCounter) -> str:
    worst = max(counter.per_forward, key=lambda c: (c["copies"], c["reads"]))
    return (
        f"{counter.forwards} forwards, {counter.reads} reads, {counter.syncs} waits, {counter.copies} blocking "
        f"copies, {counter.async_copies} asynchronous; worst step {worst}\nreads: {counter.sites.most_common(6)}\n"
        f"blocking copies: {counter.copy_sites.most_common(8)}"
    )


def test_maxgram_chain_step_reads_once_and_copies_at_most_once(target, monkeypatch):
    assistant = CascadeAssistant(
        [MaxGram(adaptive=False, max_tokens=10)], settings=CascadeSettings(k_matrix=[[10]]), cpu_kernels=False
    )
    counter = counted(monkeypatch, target, assistant, CHAIN_PROMPT)
    assert assistant.last_stats.tokens_per_target_call > 1.5  # drafts were accepted
    for step in counter.per_forward:
        assert step["reads"] + step["syncs"] <= 1 and step["copies"] <= 1, _report(counter)
    assert counter.async_copies <= 3 * len(counter.per_forward), _report(counter)  # the draft, its ids, the emitted


def test_glide_cape_tree_step_reads_three_times_and_copies_twice_at_most(target, monkeypatch):
    assistant = GlideAssistant(
        echo_glide(target, 0.0),
        settings=GlideSettings(cape=True, draft_length=6),
        policy=Policy(verify_cost=VerifyCost.flat(), lookup=False),
        cpu_kernels=False,
    )
    counter = counted(monkeypatch, target, assistant, TREE_PROMPT)
    stats = assistant.last_stats
    off_branch = [p for p in stats.accepted_paths if p != list(range(len(p)))]
    assert off_branch, stats.accepted_paths  # some accepted paths leave the first branch: a gather
    for step in counter.per_forward:  # waits: the drafter's timed draft starts after one
        assert step["reads"] + step["syncs"] <= 3 and step["copies"] <= 2, _report(counter)
    assert counter.async_copies <= 5 * len(counter.per_forward), _report(counter)


def test_the_counter_sees_blocking_copies_and_not_uploads():
    """Positive and negative controls: what a step must not do is counted, where it happens; what it should do is
    not (``placement.upload`` is asynchronous, a host-only computation copies nothing)."""
    device = torch.device("cpu")  # the target's device, named
    with ReadCounter() as counter:
        host = torch.tensor([1, 2, 3])
        torch.tensor([1, 2], device=device)  # 1: built on the host, copied
        moved = host.to(device)  # 2
        torch.zeros(3, device=device).copy_(host)  # 3
        on_device = torch.arange(5, device=device)
        on_device[host]  # 4: a host index, copied by torch
        assert counter.copies == 4 and len(counter.copy_sites) == 4, counter.copy_sites
        placement.upload(host, device)  # asynchronous, from pinned memory
        (host + 1).tolist()  # host only: a read of host memory
        torch.tensor([4], device=placement.HOST)
        moved + on_device[:3]  # device only
        assert counter.copies == 4 and counter.async_copies == 1, counter.copy_sites
        moved.to("cpu")  # back to the host: a read
        assert counter.reads == 2
    assert torch.Tensor.to is not None and counter._mode is None


def test_reverting_to_a_copy_per_layer_is_caught(monkeypatch):
    """Negative control: the cache update as it was (the kept columns' index moved to each layer with a blocking
    ``.to``) fails the tree bound on the deeper target."""
    from hf_cascade.core import loop

    def keep_path_per_layer(cache, prefix_len, path_nodes, total=None):
        nodes = [int(i) for i in path_nodes]
        keep, m = prefix_len + 1, len(nodes)
        total = cache.get_seq_length() if total is None else total
        gathered = []
        if nodes == list(range(m)):
            keep += m
        else:
            index = torch.tensor([prefix_len + 1 + i for i in nodes], dtype=torch.long, device="cpu")
            for layer in cache.layers:
                idx = index.to(layer.keys.device)  # one blocking copy per layer
                gathered.append((layer.keys.index_select(-2, idx), layer.values.index_select(-2, idx)))
        if total - keep > 0:
            cache.crop(-(total - keep))
        for layer_idx, (keys, values) in enumerate(gathered):
            cache.update(keys, values, layer_idx)

    monkeypatch.setattr(loop, "keep_path", keep_path_per_layer)
    target = tm.llama(layers=6, seed=0, block_scale=0.005, eos_token_id=None)
    assistant = GlideAssistant(
        echo_glide(target, 0.0),
        settings=GlideSettings(cape=True, draft_length=6),
        policy=Policy(verify_cost=VerifyCost.flat(), lookup=False),
        cpu_kernels=False,
    )
    counter = counted(monkeypatch, target, assistant, TREE_PROMPT)
    assert max(step["copies"] for step in counter.per_forward) >= 6, _report(counter)


# -- phase timings --------------------------------------------------------------------------------------------------


def test_phase_timings_synchronise_only_where_asked_for(monkeypatch):
    """A target on an accelerator (faked: ``accelerators`` names one, ``synchronize`` counts): no phase timer waits
    for it by default; ``Policy(sync_phases=True)`` and :func:`synchronized_phases` make every phase wait."""
    waits = []
    monkeypatch.setattr(placement, "accelerators", lambda module: (torch.device("cuda", 0),))
    monkeypatch.setattr(placement, "synchronize", lambda device=None: waits.append(device))
    target = tm.llama_target()

    def generate(policy=None):
        waits.clear()
        assistant = CascadeAssistant([MaxGram()], policy=policy, cpu_kernels=False)
        target.generate(CHAIN_PROMPT, do_sample=False, max_new_tokens=12, assistant_model=assistant)
        return len(waits), assistant.last_stats

    count, stats = generate()
    assert count == 0 and stats.phase_seconds["verify"] > 0
    count, stats = generate(Policy(sync_phases=True))
    assert count >= 2 * len(stats.phase_seconds) and count >= 8 * stats.target_calls  # each phase's two edges
    assert not PhaseTimer(stats, target).synchronizes
    with synchronized_phases():
        assert PhaseTimer(stats, target).synchronizes
        assert not PhaseTimer(stats, target, synchronize=False).synchronizes
    assert Policy(sync_phases=True) != Policy() and not Policy.paper().sync_phases


def test_bench_takes_sync_phases(monkeypatch):
    import argparse

    from hf_cascade.bench import command
    from hf_cascade.core.stats import GenerationStats

    monkeypatch.setattr(placement, "accelerators", lambda module: (torch.device("cuda", 0),))
    parser = argparse.ArgumentParser()
    command.add_bench_arguments(parser)
    assert "--sync-phases" in parser.format_help()
    seen = []
    monkeypatch.setattr(
        "hf_cascade.bench.overhead.run",
        lambda args, log=print: seen.append(PhaseTimer(GenerationStats(), target=object()).synchronizes),
    )
    command.run(parser.parse_args(["--overhead", "--sync-phases"]))
    command.run(parser.parse_args(["--overhead"]))
    assert seen == [True, False]
