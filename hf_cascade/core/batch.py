"""Batched speculative decoding: a left-padded batch of ``B`` rows, each drafting on its own, one target
forward verifying every row's draft per step.

The loop is :func:`~hf_cascade.core.loop.speculative_decode`'s (draft -> verify -> accept -> update), over rows
(each row's share of a step is batch 1's, :mod:`hf_cascade.core.phases`, which also says what differs), after the
**prefill** of every row's prompt: the padded block in one forward as plain batched ``generate`` runs it,
or one forward per row where padding is at least half of that block (:func:`prefill`: the same cache, without
the work on padding, which in a batch of ragged prompts can be most of the prefill).

1. **draft** -- each row's own drafter (one per row: its own statistics and caches) proposes a tree for its
   own sequence, pruned to what that row can still emit; a row may draft nothing. The *lagging* rows (the
   most tokens left: the batch ends when they do) draft, and none while the batch's
   :class:`~hf_cascade.core.payoff.DraftGate` measures plain steps to advance the batch's end faster; the rows
   ahead of them draft only into the width the lagging rows' drafts already give every row's block, where
   their drafts are cheap (:meth:`~hf_cascade.core.payoff.DraftGate.rides`).
2. **verify** -- one target forward over ``[B, N]``: row ``b``'s root and its ``n_b`` nodes, padded to
   ``N = max n_b + 1`` with queries that attend to themselves only; per-row position ids (each node at its
   branch position, counted in the row's own tokens, padding not counted, as plain batched ``generate``
   counts them) and one additive mask ``[B, 1, N, T + N]``
   (:func:`~hf_cascade.core.attention.batch_tree_allowed`); under an attention backend that applies no 4-D mask
   (flash attention: chains only, trees refused before any forward) a 2-D ownership mask ``[B, T + N]`` instead
   (:func:`~hf_cascade.core.batch_state.ownership_mask`: flash unpads it). The output head then computes every row's
   first block of logits in one call (:meth:`TreeRows.plan <hf_cascade.core.rows.TreeRows.plan>`).
3. **accept** -- per row, greedy or exact speculative sampling, exactly as at batch 1, with the logits
   processors given the row's padded sequence (what plain batched ``generate`` gives them); greedy reads
   the argmax of every row's first block in one transfer (or one call of the backend's argmax screen).
4. **update** -- per row, the emitted tokens' K/V move to the front of the step's block of columns; the
   block is cut to the longest row's count, and a row that emitted fewer leaves *holes*: columns it does
   not own, masked like its left padding. When padding and holes exceed a third of the cache, the rows are
   compacted (each row's columns gathered, right-aligned: one copy). Rows that finish (EOS, length,
   stopping criteria) leave the batch: their cache rows are dropped and cost nothing afterwards. A step where
   no row drafted computes what plain decoding does (greedy: the argmax screen alone) and gives the drafters
   no rows to record.

Why holes: ``DynamicCache`` keeps one length for the whole batch, so ragged rows need masked columns anyway;
realigning every row at every step copies the whole cache (``O(B x T)`` per step), holes cost the step's
block (``O(B x N)``) plus attention over at most a third more columns.

Host and device: token ids, trees, positions and owned columns are host values; per step the device is read
once per row for its draft and, greedy, once for every row's first block of argmaxes (more only where a
walk leaves the block): reads grow with ``B``, not with the draft length.

Output: row ``b`` is its padded prompt, its tokens, then ``pad_token_id`` up to the longest row, as plain
batched ``generate`` returns it; ``output_scores`` / ``output_logits`` as plain's, every generated column
(:mod:`hf_cascade.core.outputs`). ``past_key_values`` is not returned (the cache has holes)."""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList, PreTrainedModel

from .. import placement
from ..compat import cache_kwargs, given_cache
from .accept import TreeAcceptance
from .batch_state import COMPACT_SHARE, BatchRun
from .forward import check_attention_backend
from .head_input import screen_heads
from .payoff.gate import lagging_rows
from .phases import accept_row, checked_head, draft_row, emit, keep_last
from .rows import Verified, verified
from .stats import BatchStats
from .strategy import TreeDrafter
from .structure import TokenTree


