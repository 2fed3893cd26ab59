"""GLIDE + CAPE decoding (Du et al., ICML 2024, "GLIDE with a CAPE", Sections 4.1-4.2, Appendix A) through
``generate(assistant_model=GlideAssistant(glide))``, verified as a token tree by :mod:`hf_cascade.core`.

One step (:meth:`GlideDrafter.draft_tree`), with ``seq`` the ``L`` verified tokens (``seq[-1]`` the root, not
yet in the target's cache):

1. **Glimpse without copying** -- the draft reads the target's cached K/V of layers ``l = N_T - N_D + m``
   straight from the loop's ``DynamicCache`` (:meth:`GlideForCausalLM.target_kv` returns the cache's own
   tensors; eager, :meth:`GlideForCausalLM.glimpse` repeats them to the cross-attention's query heads once per
   draft, a copy only where the target groups its K/V heads, which each forward would otherwise make). It holds
   ``seq[:-1]``: the paper's *KV cache delay*, every draft query at or after the root
   sees all ``L - 1`` entries, a catch-up token at index ``i < L - 1`` sees entries ``< i`` (as at a block
   start in training).
2. **Draft the main path** greedily, one draft forward per token, with the draft's own self-attention
   ``DynamicCache`` kept across steps: the first forward feeds the tokens the draft has not seen (the
   previous step's bonus / accepted tokens and the root), then each main token; drafting stops after
   ``draft_length`` tokens, at the length budget, after an EOS token or (``min_confidence > 0``, not in
   the paper) at the first token the draft gives less than ``min_confidence``.
3. **CAPE** (``GlideSettings.cape``): at each step ``i`` the confidence ``p_i = max p_D`` picks ``K_i = S(p_i)``
   (:class:`~hf_cascade.glide.cape.CapeSettings`) and the ``K_i`` next-best tokens become leaves beside
   ``x_{t+i}``; without CAPE (``GlideSettings.chain()``) the main path goes alone (a chain).
   **Hardware-aware size** (``Policy.cost_aware``, the default; not in the paper): draft at all, draft deeper, and
   verify each drafted node only when its calibrated chance of acceptance pays for its measured cost on the
   running device (:mod:`hf_cascade.core.payoff.budget`; the paper's fixed shape with ``Policy(cost_aware=False)``);
   a step drafted only to explore (rule 1 refused it) drafts its first main token alone.
4. After verification (:meth:`GlideDrafter.on_accept`) the draft cache is **cropped** (``Cache.crop``) to
   the verified tokens it already holds: the root and the accepted main-path tokens it fed. (With one draft
   layer their K/V do not depend on the glimpse at all; with more, the upper layers' K/V keep the view of
   the target cache they were drafted with, like positions inside a block of the training mask.)

CAPE's confidence ``p_i`` is the draft's own softmax (no temperature or other processing), as Section 4.2
defines it, so the tree does not depend on the sampling settings.

Sampling (not in the paper, which evaluates greedy decoding): at each main position the drafter either takes
the argmax, as above, or draws the token from its own distribution ``q`` after the target's warpers
(temperature, top-k, top-p, ...), whichever :class:`~hf_cascade.core.draws.ProposalChoice` measured the target
to accept more often at that confidence in this call (a draw is accepted with the overlap of ``q`` and ``p``,
the argmax with ``p`` of one token; both are computed at every step from the same target row). A drawn node
hands ``q`` to verification, every other node (an argmax token, a CAPE sibling) is a point mass, and a drawn
main path is verified in full (:mod:`hf_cascade.core.draws`, rules 1-3), so
:func:`~hf_cascade.core.accept.sampling_tree_accept` (SpecInfer's multi-step speculative sampling) emits every
token distributed exactly as the target's processed distribution (temperature, top-k/p, penalties), whatever
the draft proposes. Greedy decoding is exact by construction.

Compiled calls (:meth:`GlideDrafter.compile_forwards`, where the call's verification is compiled over a static
cache; not in the paper): the draft forward runs through ``torch.compile`` over a static draft cache with padded
catch-up tokens (:class:`~hf_cascade.drafters.static_forward.StaticDraftForward`), and the glimpse reads the
target's static cache whole, its fixed buffers, with a mask: a query at sequence index ``i`` sees the entries
``k < min(i, L - 1)``, the same entries as above (the columns past them hold rejected drafts). Where the cache the
draft reads is not static (a target the user compiled over a dynamic cache; a batch row's copy) the draft stays
eager: that cache grows every step, no fixed shape to read.

The lookup branch (``Policy.lookup``, with the cost rule; not in the paper): the sequence's own repeats join the
tree before the cost cut (:mod:`hf_cascade.drafters.lookup_branch`), also on steps where the draft does not run;
beside a drawn main path they are separate point-mass siblings (never merged with a drawn node).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, LogitsProcessorList

from ..compat import cache_kwargs
from ..core.accept import path_list
from ..core.draws import ProposalChoice, draw, tree_draft_probs, warped, warpers
from ..core.payoff import DraftPolicy
from ..core.strategy import TreeDrafter, TreeStep
from ..core.structure import TokenTree
from ..drafters.lookup_branch import LookupBranch, observe_verdict
from ..drafters.maxgram import common_prefix
from ..drafters.memory import AnswerMemory
from ..drafters.static_forward import StaticDraftForward, keep_draft_prefix
from ..placement import defer_reads
from .cape import expanded_lists, expansion_parts, parse_expansions
from .settings import GlideSettings
from .stats import GlideStats


class GlideDrafter(TreeDrafter):
    """Drafts GLIDE (+ CAPE) trees below the last verified token; one per ``generate()`` call (its draft
    cache and records live and die with the call). See the module docstring for the step."""

    reads_target_cache = True  # cross-attends to the target's K/V (TreeStep.cache)

    def __init__(
        self,
        glide,
        settings: GlideSettings,
        stop_ids: list[int],
        processors: LogitsProcessorList | None = None,
        policy: DraftPolicy | None = None,
        memory: AnswerMemory | None = None,
    ):
        self.glide, self.settings = glide, settings
        self._shared = bool(glide.config.share_target_embeddings)  # its rows are the target's vocabulary (read once)
        self._cross = bool(glide.config.cross_attention)  # it reads the target's cache (read once)
        # sampling (``processors`` given): draw the main path from the warped q while that is accepted more often
        # than the argmax (core.draws); greedy: the argmax path
        self.warpers = warpers(processors) if processors is not None else None
        self.choice = ProposalChoice() if processors is not None else None
        self._root_logits: torch.Tensor | None = None
        self._root_confidence: float | None = None
        self.linear = settings.cape is None  # without CAPE every draft is a chain (no tree mask)
        self.stop_ids = set(int(t) for t in stop_ids)
        self.cache = DynamicCache()  # the draft's own self-attention K/V of verified tokens
        self.record = GlideStats()  # only the GLIDE fields are used (copied by the assistant)
        self._root_len: int | None = None  # L at the last draft (None: nothing drafted)
        self._main: list[int] = []  # the last main path (target ids)
        self._checked = False
        self._device = next(glide.parameters()).device
        self._bounds = torch.tensor(self.choice.bounds, device=self._device) if self.choice is not None else None
        # what pays on this machine: whether to draft, how deep, which nodes (core.payoff); the paper's shape without
        self.policy = policy if policy is not None else DraftPolicy(cost_aware=False)
        self._probs: list[float | None] = []  # draft probabilities of the verified tree's nodes (None: a seed)
        # the sequence's repeats join the tree (drafters.lookup_branch), cut by the policy
        self.lookup = LookupBranch(memory=memory) if self.policy.lookup else None
        self._compile: tuple | None = None  # (the call's CompileConfig,) once compile_forwards asked
        self.compiled: StaticDraftForward | None = None  # compiled calls: the draft forward over a static cache

    def compile_forwards(self, compile_config) -> None:
        """Run the draft forward compiled with ``compile_config`` over a static draft cache, from the first draft on,
        when the target's cache is static (see the module docstring)."""
        self._compile = (compile_config,)

    def _start_compiled(self, state: TreeStep) -> None:
        """At the first draft: the compiled draft forward, when asked for and the target's cache is static."""
        full = getattr(state.cache, "full", None)
        if self._compile is not None and self.compiled is None and full is not None:
            capacity = max(int(layer.max_cache_len) for layer in full.layers)
            self.compiled = StaticDraftForward(self.glide, _glide_forward, self._compile[0], capacity)
        self._compile = None

    def _draft_length(self) -> int:
        """Tokens whose K/V the draft cache holds (a host count)."""
        return self.compiled.length if self.compiled is not None else self.cache.get_seq_length()

    # -- helpers -----------------------------------------------------------------------------------
    def _to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self._shared else self.glide.vocab_subset[draft_ids]

    @property
    def _columns(self) -> torch.Tensor | None:
        """The target id of each column of the draft's rows (``None``: the target's own vocabulary)."""
        return None if self._shared else self.glide.vocab_subset

    def _glimpse(self, state: TreeStep) -> list | None:
        """The ``N_D`` target ``(k, v)`` pairs the draft reads, or ``None`` (no cross-attention, or nothing cached
        yet). Compiled: the static cache's own buffers ``[1, kv_heads, capacity, d_k]``; eager: the cache's
        ``[1, kv_heads, L - 1, d_k]`` as the cross-attention reads them (:meth:`GlideForCausalLM.glimpse`: moved
        and repeated to its query heads once per draft instead of at each of its forwards)."""
        if not self._cross or state.cache.get_seq_length() == 0:
            return None
        cache = state.cache.full if self.compiled is not None else state.cache  # compiled: the fixed buffers
        if not self._checked:
            self._check_geometry(self.glide.target_kv(cache), state)
        return self.glide.target_kv(cache) if self.compiled is not None else self.glide.glimpse(cache)

    def _check_geometry(self, kv: list, state: TreeStep) -> None:
        """``ValueError`` unless the target's cached K/V fit this GLIDE (checked at the first draft)."""
        columns = kv[0][0].shape[-2] if self.compiled is not None else state.seq.shape[0] - 1
        c = self.glide.config
        layers = c.target_layer_ids or [f"N_T - {len(kv) - m}" for m in range(len(kv))]
        for (k, v), layer in zip(kv, layers):
            ok = (
                k.dim() == 4
                and k.shape == v.shape
                and k.shape[-1] == c.target_head_dim
                and c.target_num_attention_heads % k.shape[1] == 0
                and k.shape[-2] == columns
            )
            if not ok:
                raise ValueError(
                    f"the target's cached K/V of layer {layer} have shape {tuple(k.shape)}; this GLIDE expects "
                    f"[1, kv_heads | {c.target_num_attention_heads}, {columns}, "
                    f"{c.target_head_dim}] (a target of another geometry?)"
                )
        self._checked = True

    # -- the TreeDrafter contract ------------------------------------------------------------------
    @torch.no_grad()
    def draft_tree(self, seq: torch.Tensor, state: TreeStep) -> tuple[TokenTree, torch.Tensor | None]:
        """A chain (``cape=None``) or CAPE tree of at most ``min(draft_length, budget)`` main tokens after
        ``seq`` (``[L]``). Greedy: ``draft_probs = None`` (the argmax path, deterministic given ``seq``);
        sampling: the main path is drawn and ``draft_probs`` holds what each node was drawn from."""
        k = self.policy.plan(min(self.settings.draft_length, state.budget))  # exploring: its first token(s)
        self._root_len, self._main = None, []
        if k < 1:
            self.record.skipped_drafts += 1
            return self._joined(TokenTree.empty(seq.device), [], state), None
        length = seq.shape[0]
        self._start_compiled(state)
        past = self._draft_length()
        if past >= length:
            raise RuntimeError(f"the draft cache holds {past} tokens but only {length} are verified")
        kv = self._glimpse(state)
        ids = seq[past:].to(self._device)  # catch-up tokens + root
        # compiled: the glimpse's mask reads the target's verified entries (L - 1) as a tensor (no recompile)
        seen = torch.tensor(length - 1, device=self._device) if self.compiled is not None and kv is not None else None
        # sampling: which confidence buckets draw (core.draws.ProposalChoice); None: the argmax path
        table = self.choice.table(self._device) if self.choice is not None else None
        drawn = table is not None
        rows, bests, tops, tokens, qs = [], [], [], [], []  # per draft forward, on the device
        p_best, target_ids = [], []  # host copies of tops / tokens
        defer = defer_reads(self._device)  # GPU: read once after the k forwards, not per token
        self.policy.start_draft(seq.device)
        forward = dict(
            cache_kwargs(self.glide, self.cache),
            target_key_values=kv,
            full_vocab=False,
            logits_to_keep=1,
            return_dict=False,
        )  # eager: the same keyword arguments at every forward
        for t in range(k):
            if self.compiled is None:
                logits = self.glide(input_ids=ids[None], **forward)[0][0, -1]
            else:
                logits = self.compiled(ids, True, target_key_values=kv, seen=seen)[0, -1]
            self.record.draft_forwards += 1
            self.record.draft_tokens += ids.shape[0]
            self.policy.count_forward()
            p = logits.float().softmax(-1)  # [N] draft distribution
            top, best = p.max(-1)  # the first maximum, as argmax
            pick = best
            if t == 0 and self.choice is not None:
                self._root_logits = logits  # both proposals are measured at the first position
            if drawn:  # rules 1, 2 of core.draws: q is what a token is drawn from,
                x, q = draw(self.warpers, logits)  # and the mode depends on the confidence, not on x
                use = table[torch.bucketize(top, self._bounds)]
                pick = torch.where(use, x, best)
                qs.append(torch.where(use, q, torch.nn.functional.one_hot(best, q.shape[0]).to(q.dtype)))
            token = self._to_target(pick)
            rows.append(p), bests.append(pick), tops.append(top), tokens.append(token)
            if not defer:  # host reads are free: stop as soon as the rule says
                p_best.append(float(tops[-1]))
                target_ids.append(int(token))
                if self._main_length(p_best, target_ids, k)[1]:
                    break
            ids = token.reshape(1).to(self._device)
        read_sets = None
        if defer:  # one read: the main path, CAPE's sets, the last measures
            p_best, target_ids, read_sets = self._read_draft(rows, bests, tops, tokens)
        self.policy.end_draft()
        m = self._main_length(p_best, target_ids, k)[0]
        self._root_len = length
        self._root_confidence = p_best[0] if p_best else None
        self.record.main_lengths.append(m)
        if not m:  # unsure from the start
            self.record.expansion_sizes.append([])
            self.record.confidences.append([])
            self.record.drafted_nodes.append(0)
            return self._joined(TokenTree.empty(seq.device), [], state), None
        probs = torch.stack(rows[:m])  # [k', N]
        main_d = torch.stack(bests[:m])  # [k'] draft ids
        self._main = target_ids[:m]  # [k'] target ids
        # the main path's estimates are its confidences p_i (host floats: for a drawn node, its confidence, not its
        # token's probability; rule 2 of core.draws)
        tree, expansions, node_probs = expanded_lists(
            probs,
            main_d,
            self.settings.cape,
            self._to_target,
            main_target=self._main,
            device=seq.device,
            main_probs=p_best[:m],
            read=read_sets,
        )
        self.record.expansion_sizes.append([len(x) for x in expansions])
        self.record.confidences.append([round(c, 4) for c in p_best[:m]])  # p_i of the main tokens
        self.record.drafted_nodes.append(tree.num_nodes)
        if self.lookup is not None and not (drawn and self.linear):  # + repeats, what pays
            tree = self._joined(tree, node_probs, state, drawn=m if drawn else 0)
        else:  # what pays on this hardware
            tree, self._probs = self.policy.select(tree, node_probs, fixed=m if drawn else 0)
        if not drawn:
            return tree, None
        self.record.drawn_drafts += 1
        return tree, tree_draft_probs(tree, torch.stack(qs[:m]), self.glide.config.vocab_size, self._columns)

    def _read_draft(self, rows, bests, tops, tokens) -> tuple[list[float], list[int], tuple | None]:
        """The accelerator schedule's one read of a draft: each drafted step's confidence and target id, CAPE's
        expansion sets of every drafted row (the kept main path's are the first rows': a row's set depends on the
        rows before it only, :func:`~hf_cascade.glide.cape.expansion_read`) and the proposal choice's pending
        measures. ``(p_best, target_ids, sets or None)``. One ``torch.cat`` joins every part (float64: the
        expansion sets' last part is, and the other parts' floats and ids convert exactly)."""
        n, cape = len(tops), self.settings.cape
        top = torch.stack(tops)
        parts, layout = [top, torch.stack(tokens)], None
        if cape is not None:
            probs, main = torch.stack(rows), torch.stack(bests)
            # greedy (nothing drawn): the main path is the rows' argmax, whose probabilities are their maxima
            conf = top if self.choice is None else probs.gather(1, main[:, None])[:, 0]
            more, layout = expansion_parts(
                probs,
                main,
                cape.expansion_sizes(conf),
                cape.min_prob,
                cape.max_size,
                None if self._shared else self._to_target,
                conf,
            )
            parts += more
        else:
            parts[0] = top.double()
        pending = self.choice.pending() if self.choice is not None else None
        if pending is not None:
            parts.append(pending.to(parts[0].device))
        values = torch.cat(parts).tolist()  # the one read
        end = len(values) - (pending.shape[0] if pending is not None else 0)
        if pending is not None:
            self.choice.settle(values[end:])
        sets = parse_expansions(values[2 * n : end], layout) if layout is not None else None
        return values[:n], [int(t) for t in values[n : 2 * n]], sets

    def _joined(self, tree: TokenTree, probs: list[float], state: TreeStep, drawn: int = 0) -> TokenTree:
        """``tree`` (the draft's probabilities ``probs``; its first ``drawn`` nodes drawn from ``q``) with the
        lookup branch joined and cut to what pays (the tree as it is without a lookup branch). Seeds are point
        masses, after the drafted nodes: :func:`tree_draft_probs` gives them one-hot rows."""
        if self.lookup is None:
            return tree
        tree, self._probs = self.lookup.cut(self.policy, tree, probs, state, self.linear, drawn)
        return tree

    def _main_length(self, p_best: list[float], tokens: list[int], k: int) -> tuple[int, bool]:
        """The main path's stop rule over the drafted ``p_i`` / target ids: ``(m kept, rule ended)``."""
        cape, reach, m = self.settings.cape, 1.0, 0  # reach: prod of main p_i
        calibrated = 1.0  # the same, as target acceptance
        for t, (p, token) in enumerate(zip(p_best, tokens)):
            unsure = p < self.settings.min_confidence
            if unsure and (cape is None or reach * p < cape.min_prob):
                return m, True  # a chain leaves it out, CAPE too below its path floor
            reach *= p
            m += 1
            if unsure or t + 1 == k or token in self.stop_ids:
                return m, True
            calibrated *= self.policy.calibrated(p)  # the next forward must be able to pay
            if not self.policy.deeper(calibrated):
                return m, True
        return m, False

    def on_accept(self, tree, acceptance, state: TreeStep) -> None:
        """Keep, in the draft cache, the verified tokens it holds: ``seq[:L]`` and the fed main tokens that
        the target accepted (:func:`~hf_cascade.drafters.static_forward.keep_draft_prefix`); count main-path and
        expansion acceptances."""
        observe_verdict(self.policy, self.lookup, tree, self._probs, acceptance, state)
        self._probs = []
        if self.choice is not None and self._root_logits is not None and state.rows is not None:
            first = sum(1 for parent in tree.host_parents if parent < 0)  # the first level's nodes
            self.choice.observe(
                state.rows.softmax()[0],
                warped(self.warpers, self._root_logits),
                self._columns,
                siblings=max(first - 1, 0),
                confidence=self._root_confidence,
                defer=defer_reads(self._device),
            )  # read with the next draft
        self._root_logits = None
        if self._root_len is None:
            return
        length = self._root_len
        accepted = [tree.token_list[i] for i in path_list(acceptance)]  # host structure, host path
        on_main = common_prefix(accepted, self._main)
        self.record.main_accepted.append(on_main)
        self.record.expansion_accepted += int(len(accepted) > on_main)
        fed = self._main[:-1]  # the last main token is never fed
        emitted = state.tokens[length:] if getattr(state, "tokens", None) is not None else state.seq[length:].tolist()
        keep = length + common_prefix(emitted, fed)
        keep = min(keep, state.seq.shape[0] - 1)
        keep_draft_prefix(self.compiled, self.cache, keep)


def _glide_forward(
    glide,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    rows: torch.Tensor | None,
    target_key_values=None,
    seen: torch.Tensor | None = None,
    **kwargs,
) -> torch.Tensor:
    """The draft's logits over its own vocabulary of ``rows`` (``None``: every query) for ``input_ids`` at sequence
    indices ``positions``, glimpsing the target's static cache ``target_key_values`` (its fixed buffers) through the
    decoding mask: a query at index ``i`` sees the entries ``k < min(i, seen)``. What
    :class:`~hf_cascade.drafters.static_forward.StaticDraftForward` compiles."""
    mask = None
    if target_key_values is not None:
        columns = torch.arange(target_key_values[0][0].shape[-2], device=positions.device)
        mask = columns[None, :] < torch.minimum(positions, seen)[:, None]  # [Q, C]
    return glide(
        input_ids=input_ids,
        cache_position=positions,
        target_key_values=target_key_values,
        cross_attention_mask=mask,
        full_vocab=False,
        logits_to_keep=0 if rows is None else rows,
        **kwargs,
    ).logits


__all__ = ["GlideDrafter"]
