"""Device-to-host reads per target call do not grow with the draft length.

On a GPU every read of a tensor's value on the host (``.item()``, ``.tolist()``, ``.cpu()``, ``bool(t)``,
``int(t)``, ``float(t)``, ``t.__index__``) waits for the device to finish its queued work. A decoding loop
that reads once per drafted token pays that synchronisation ``k`` times per target call; the core promises
a bounded number of reads per step (module docstring of :mod:`hf_cascade.core.loop`).

The test counts those reads during ``generate()`` (counting wrappers on ``torch.Tensor``, here on CPU where
the reads are free but countable; ``hf_cascade.placement.DEFER_READS = True`` makes the drafting loops take
their accelerator path, as on a GPU) from the target's first forward on, and the target's forwards (a forward
pre-hook on its decoder, which verification calls without the output head), at a short and a long draft
setting of the same strategy: reads per target call at the long setting must stay within a small constant
of the short one. Reading host-side Python lists is free and not counted. When it fails, the message lists
the call sites of the reads (``file:line function``) at both settings, most frequent first. The counter is
:class:`hf_cascade.bench.overhead.ReadCounter`, what ``hf-cascade bench --overhead`` reports reads per call with.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList

import hf_cascade
import hf_cascade.placement
from hf_cascade import (
    CascadeAssistant,
    CascadeSettings,
    DynamicWindowAssistant,
    DynamicWindowSettings,
    GlideAssistant,
    GlideSettings,
    MaxGram,
    Policy,
    RecyclingSettings,
    ReDrafterAssistant,
    ReDrafterSettings,
    placement,
)
from hf_cascade.bench.overhead import SCALAR_READS, ReadCounter  # the one counter (also bench --overhead's)
from hf_cascade.core import TokenTree
from hf_cascade.core.accept import greedy_tree_accept, sampling_tree_accept
from hf_cascade.core.attention import tree_queries
from hf_cascade.core.payoff import VerifyCost
from hf_cascade.core.stats import LevelStats
from hf_cascade.drafters.neural import NeuralLevel
from hf_cascade.glide.cape import cape_tree
from hf_cascade.maxgram_tree import MaxGramTree, MaxGramTreeAssistant
from hf_cascade.recycling import RecyclingAssistant, RecyclingShape
from tests import tiny_models as tm
from tests.redrafter_helpers import fit_head
from tests.test_glide_decode import echo_glide
from tests.test_greedy_parity import REPETITIVE as PARITY_PROMPT
from tests.test_sampling import PROMPT as SPROMPT
from tests.test_sampling import calibration, passes, run_long, small  # noqa: F401  (fixture)
from tests.tiny_models import ids, single_thread  # noqa: F401  (autouse fixture)

SLACK = 2  # reads per target call the long setting may add (e.g. a longer path read once)
CYCLE = ids(1, 9)  # the tiny Llama target cycles with period 6 from here: long drafts are accepted
REPETITIVE = ids(1, 5, 6, 7, 5, 6, 7, 5, 6)

_HERE = __file__  # frames of this file are left out of the reported call sites


def count_reads(monkeypatch, target, assistant, prompt=CYCLE, new: int = 60) -> tuple[float, ReadCounter, object]:
    with monkeypatch.context() as mp:
        mp.setattr(hf_cascade.placement, "DEFER_READS", True)  # drafting loops as on an accelerator
        with ReadCounter(target, skip_files=[_HERE]) as counter:
            out = target.generate(prompt, do_sample=False, max_new_tokens=new, assistant_model=assistant)
    assert out.shape[1] == prompt.shape[1] + new
    return counter.reads / counter.forwards, counter, assistant.last_stats


def _report(short: ReadCounter, long: ReadCounter) -> str:
    lines = [
        f"short: {short.reads} reads / {short.forwards} target calls; "
        f"long: {long.reads} reads / {long.forwards} target calls",
        "reads by call site (short, long):",
    ]
    sites = sorted(set(short.sites) | set(long.sites), key=lambda s: -(long.sites[s] + short.sites[s]))
    for s in sites[:25]:
        lines.append(f"  {short.sites[s]:5d} {long.sites[s]:5d}  {s}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def target():
    return tm.llama_target()


_COPIES: dict = {}


def copy_of(target):
    """A drafter equal to the target: every draft token is accepted (the most tokens per call)."""
    if id(target) not in _COPIES:
        _COPIES[id(target)] = tm.copy_model(target)
    return _COPIES[id(target)]


def _glide(target, cape, n, lookup=False):
    # cross 0: accepted on Llama; the budget's path with a flat profile (a profile measured on a tiny model may
    # prune the long chains this test needs)
    return GlideAssistant(
        echo_glide(target, 0.0),
        settings=GlideSettings(cape=cape, draft_length=n),
        policy=Policy(verify_cost=VerifyCost.flat(), lookup=lookup),
    )


# name -> (factory(target, draft length), prompt on which long drafts get accepted)
SETTINGS = {
    # Max-Gram alone (a chain through the core), at most 2 / 10 tokens per draft (K = [[k]])
    "maxgram": (
        lambda t, n: CascadeAssistant(
            [MaxGram(adaptive=False, max_tokens=10)], settings=CascadeSettings(k_matrix=[[n]])
        ),
        CYCLE,
    ),
    # a neural drafter (its k forwards per draft on the device, read once) and SD + self-verify windows of n
    "drafter": (
        lambda t, n: CascadeAssistant(
            [copy_of(t)], settings=CascadeSettings(k_matrix=[[n]]), policy=Policy(cost_aware=False)
        ),
        CYCLE,
    ),
    "dynamic_window": (
        lambda t, n: DynamicWindowAssistant(
            copy_of(t), settings=DynamicWindowSettings(max_window=n, tau_init=float("inf"))
        ),
        CYCLE,
    ),
    "glide": (lambda t, n: _glide(t, False, n), REPETITIVE),
    "glide_cape": (lambda t, n: _glide(t, True, n), REPETITIVE),
    "maxgram_tree": (lambda t, n: MaxGramTreeAssistant(branches=2, depth=n), CYCLE),
    # the recycled table's one top-k read per step, whatever the tree's depth
    "recycling": (
        lambda t, n: RecyclingAssistant(
            settings=RecyclingSettings(RecyclingShape(max_depth=n)), policy=Policy(verify_cost=VerifyCost.flat())
        ),
        CYCLE,
    ),
    # the budget's path with a flat profile, as GLIDE's above
    "redrafter": (
        lambda t, n: ReDrafterAssistant(
            fit_head(t, "llama", steps=80),
            settings=ReDrafterSettings(beam_width=2, beam_length=n),
            policy=Policy(verify_cost=VerifyCost.flat(), lookup=False),
        ),
        CYCLE,
    ),
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_reads_per_target_call_do_not_grow_with_draft_length(target, monkeypatch, name, free_drafts):
    make, prompt = SETTINGS[name]
    per_call, counters, stats = {}, {}, {}
    for length in (2, 10):
        per_call[length], counters[length], stats[length] = count_reads(
            monkeypatch, target, make(target, length), prompt
        )
    # the long setting really drafts (and gets accepted) more per call
    assert max(stats[10].tree_depths) > 2 and max(stats[2].tree_depths) <= 2
    assert stats[10].tokens_per_target_call > stats[2].tokens_per_target_call
    assert per_call[10] <= per_call[2] + SLACK, _report(counters[2], counters[10])


def test_lookup_branch_adds_no_reads_per_target_call(target, monkeypatch, free_drafts):
    """The lookup branch (drafters.lookup_branch) works on the host: joining the sequence's repeats to GLIDE's
    tree reads the device no more often per target call, while its seeds are verified and accepted."""
    off = count_reads(monkeypatch, target, _glide(target, True, 5), CYCLE)
    on = count_reads(monkeypatch, target, _glide(target, True, 5, lookup=True), CYCLE)
    lookup = on[2].levels[-1]
    assert lookup.name == "lookup" and lookup.tokens_accepted > 0
    assert on[0] <= off[0] + SLACK, _report(off[1], on[1])


def test_the_counter_sees_plain_decoding_reads(target):
    """Positive control: transformers' plain loop reads the device at least once per token."""
    item = torch.Tensor.item
    with ReadCounter(target) as counter:
        target.generate(CYCLE, do_sample=False, max_new_tokens=20)
    assert counter.forwards == 20 and counter.reads >= 20
    # and the wrappers are gone
    assert torch.Tensor.item is item and not counter.active