@torch.no_grad()
def speculative_decode_batch(
    target: PreTrainedModel,
    drafters: list[TreeDrafter],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    logits_processor: LogitsProcessorList | None,
    stopping_criteria,
    generation_config: GenerationConfig,
    stats: BatchStats,
    block_rows: int | None = 4,
    argmax_screen=None,
    model_kwargs: dict | None = None,
):
    """Generate for every row of a left-padded batch, row ``b`` drafted by ``drafters[b]`` (module docstring).
    ``argmax_screen``: the backend's exact argmax of the head for a number of rows, used as at batch 1
    (:func:`hf_cascade.core.loop.speculative_decode`) for the first blocks of every row and the blocks after.
    ``model_kwargs``: ``generate``'s (a static cache, given or asked for, selects
    the static :class:`~hf_cascade.core.static.StaticBatch`)."""
    # under flash attention, chains only: padding and holes are hidden by a 2-D mask (BatchRun.mask, ownership_mask)
    check_attention_backend(target, tree_shaped=not all(d.linear for d in drafters))
    run = BatchRun(
        target,
        drafters,
        input_ids,
        attention_mask,
        logits_processor,
        stopping_criteria,
        generation_config,
        stats,
        block_rows,
        given_cache(model_kwargs or {}),
    )
    with run.head_input:
        with run.timer("prefill"):
            prefill(run)
        run.screen, run.plain_screen = screen_heads(run, drafters, argmax_screen), screen_heads(run, [], argmax_screen)
        accelerators = placement.accelerators(target)  # a timing that decides synchronises (PhaseTimer's rule)
        while run.rows:
            step_started, allowed, lagging = (
                time.perf_counter(),
                run.gate.allows(),
                lagging_rows([row.stopper.max_length - row.width for row in run.rows]),
            )
            drafting = set(lagging if run.gate.follows_lagging else range(len(run.rows)))  # the rows that may draft
            with run.timer("draft"):
                drafts = draft_rows(run, allowed, drafting)
                if run.static is not None:
                    drafts = fit_room(run, drafts)  # the next block fits the static cache
            started = time.perf_counter()
            with run.timer("verify"):
                checked = verify(run, drafts)
            with run.timer("accept"):
                acceptances = accept(run, drafts, checked)
            run.verify_seconds = time.perf_counter() - started  # acceptance read the device: synchronised
            with run.timer("update"):
                emitted = update(run, drafts, checked, acceptances)
            for device in accelerators:  # the gate decides on the step's time: its work done
                placement.synchronize(device)
            run.gate.observe(
                any(tree.num_nodes for tree, _ in drafts),
                min(emitted[b] for b in lagging),
                time.perf_counter() - step_started,
                run.verify_nodes,
                rows=len(emitted),
            )
    return run.result()


# -- the steps -----------------------------------------------------------------------------------------


def prefill(run: BatchRun) -> None:
    """Every row's prompt minus its last token (the first root) into the cache, left padding masked.

    One forward over the padded ``[B, P - 1]`` block, as plain batched ``generate`` runs it; or, where padding is
    at least half of that block (:func:`prefill_by_row`), one forward per row over its own tokens, the K/V
    placed where the padded forward would have put them: the same cache layout, without the work on padding."""
    width = run.width - 1
    if width < 1:
        return
    pos = [[-1] * row.pad + list(range(row.length - 1)) for row in run.rows]  # [B, P - 1]
    query = torch.tensor(pos, dtype=torch.long, device=run.device)
    if prefill_by_row([row.length - 1 for row in run.rows], width):
        last, hidden = _prefill_rows(run, width)
    else:
        last, hidden = _prefill_padded(run, query)
    run.past_pos = query
    for row, p in zip(run.rows, pos):
        row.cols = [c for c, q in enumerate(p) if q >= 0]
    real_last = [b for b, row in enumerate(run.rows) if row.length > 1]
    if hidden is None or not real_last:
        return
    if not run.full_forward:  # a user's compiled forward verifies: not bypassed
        index = torch.tensor(real_last, device=hidden.device)
        run.head = checked_head(run.target, hidden[index], last[index.to(last.device)])
    for b in real_last:
        run.rows[b].last_hidden = hidden[b]


