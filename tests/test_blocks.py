"""The block chosen per step (hf_cascade/core/blocks.py): golden values of the replay and the fit, the choice, and
end to end that the chosen block is what the head calls use, with outputs equal to plain greedy."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList

from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.core import blocks
from hf_cascade.core.blocks import BlockChooser, CallCost, replay_seconds
from hf_cascade.core.rows import TreeRows
from hf_cascade.core.structure import TokenTree
from tests.test_greedy_parity import REPETITIVE, models, plain
from tests.tiny_models import single_thread  # noqa: F401  (autouse fixture)


def test_replay_seconds_golden():
    # 6 rows read of a 7-row draft: blocks of 4 are calls of 4 and 3 rows; a block of 8 is one call of the 7 rows
    assert replay_seconds(4, 6, 7, fixed=10.0, per_row=1.0) == 2 * 10 + 7
    assert replay_seconds(8, 6, 7, fixed=10.0, per_row=1.0) == 10 + 7
    assert replay_seconds(2, 3, 7, fixed=10.0, per_row=1.0) == 2 * 10 + 4       # rows 0-1, then 2-3
    assert replay_seconds(1, 9, 3, fixed=10.0, per_row=1.0) == 3 * 11            # no more rows than the draft has


def test_call_cost_fit_golden():
    cost = CallCost()
    cost.observe(2, 0.012)
    assert cost.fit() is None                                                  # one row count: no slope
    for m in (1, 2, 4, 8):
        for _ in range(3):
            cost.observe(m, 0.010 + 0.002 * m)
    cost.observe(8, 5.0)                                     # one outlier (a first call): the median's, not the fit's
    a, s = cost.fit()
    assert a == pytest.approx(0.010) and s == pytest.approx(0.002)
    flat = CallCost()
    for m, t in ((1, 0.02), (4, 0.019)):
        flat.observe(m, t)
    assert flat.fit() == pytest.approx((0.0195, 0.0))                          # falling with rows: all fixed
    rows = CallCost()
    for m, t in ((1, 0.001), (3, 0.009)):
        rows.observe(m, t)
    assert rows.fit() == pytest.approx((0.0, 0.010 / 4))                       # a negative intercept: all per row


def _chooser(fixed: float, per_row: float, steps, initial: int = 4) -> BlockChooser:
    chooser = BlockChooser(initial)
    for m in (1, 2, 3):
        chooser.observe_call(m, fixed + per_row * m)
    for read, rows in steps:
        chooser.observe_step(read, rows)
    return chooser


def test_block_chooser_weighs_the_fixed_cost_against_rows_not_read():
    # a call costs mostly its pass over the weight, acceptance reads 8 of 9 rows: one call of 8 rows
    assert _chooser(10.0, 1.0, [(8, 9)] * 6).block == 8
    # rows cost most, acceptance reads one row: one row per call
    assert _chooser(1.0, 10.0, [(1, 9)] * 6).block == 1
    # the draft never has more than 3 rows: from 2, the smallest block that takes them in one call; from 4 (as
    # cheap in the replay), no change
    assert _chooser(10.0, 1.0, [(3, 3)] * 6, initial=2).block == 3
    assert _chooser(10.0, 1.0, [(3, 3)] * 6, initial=4).block == 4
    # before min_steps steps, or before two row counts are timed, the session's block
    assert _chooser(10.0, 1.0, [(8, 9)] * 3).block == 4
    unfitted = BlockChooser(2)
    unfitted.observe_call(2, 0.01)
    for _ in range(8):
        unfitted.observe_step(8, 9)
    assert unfitted.block == 2 and unfitted.chosen == [2] * 8
    with pytest.raises(ValueError, match="blocks"):
        BlockChooser(0)


def test_tree_rows_report_each_head_call():
    tree = TokenTree.chain(torch.tensor([10, 11, 12, 13, 14, 15]))
    hidden = torch.arange(7.0)[:, None].repeat(1, 3)
    seen = []
    rows = TreeRows(tree, torch.tensor([1]), LogitsProcessorList(), hidden=hidden,
                    head=lambda h: torch.cat([h, -h], -1), block_rows=4,
                    on_call=lambda m, seconds: seen.append((m, seconds >= 0)))
    for r in range(7):
        rows.raw(r)
    assert seen == [(4, True), (3, True)]
    screened = TreeRows(tree, torch.tensor([1]), LogitsProcessorList(), hidden=hidden, head=lambda h: h,
                        block_rows=2, argmax_head=lambda h: [0] * h.shape[0], on_call=lambda m, s: seen.append(m))
    screened.argmax_block(0)
    assert seen[-1] == 2


@pytest.mark.parametrize("fit, block", [((1.0, 10.0), 1), ((10.0, 0.0), None)])
def test_the_chosen_block_is_the_head_calls_block(monkeypatch, fit, block):
    """With the fit set (rows expensive: block 1; rows free: a block that takes the drafts read in one call), every
    step makes ``ceil(rows read / its block)`` head calls; the output equals plain greedy."""
    target = models("llama")["target"]
    monkeypatch.setattr(blocks.CallCost, "fit", lambda self: fit)
    made = []
    real = blocks.BlockChooser.__init__

    def spy(self, *a, **kw):
        real(self, *a, **kw)
        made.append(self)
    monkeypatch.setattr(blocks.BlockChooser, "__init__", spy)
    assistant = CascadeAssistant([MaxGram()], cpu_kernels=False)
    got = target.generate(REPETITIVE, do_sample=False, max_new_tokens=40, assistant_model=assistant)
    assert got.tolist() == plain(target, REPETITIVE, max_new_tokens=40).tolist()
    stats, chooser = assistant.last_stats, made[-1]
    assert stats.head_blocks == chooser.chosen and len(stats.head_blocks) == stats.target_calls
    assert stats.target_calls > chooser.min_steps + 1, "the generation must run past the chooser's first steps"
    assert stats.head_blocks[:chooser.min_steps] == [chooser.initial] * chooser.min_steps
    later = stats.head_blocks[chooser.min_steps:]
    assert all(b == block for b in later) if block is not None else min(later) > 1
    for i in range(stats.target_calls - 1):                                    # the last step may be cut short
        read = min(stats.accepted_per_call[i] + 1, stats.draft_len_per_call[i] + 1)
        assert stats.head_calls[i] == -(-read // stats.head_blocks[i])