class ReadingTree(MaxGramTree):
    """Max-Gram trees, read back token by token (what a drafting loop that reads per token does)."""

    def draft_tree(self, seq, state):
        tree, q = super().draft_tree(seq, state)
        for t in tree.tokens:
            int(t)
        return tree, q


def test_the_test_catches_a_read_per_drafted_token(target, monkeypatch):
    """Negative control: the same comparison fails for a drafter that reads each drafted token."""

    def make(n):
        a = MaxGramTreeAssistant(branches=2, depth=n)
        a.drafter = ReadingTree(2, n)
        return a

    short, _, _ = count_reads(monkeypatch, target, make(2))
    long, _, _ = count_reads(monkeypatch, target, make(10))
    assert long > short + SLACK


# -- drafting loops and acceptance: reads counted directly (the accelerator schedule forced on this CPU) ---------------


def _scalar_reads(module=None) -> ReadCounter:
    """Host reads of tensors (``item``, ``tolist``, ``int``, ``float``, ``bool``, ``index``: no copies) from now on,
    but those made inside ``module``'s forwards."""
    counter = ReadCounter(names=SCALAR_READS, sites=False)
    return counter.pause_in(module) if module is not None else counter


def test_neural_drafting_reads_do_not_grow_with_the_draft_length(monkeypatch):
    monkeypatch.setattr(placement, "DEFER_READS", True)
    target = tm.llama_target()
    drafter = tm.noisy_copy(target, 0.3)
    seq = torch.tensor(PARITY_PROMPT[0].tolist())
    counts, tokens = {}, {}
    for do_sample in (False, True):
        for k in (2, 8):
            level = NeuralLevel(drafter, tm.VOCAB, LogitsProcessorList(), LevelStats("d"))
            with _scalar_reads(drafter) as reads:
                torch.manual_seed(0)
                out = level.generate(seq, k, do_sample, set())
            counts[do_sample, k] = reads.reads
            tokens[do_sample, k] = out[0].tolist()
            assert len(tokens[do_sample, k]) == k
    assert counts[False, 2] == counts[False, 8] and counts[True, 2] == counts[True, 8], counts
    monkeypatch.setattr(placement, "DEFER_READS", False)  # the CPU schedule: same tokens
    level = NeuralLevel(drafter, tm.VOCAB, LogitsProcessorList(), LevelStats("d"))
    assert level.generate(seq, 8, False, set())[0].tolist() == tokens[False, 8]