def prefill_by_row(lengths: list[int], width: int) -> bool:
    """Whether to prefill row by row: where padding is at least half of the padded ``[B, width]`` block. Row by
    row does the prompts' work alone for ``B - 1`` more forward calls; past half padding the padded forward spends
    at least as much work on padding as on the prompts, which outweighs those calls wherever prefill work grows
    with the tokens (a CPU; an accelerator on long prompts)."""
    return len(lengths) > 1 and 2 * sum(lengths) <= len(lengths) * width


def _prefill_padded(run: BatchRun, query: torch.Tensor):
    """The padded block in one forward: ``(last logits [B, V], head inputs [B, H] or None)``."""
    width = query.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=run.device).tril()
    ancestors = (causal[None] & (query >= 0)[:, None, :]) | torch.eye(width, dtype=torch.bool, device=run.device)[None]
    empty = torch.empty(len(run.rows), 0, dtype=torch.long, device=run.device)
    ids = torch.stack([row.full[:-1] for row in run.rows])
    columns = run.static.show(len(run.rows), width) if run.static is not None else None
    logits = run.target(
        input_ids=ids,
        position_ids=query.clamp(min=0),
        attention_mask=run.mask(empty, query, ancestors, columns),
        **cache_kwargs(run.target, run.cache),
        **keep_last(run.target),
    ).logits[:, -1]
    run.stats.prefill_calls += 1
    if run.static is not None:
        run.static.prefilled(width)
    hidden = run.head_input.rows()
    return logits, hidden if hidden is not None and hidden.shape[0] == len(run.rows) else None


def _prefill_rows(run: BatchRun, width: int):
    """Each row's own tokens in a forward of their own, into a batch-1 cache; then every layer's K/V of the
    batch, each row right-aligned in ``width`` columns (the padding columns zero, masked as before)."""
    empty = torch.empty(1, 0, dtype=torch.long, device=run.device)
    caches, last, hidden = [], [], []
    for row in run.rows:
        n = row.length - 1
        if n < 1:
            caches.append(None)
            last.append(None)
            hidden.append(None)
            continue
        query = torch.arange(n, device=run.device)[None]
        causal = torch.ones(1, n, n, dtype=torch.bool, device=run.device).tril()
        cache = DynamicCache()
        out = run.target(
            input_ids=row.full[row.pad : row.pad + n][None],
            position_ids=query,
            attention_mask=run.mask(empty, query, causal),
            **cache_kwargs(run.target, cache),
            **keep_last(run.target),
        )
        run.stats.prefill_calls += 1
        rows = run.head_input.rows()
        caches.append(cache)
        last.append(out.logits[0, -1])
        hidden.append(rows[-1] if rows is not None else None)
    for i in range(len(next(c for c in caches if c is not None).layers)):
        keys, values = (
            _right_aligned([c.layers[i].keys if c is not None else None for c in caches], width),
            _right_aligned([c.layers[i].values if c is not None else None for c in caches], width),
        )
        run.cache.update(keys, values, i)
    if run.static is not None:
        run.static.prefilled(width)
    done = [b for b, x in enumerate(last) if x is not None]
    logits = _stacked(last, last[done[0]])
    if any(hidden[b] is None for b in done):
        return logits, None
    return logits, _stacked(hidden, hidden[done[0]])


def _stacked(parts: list[torch.Tensor | None], like: torch.Tensor) -> torch.Tensor:
    """``parts`` stacked, zeros where a row has none (a one-token prompt: nothing was processed)."""
    return torch.stack([p if p is not None else torch.zeros_like(like) for p in parts])


