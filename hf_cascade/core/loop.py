"""The decoding core: one loop for every strategy (a linear draft is a tree with one path).

:func:`speculative_decode` replaces transformers' ``_assisted_decoding`` for hf_cascade's assistants
(the hook in :mod:`hf_cascade.hook` routes the call here) and returns what it returns. Per step:

1. **draft** -- the strategy's :class:`~hf_cascade.core.strategy.TreeDrafter` proposes a tree below
   the last verified token, pruned to what can still be emitted (:func:`~hf_cascade.core.stopping.prune_tree`).
2. **verify** -- one target forward over ``[root, nodes]`` (its inputs: :func:`~hf_cascade.core.attention.row_inputs`):
   a tree mask and branch positions for trees, plain causal attention for chains. The decoder
   alone runs; the output head runs later on the rows acceptance reads. The step returns what acceptance and the
   update read, a :class:`~hf_cascade.core.rows.Verified` (:func:`~hf_cascade.core.rows.verified`).
3. **accept** -- greedy, or exact speculative sampling (recursive rejection over siblings), on
   logits processed with each row's own prefix (:mod:`hf_cascade.core.accept`).
4. **update** -- keep the accepted path's K/V, emit the tokens one by one where plain ``generate``
   would stop (:class:`~hf_cascade.core.stopping.Stopper`), stream them, record statistics and hand
   the strategy its feedback (:meth:`TreeDrafter.on_accept`, with the measured verification time).

Before the loop, **prefill** runs the prompt minus its last token into a plain ``DynamicCache()`` (no
config: sliding-window cache layers would evict K/V a long tree still needs; windows are applied by
the mask, :mod:`hf_cascade.core.forward`); or, where the call asks for a static cache (``cache_implementation=
"static"`` or a user's ``StaticCache``), into fixed buffers with full layers: verification then writes each draft
after the verified prefix, padded to a few query shapes, and runs compiled where transformers would compile the same
call without an assistant (:mod:`hf_cascade.core.static`, :mod:`hf_cascade.core.compiled`). The last prompt token is the
first draft's root, so the first verification already carries a draft. The prefill also checks that the core's output
head (:func:`~hf_cascade.core.forward.output_head`) reproduces the model's logits; if not, or if the
prompt has one token, verification computes every row with the full model.

Host and device: token ids, the tree's structure and the statistics are host values; each step reads
the device a bounded number of times, not once per drafted token, and nothing that grows with the
sequence or per cache layer. What a step builds on the host reaches the device without waiting for it
(:func:`~hf_cascade.placement.upload`: pinned memory on CUDA): a verification's ids, positions and tree closure
in one tensor, the kept columns' index after a tree's path in one more, shared by every cache layer; no phase
timer synchronises unless asked to (:class:`~hf_cascade.core.stats.PhaseTimer`). ``tests/test_host_copies.py``
bounds the reads and blocking copies per step. The sequence is kept on the host beside the device tensor
(:attr:`Row.tokens <hf_cascade.core.phases.Row.tokens>`, handed to drafters as :attr:`TreeStep.tokens`); the
root enters verification as a host int; acceptance returns its path on the host (:attr:`TreeAcceptance.nodes`),
which the cache update, the statistics and the drafters' feedback share; pruning decides on the tree's host
structure. A drafter that drafts on the host (Max-Gram) hands its tokens over on the host too: its greedy chain step
then reads the device only for the argmax of the rows acceptance walks (once per target call where every row is
computed in one head call, as on an accelerator; once per block of rows on the CPU session). The state of the
sequence is a :class:`~hf_cascade.core.phases.Row`, as each row of a batch is: the work each phase does for a row
(acceptance, emitting the tokens, the prefill's check of the head, the drafter's view) is
:mod:`hf_cascade.core.phases`, which both loops call; what differs at batch 1 (verification without a batch mask, a
dense cache kept in place) and why is in that module's docstring.
"""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList, PreTrainedModel
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..compat import CACHE, cache_kwargs, given_cache
from ..processors import split_processors
from .accept import TreeAcceptance
from .attention import row_inputs
from .compiled import open_slots, user_compiled, verify_call
from .forward import check_attention_backend, keep_path, mask_device_dtype
from .head_input import HeadInput, input_device, screen_heads
from .phases import Row, accept_row, checked_head, draft_row, emit, keep_last
from .rows import Verified, verified
from .static import bucket
from .stats import GenerationStats, PhaseTimer
from .stopping import Stopper
from .strategy import TreeDrafter, TreeStep
from .structure import TokenTree