def test_glide_draft_reads_do_not_grow_with_the_draft_length(monkeypatch):
    from transformers import DynamicCache

    from hf_cascade.core.strategy import TreeStep
    from hf_cascade.glide import GlideDrafter, GlideSettings
    from hf_cascade.glide.cape import CapeSettings

    monkeypatch.setattr(placement, "DEFER_READS", True)
    target = tm.llama_target()
    glide = echo_glide(target)
    seq = PARITY_PROMPT[0]
    cache = DynamicCache()
    with torch.no_grad():
        target(input_ids=seq[None, :-1], past_key_values=cache, use_cache=True)
    counts, trees = {}, {}
    for k in (2, 6):
        drafter = GlideDrafter(glide, GlideSettings(k, CapeSettings()), [])
        with _scalar_reads() as reads:
            tree, _ = drafter.draft_tree(seq, TreeStep(seq, cache, None, budget=20, step=0))
        counts[k] = reads.reads
        trees[k] = (tree.tokens.tolist(), tree.parents.tolist())
    assert counts[2] == counts[6] <= 3, counts
    monkeypatch.setattr(placement, "DEFER_READS", False)
    tree, _ = GlideDrafter(glide, GlideSettings(6, CapeSettings()), []).draft_tree(
        seq, TreeStep(seq, cache, None, budget=20, step=0)
    )
    assert (tree.tokens.tolist(), tree.parents.tolist()) == trees[6]


def test_tree_structure_and_greedy_acceptance_read_once():
    logits = torch.randn(33, 12)
    with _scalar_reads() as reads:
        tree = cape_tree([3, 4, 5, 6], [[1, 2], [7], [], [8, 9, 10]])
        assert reads.reads == 0  # built from host lists
        tree = cape_tree(
            torch.tensor([3, 4, 5, 6]),
            [torch.tensor([1, 2]), torch.tensor([7]), torch.tensor([], dtype=torch.long), torch.tensor([8, 9, 10])],
        )
        assert reads.reads == 1  # one transfer for all sets
        reads.reads = 0
        full = tree.with_root(11).select(torch.ones(tree.num_nodes + 1, dtype=torch.bool))
        assert reads.reads == 1  # the keep mask
        reads.reads = 0
        greedy_tree_accept(full, logits[: full.num_nodes + 1])
        assert reads.reads <= 2  # argmax of every row; the bonus