def _right_aligned(parts: list[torch.Tensor | None], width: int) -> torch.Tensor:
    """``[B, H, width, D]`` from each row's ``[1, H, n_b, D]`` (``None``: none), right-aligned, zeros before."""
    like = next(p for p in parts if p is not None)
    out = like.new_zeros(len(parts), like.shape[1], width, like.shape[3])
    for b, p in enumerate(parts):
        if p is not None:
            out[b, :, width - p.shape[2] :] = p[0]
    return out


def draft_rows(run: BatchRun, allowed: bool, drafting: set[int]) -> list[tuple[TokenTree, torch.Tensor | None]]:
    """Every row's draft for the step: the rows that may draft (``drafting``, if the gate ``allowed`` it), sized
    by the gate (:meth:`~hf_cascade.core.payoff.DraftGate.sized`); then the others, each riding along
    (:meth:`~hf_cascade.core.payoff.DraftGate.rides`) within the width the first ones set, or drafting nothing.
    Each row's drafter is called once per step."""
    started, gate, rows = time.perf_counter(), run.gate, run.rows
    lead = gate.sized({b: draft(run, b, allowed) for b in sorted(drafting)}, rows, started)
    width = max((tree.num_nodes for tree, _ in lead.values()), default=0)
    return [lead[b] if b in lead else draft(run, b, gate.rides(rows[b], width), limit=width) for b in range(len(rows))]


def draft(
    run: BatchRun, b: int, allowed: bool = True, limit: int | None = None
) -> tuple[TokenTree, torch.Tensor | None]:
    """Row ``b``'s draft, pruned to what it can emit, to the gate's
    :attr:`~hf_cascade.core.payoff.DraftGate.width` and to ``limit`` nodes; none when not ``allowed`` (the batch's
    draft gate refuses this step, or the row is ahead of the lagging rows and does not ride along): the drafter
    then sees a budget of 0, as at the end of a generation. The drafter's wall time is kept per row
    (:meth:`~hf_cascade.core.payoff.DraftGate.rides`; a tree's tokens are host values, so the time includes the
    device work behind them)."""
    row = run.rows[b]
    state = run.state(b, cache=allowed)  # a refused step reads no cache: none is gathered
    if not allowed:
        state.budget = 0
    elif limit is not None:
        state.budget = min(state.budget, limit)
    started = time.perf_counter()
    tree, q = draft_row(row, state)
    if allowed and state.budget > 0:
        seconds = time.perf_counter() - started
        row.draft_seconds = seconds if row.draft_seconds is None else (row.draft_seconds + seconds) / 2
    if not allowed:
        return tree, q
    widths = [w for w in (run.gate.width, limit) if w is not None]
    return run.gate.cut(tree, q, min(widths, default=None))  # None: as drafted


def fit_room(run, drafts: list[tuple]) -> list[tuple]:
    """The step's drafts where the next block fits the static cache: compacted first where it would not (forced:
    :meth:`~hf_cascade.core.batch_state.BatchRun.compact_if_sparse`), then every draft cut to the room left."""
    static, need = run.static, max(tree.num_nodes for tree, _ in drafts) + 1
    if static.length + need > static.capacity:
        run.compact_if_sparse(force=True)
    room = static.room()
    if room < 1:
        raise ValueError(
            f"the static cache's {static.capacity} columns cannot hold the batch's next step "
            f"({static.length} in use); give it max_cache_len >= max_length."
        )
    if need <= room:
        return drafts
    return [run.gate.cut(tree, q, room - 1) for tree, q in drafts]