@torch.no_grad()
def speculative_decode(
    target: PreTrainedModel,
    drafter: TreeDrafter,
    input_ids: torch.Tensor,
    logits_processor: LogitsProcessorList | None,
    stopping_criteria,
    generation_config: GenerationConfig,
    stats: GenerationStats,
    streamer=None,
    block_rows: int | None = 4,
    argmax_screen=None,
    model_kwargs: dict | None = None,
):
    """Generate with ``drafter``'s drafts, verified by ``target`` (see the module docstring).
    ``block_rows``: most logit rows per output-head call (``None``: all at once). ``argmax_screen``: the
    backend's screen of the head (:attr:`~hf_cascade.backends.VerifySession.argmax_screen`), used where
    acceptance reads nothing but the argmax of a row or rows filtered to their top k
    (:func:`~hf_cascade.core.head_input.screen_heads`). ``model_kwargs``: ``generate``'s (the cache it prepared or the
    user gave: a static one selects the static path, :mod:`hf_cascade.core.static`)."""
    check_attention_backend(target, tree_shaped=not drafter.linear)  # before any forward
    run = _Run(
        target,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        stats,
        streamer,
        block_rows,
        given_cache(model_kwargs or {}),
        drafter,
    )
    with run.head_input:
        with run.timer("prefill"):
            prefill(run)
        heads = screen_heads(run, [drafter], argmax_screen)
        if heads is not None:
            run.row_head, run.screen = heads(run.block_rows or 1)
        while not run.done:
            state = run.state()
            with run.timer("draft"):
                tree, q = draft(run, state)
            started = time.perf_counter()
            with run.timer("verify"):
                checked = verify(run, tree, drafter.linear)
            with run.timer("accept"):
                acceptance = accept(run, tree, checked, q)
            run.verify_seconds = time.perf_counter() - started  # acceptance read the device: synchronised
            with run.timer("update"):
                update(run, drafter, tree, checked, acceptance)
    return run.result()


# -- the steps -----------------------------------------------------------------------------------------


def prefill(run: _Run) -> None:
    """Run the prompt minus its last token (the first root) into the cache."""
    row = run.row
    tokens = row.seq[:-1]
    if tokens.numel() == 0:
        return
    if run.slots is not None:
        run.slots.show(tokens.numel())
    logits = run.target(input_ids=tokens[None], **cache_kwargs(run.target, run.cache), **keep_last(run.target)).logits[
        0, -1
    ]
    run.stats.prefill_calls += 1
    if run.slots is not None:
        run.slots.length = run.slots.written = tokens.numel()
    hidden = run.head_input.rows()
    if hidden is None or user_compiled(run.target):  # the user's compiled forward verifies: never bypassed
        return
    run.head = run.row_head = checked_head(run.target, hidden[-1:], logits[None])
    row.last_hidden = hidden[-1]


def draft(run: _Run, state: TreeStep) -> tuple[TokenTree, torch.Tensor | None]:
    """The strategy's draft, pruned to what can be emitted (:func:`~hf_cascade.core.phases.draft_row`: depth budget,
    nothing below an EOS) and to a user's static cache's room."""
    tree, q = draft_row(run.row, state)
    if run.slots is not None and tree.num_nodes >= run.slots.room():  # a user's static cache: no room past it
        tree, q = _first_nodes(tree, q, run.slots.room() - 1)
    if run.target_rules:  # lossy rules compare the target's rows with the draft
        candidates = torch.cat([state.seq, tree.tokens.to(state.seq.device)])[None]
        for rule in run.target_rules:
            rule.set_candidates(candidates)
    return tree, q


def verify(run: _Run, tree: TokenTree, linear: bool) -> Verified:
    """One target forward over ``[root, nodes]`` (:func:`~hf_cascade.core.attention.row_inputs`), returned as
    :class:`~hf_cascade.core.rows.Verified`: the rows' logits are computed when acceptance reads them. A tree of one
    path (no node included: the root alone) is verified as a chain, with plain causal attention, whatever the
    drafter: a plain decoding step's inputs where the tree is empty. With a static cache the queries are written
    after the verified prefix, padded to a bucket where the call compiles (:mod:`hf_cascade.core.static`), and keep
    the drafter's shape (compiled calls see one kind of input)."""
    row, slots, queries, columns = run.row, run.slots, tree.num_nodes + 1, None
    if slots is not None:
        queries = bucket(queries, slots.room()) if run.fixed_shapes else queries
        columns = slots.columns(queries)  # the columns attention sees
        slots.show(columns)
    inputs = row_inputs(run.target, row.length - 1, tree, row.tokens[-1], run.where, queries, linear, columns)
    full = run.head is None or run.full_forward  # the model's logits (a user's compiled forward)
    out = (run.target if full else run.call)(**inputs, **cache_kwargs(run.target, run.cache))
    if slots is not None:
        slots.wrote(queries)
    return verified(
        out,
        full,
        run.head_input.rows,
        [tree],
        [row.seq],
        [run.processors],
        copy=slots is not None,
        head=run.row_head,
        argmax_head=run.screen,
        block_rows=run.block_rows,
    )