def test_tree_queries_never_read_the_root():
    """A tensor root (and a tree built from device tensors) joins the verification ids on the device: no read; a
    host-int root with host tokens reads nothing either."""
    device_tree = TokenTree(torch.tensor([5, 6, 7]), torch.tensor([-1, 0, -1]), host_parents=(-1, 0, -1))
    with _scalar_reads() as reads:
        for tree, root in (
            (device_tree, torch.tensor(4)),
            (device_tree, torch.tensor([4])),
            (TokenTree.from_host([5, 6, 7], [-1, 0, -1]), 4),
        ):
            ids, _, _ = tree_queries(2, root, tree, 6, torch.device("cpu"))
            assert reads.reads == 0
            assert ids.tolist() == [[4, 5, 6, 7, 4, 4]]
            reads.reads = 0


def test_batched_sampling_acceptance_is_exact():
    """The accelerator schedule of recursive rejection sampling keeps the target's distribution exactly:
    deterministic siblings (with a duplicate), a stochastic chain and a drawn token with point-mass siblings (the
    two-read walk), stochastic siblings (one read per node on the walk)."""
    V, runs = 6, 8000
    p = torch.tensor([0.3, 0.25, 0.2, 0.15, 0.07, 0.03])
    rows = torch.stack([p, p.roll(1), p.roll(2), p, p])
    q = torch.tensor(
        [
            [0.1, 0.5, 0.1, 0.1, 0.1, 0.1],
            [0.6, 0.1, 0.1, 0.1, 0.05, 0.05],
            [0.2, 0.2, 0.2, 0.2, 0.1, 0.1],
            [0, 0, 0, 0, 1.0, 0],
        ]
    )
    for draft in ("point", "stochastic", "chain", "drawn_with_point_masses"):
        counts = torch.zeros(V)
        g = torch.Generator().manual_seed(1)
        for _ in range(runs):
            if draft == "chain":  # one stochastic child per node: the two-read walk
                x0, x1 = torch.multinomial(q[:2], 1, generator=g).flatten().tolist()
                tree = cape_tree([x0, x1], [[], []])
                acc = sampling_tree_accept(tree, rows[:3], q[:2], generator=g, batched=True)
                counts[tree.token_list[0] if acc.path.numel() else acc.bonus] += 1
                continue
            if draft == "drawn_with_point_masses":  # CAPE: a drawn main token, then fixed siblings (the
                x0 = int(torch.multinomial(q[0], 1, generator=g))  # drawn token among them at times): the two-read walk
                tree = cape_tree([x0, 4], [[1, 0, 1], []], dedupe=False)
                point = torch.nn.functional.one_hot(torch.tensor([4, 1, 0, 1]), V).float()
                acc = sampling_tree_accept(
                    tree, torch.cat([rows, rows[:1]]), torch.cat([q[:1], point]), generator=g, batched=True
                )
                counts[tree.token_list[int(acc.path[0])] if acc.path.numel() else acc.bonus] += 1
                continue
            # point masses: fixed siblings (a duplicate among them); stochastic: each sibling drawn from its q
            kids = [1, 0, 1] if draft == "point" else torch.multinomial(q[:3], 1, generator=g).flatten().tolist()
            tree = cape_tree([kids[0], 4], [kids[1:], []], dedupe=False)  # node 1: below node 0
            node_q = None if draft == "point" else q[[0, 3, 1, 2]]  # node order: main, then siblings
            acc = sampling_tree_accept(tree, rows, node_q, generator=g, batched=True)
            first = tree.token_list[int(acc.path[0])] if acc.path.numel() else acc.bonus
            counts[first] += 1
        chi2 = float(((counts - runs * p) ** 2 / (runs * p)).sum())
        assert chi2 < 25.0, (draft, chi2, counts / runs)  # 5 dof: p ~ 1e-4


@pytest.mark.parametrize("name", ["drafter_alone", "maxgram_first_drop_unsure", "hsddw"])
def test_accelerator_schedule_sampling_is_lossless(small, monkeypatch, name):
    """The deferred-read drafting loops (forced on this CPU) keep speculative sampling exact."""
    monkeypatch.setattr(placement, "DEFER_READS", True)
    assistant, drafter, kw = {
        "drafter_alone": (
            CascadeAssistant(
                [small["noisy"]], settings=CascadeSettings(k_matrix=[[3]]), policy=Policy(cost_aware=False)
            ),
            "noisy",
            {"temperature": 0.8},
        ),
        "maxgram_first_drop_unsure": (
            CascadeAssistant(
                [small["noisy"], MaxGram(adaptive=False, max_tokens=3)],
                settings=CascadeSettings(k_matrix=[[2, 3], [0, 3]], min_confidence=0.3, keep_unsure=False),
            ),
            "noisy",
            {},
        ),
        "hsddw": (
            DynamicWindowAssistant(
                small["noisy"],
                small["noisy2"],
                settings=DynamicWindowSettings(max_window=3, tau_init=1.0, tau2_init=1.0),
            ),
            None,
            {},
        ),
    }[name]
    seqs = run_long(small["target"], assistant, 8, 100, 0, **kw)
    stats = calibration(
        small["target"],
        small[drafter] if drafter else None,
        seqs,
        SPROMPT.shape[1],
        kw.get("temperature", 1.0),
        kw.get("top_k"),
    )
    assert stats["n"] == 8 * 100 and passes(stats), stats