def verify(run: BatchRun, drafts) -> Verified:
    """One target forward over every row's ``[root, nodes]``; each row's first block of logits in one head call.
    With a static cache, compiled, the block is ``[R, Q]``: the call's rows (finished ones as padding rows) and a
    query bucket (:meth:`~hf_cascade.core.static.StaticBatch.shape`)."""
    B, N = len(run.rows), max(tree.num_nodes for tree, _ in drafts) + 1
    R, Q = run.static.shape(B, N) if run.static is not None else (B, N)
    ids, query = [[run.pad_id] * Q for _ in range(R)], [[-1] * Q for _ in range(R)]
    ancestors = torch.eye(Q, dtype=torch.bool).repeat(R, 1, 1)  # padding queries: themselves only
    for b, (row, (tree, _)) in enumerate(zip(run.rows, drafts)):
        root = row.length - 1
        if run.flash and tree.parent_list != tuple(range(-1, tree.num_nodes - 1)):
            raise ValueError(
                "a draft with branches under an attention backend that applies no 4-D mask (flash): "
                "batches verify chains only there"
            )
        parents = (-1,) + tuple(p + 1 for p in tree.parent_list)
        depth = (0,) + tuple(d + 1 for d in tree.depth_list)
        ids[b][: len(parents)] = [row.tokens[-1], *tree.token_list]
        for i, (p, d) in enumerate(zip(parents, depth)):
            query[b][i] = root + d
            if p >= 0:
                ancestors[b, i] |= ancestors[b, p]  # parents precede children
    query_t, past = torch.tensor(query, dtype=torch.long, device=run.device), run.past_pos
    if R > B:  # rows that finished: none of their columns
        past = torch.cat([past, past.new_full((R - B, past.shape[1]), -1)])
    width = run.static.show(R, Q) if run.static is not None else None  # R: the forward's rows
    inputs = dict(
        input_ids=torch.tensor(ids, dtype=torch.long, device=run.device),
        position_ids=query_t.clamp(min=0),
        attention_mask=run.mask(past, query_t, ancestors.to(run.device), width),
        **cache_kwargs(run.target, run.cache),
    )
    run.stats.record_forward(B, N)
    full = run.head is None or run.full_forward  # the model's logits (a user's compiled forward)
    out = (run.target if full else run.call)(**inputs)
    if run.static is not None:
        run.static.wrote(Q)
    heads = (run.screen if N > 1 else run.plain_screen) or (lambda rows: (run.head, None))
    head, argmax_head = heads(run.block_rows or 1)  # blocks after the first
    return verified(
        out,
        full,
        run.head_input.rows,
        [tree for tree, _ in drafts],
        [row.full for row in run.rows],
        [row.processors for row in run.rows],
        copy=run.static is not None,
        head=head,
        argmax_head=argmax_head,
        block_rows=run.block_rows,
        heads=heads,
        greedy=not run.cfg.do_sample,
    )


def accept(run: BatchRun, drafts, checked: Verified) -> list[TreeAcceptance]:
    """Each row's acceptance, exactly as at batch 1 (:func:`~hf_cascade.core.phases.accept_row`)."""
    return [accept_row(run.cfg.do_sample, tree, r, q) for (tree, q), r in zip(drafts, checked.rows)]


def update(run: BatchRun, drafts, checked: Verified, acceptances: list[TreeAcceptance]) -> list[int]:
    """Emit each row's tokens where plain decoding stops, keep their K/V (holes where a row emitted fewer than
    the longest), give every drafter its feedback, drop finished rows, compact when holes pile up. Returns the
    tokens each row of the step emitted."""
    kept, done, rows, hidden = [], [], checked.rows, checked.hidden
    run.verify_nodes = checked.nodes  # what the next step's drafters and gate see
    for b, (row, (tree, _), r, acc) in enumerate(zip(run.rows, drafts, rows, acceptances)):
        out = emit(
            row,
            tree,
            acc,
            r,
            hidden[b] if hidden is not None else None,
            run.scores is not None,
            run.raw_logits is not None,
        )
        kept.append(out.src[: out.count])  # the block's columns of its tokens
        if out.finished:
            done.append(b)
    run.keep(kept)
    for b, ((tree, _), acc, r) in enumerate(zip(drafts, acceptances, rows)):
        state = run.state(b, cache=False)
        state.rows = r if run.verify_nodes else None  # a plain step: nothing for drafters to record
        run.rows[b].drafter.on_accept(tree, acc, state)
    run.drop(done)
    run.compact_if_sparse()
    return [len(k) for k in kept]


__all__ = ["COMPACT_SHARE", "accept", "draft", "draft_rows", "prefill", "speculative_decode_batch", "update", "verify"]