def accept(run: _Run, tree: TokenTree, checked: Verified, q: torch.Tensor | None) -> TreeAcceptance:
    """:func:`~hf_cascade.core.phases.accept_row`; sampling where every row is computed in one head call (an
    accelerator's session) reads the device twice (``batched``)."""
    return accept_row(run.cfg.do_sample, tree, checked.rows[0], q, batched=True if run.block_rows is None else None)


def update(run: _Run, drafter: TreeDrafter, tree: TokenTree, checked: Verified, acceptance: TreeAcceptance) -> None:
    """Keep the accepted path, emit its tokens and the bonus token up to where plain decoding stops,
    record statistics, give the drafter its feedback."""
    row, L, rows = run.row, run.row.length, checked.rows[0]
    hidden = checked.hidden[0] if checked.hidden is not None else None
    out = emit(row, tree, acceptance, rows, hidden, run.scores is not None, run.raw_logits is not None)
    if run.slots is not None:
        run.slots.keep(1 + len(out.path), out.path)
    else:
        keep_path(run.cache, L - 1, out.path, total=L + tree.num_nodes)
    if out.count < len(out.new):  # a cut path: keep what was emitted
        if run.slots is not None:
            run.slots.drop(len(out.new) - out.count)
        else:
            run.cache.crop(-(len(out.new) - out.count))
    run.done = out.finished
    if run.streamer is not None:
        run.streamer.put(torch.tensor([out.new[: out.count]]))
    state = run.state()
    state.rows = rows
    drafter.on_accept(tree, acceptance, state)


# -- the loop's state ----------------------------------------------------------------------------------


class _Run:
    """One ``generate()`` call: the target, the generation's settings and outputs, its row
    (:class:`~hf_cascade.core.phases.Row`) and the target's cache (dense: no padding, no holes)."""

    def __init__(
        self,
        target,
        input_ids,
        logits_processor,
        stopping_criteria,
        cfg,
        stats,
        streamer,
        block_rows,
        given=None,
        drafter=None,
    ):
        self.target, self.cfg, self.stats, self.streamer = target, cfg, stats, streamer
        self.processors = logits_processor or LogitsProcessorList()
        self.target_rules = split_processors(self.processors)[1]
        self.block_rows = block_rows
        self.timer = PhaseTimer(stats, target)
        self.scores = () if cfg.return_dict_in_generate and cfg.output_scores else None  # None: not asked for
        self.raw_logits = () if cfg.return_dict_in_generate and cfg.output_logits else None
        self.head_input = HeadInput(target)
        self.head = None  # the core's output head, once prefill validated it
        self.row_head = None  # what computes rows: the head, or the backend's screen
        self.screen = None  # the backend's argmax screen, where it applies (greedy)
        self.verify_seconds: float | None = None
        self.done = False
        self.device = device = input_device(target, input_ids)
        self.where = mask_device_dtype(target)  # the device and dtype of the target's inputs and masks
        self.slots = open_slots(target, cfg, given)  # a static cache's host bookkeeping (core/static.py)
        self.fixed_shapes = self.slots is not None and self.slots.fixed_shapes  # queries padded to buckets (compiled)
        self.cache = self.slots.cache if self.slots is not None else DynamicCache()
        # what verifies with the core's head: the decoder (eager or compiled), or the user's compiled forward
        self.call, self.full_forward = verify_call(target, self.cache, cfg)
        self.row = Row(
            0,
            0,
            input_ids[0].to(device),
            input_ids[0].tolist(),
            drafter,
            Stopper(cfg, stopping_criteria),
            stats,
            self.processors,
        )

    def state(self) -> TreeStep:
        return self.row.step_state(self.slots.view() if self.slots is not None else self.cache, self.verify_seconds)

    def result(self):
        if self.streamer is not None:
            self.streamer.end()
        if self.slots is not None:
            self.slots.show(None)  # handed back: a plain static cache again
        seq = self.row.seq[None]
        if self.cfg.return_dict_in_generate:
            scores = tuple(self.row.scores) if self.scores is not None else None
            logits = tuple(self.row.logits) if self.raw_logits is not None else None
            return GenerateDecoderOnlyOutput(sequences=seq, scores=scores, logits=logits, **{CACHE: self.cache})
        return seq


def _first_nodes(tree: TokenTree, q: torch.Tensor | None, count: int) -> tuple[TokenTree, torch.Tensor | None]:
    """``tree`` cut to its first ``count`` nodes (parents precede children: a tree; every kept node keeps its
    kept siblings, drawn in node order, so sampling stays exact)."""
    keep = [i < count for i in range(tree.num_nodes)]
    return tree.select(keep), (q[:count] if q is not None else None)


__all__ = ["accept", "draft", "prefill", "speculative_decode", "update", "verify"]