# -- Max-Gram's greedy chain path: one read per target call (issue 55) -------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: CascadeAssistant([MaxGram()], cpu_kernels=False),
        lambda: CascadeAssistant(
            [MaxGram(adaptive=False, max_tokens=10)], settings=CascadeSettings(k_matrix=[[10]]), cpu_kernels=False
        ),
    ],
    ids=["defaults", "fixed_10"],
)
def test_maxgram_chain_reads_once_per_target_call(target, monkeypatch, make):
    """Max-Gram drafts on the host from the loop's host copy of the sequence, its chain carries its host tokens,
    acceptance returns its path on the host: the only device read of a verification is the argmax of the rows
    acceptance walks through. With every row in one head call (the accelerator session, ``block_rows=None``) that is
    one read per target call, however long the sequence and the drafts; with the CPU session's blocks of rows it
    is one per block walked, and nothing else reads."""
    from hf_cascade import backends

    def session(block_rows):
        return lambda model: backends.VerifySession("model", block_rows)

    prompt = ids(1, 5, 6, 7, 5, 6, 7, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17)  # a longer sequence to search
    for block_rows in (None, 4):
        monkeypatch.setattr(backends, "default_session", session(block_rows))
        _, counter, stats = count_reads(monkeypatch, target, make(), prompt, new=120)
        verifications = counter.forwards - 1  # the first forward is the prefill
        assert stats.tokens_per_target_call > 2  # drafts were accepted
        others = {s: n for s, n in counter.sites.items() if "argmax_block" not in s.split(" <- ")[0]}
        assert not others, _report(counter, counter)
        if block_rows is None:
            assert counter.reads <= verifications, _report(counter, counter)


# -- trees and sampling: at most three reads per target call (issue 55) ------------------------------------------------


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", ["maxgram", "glide_cape", "maxgram_tree", "recycling", "redrafter"])
def test_trees_and_sampling_read_at_most_three_times_per_target_call(target, monkeypatch, name, do_sample, free_drafts):
    """With every row in one head call (the accelerator session), a target call reads the device at most three times:
    the drafter's draft (once: GLIDE + CAPE's main path, its expansion sets of every drafted row and, sampled, its
    proposal choice's measures of the step before together), acceptance (greedy: the argmax of the rows; sampled:
    every node's uniform and probabilities in one gather, then the bonus token)."""
    from hf_cascade import backends

    monkeypatch.setattr(backends, "default_session", lambda model: backends.VerifySession("model", None))
    monkeypatch.setenv(backends.ENV, "0")  # the CPU kernels' session off
    make, prompt = SETTINGS[name]
    assistant = make(target, 6)
    with monkeypatch.context() as mp:
        mp.setattr(hf_cascade.placement, "DEFER_READS", True)
        torch.manual_seed(0)
        with ReadCounter(target, skip_files=[_HERE]) as counter:
            target.generate(prompt, do_sample=do_sample, max_new_tokens=60, assistant_model=assistant)
    stats = assistant.last_stats
    assert sum(stats.accepted_per_call) > 0  # drafts were verified and accepted
    verifications = counter.forwards - 1  # the first forward is the prefill
    assert counter.reads <= 3 * verifications, _report(counter, counter)


@pytest.mark.parametrize("name", ["maxgram", "maxgram_tree", "recycling", "glide", "glide_cape", "redrafter"])
def test_accelerator_session_sampling_is_exact(name, monkeypatch):
    """The contract's exact-sampling tests with every row in one head call (the accelerator session: acceptance walks
    the tree from one gathered read) and the drafting loops' deferred reads."""
    import time

    from hf_cascade import backends
    from tests.contract_registry import REGISTRY, base_kit, fresh_kit
    from tests.test_contract import FakeClock, assert_exact_sampling

    monkeypatch.setattr(backends, "default_session", lambda model: backends.VerifySession("model", None))
    monkeypatch.setenv(backends.ENV, "0")
    monkeypatch.setattr(hf_cascade.placement, "DEFER_READS", True)
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    target = base_kit("small").target
    kit = fresh_kit("small", target)
    assert_exact_sampling(target, lambda: REGISTRY[name](kit))
