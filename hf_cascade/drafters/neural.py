"""A Hugging Face causal LM used as a drafter or as a reviewer inside a cascade.

:class:`NeuralLevel` keeps the model's KV cache across draft steps of one ``generate()`` call and
rolls it back through the ``Cache`` API (``crop``), so each step only forwards the tokens the cache
has not seen: no prefix recomputation. Its logits are mapped onto the target's vocabulary (a draft
vocabulary padded to a different size is cut or padded with ``-inf``) and go through the same logits
processors as the target's. Tokens are kept as Python lists between forwards (no per-token tensor
copies or concatenations on the drafting loop).

Host reads: on a CPU the drafting loop reads each token as it is drawn and stops as early as its rules say.
On an accelerator (:func:`~hf_cascade.placement.defer_reads`) it drafts its ``k`` tokens on the device,
feeding each drawn token straight back, and reads them once (:meth:`NeuralLevel.draft_on_device`); the
stop rules then cut the draft on the host (same tokens; the cache keeps the extra positions until the next
rollback). Forwards whose time decides something (a review's, for the lookahead's cost model) synchronise
the device around the clock reads (``timed=True``).

Compiled calls (:meth:`NeuralLevel.compile_forwards`, where the call's verification is compiled): the forwards run
through ``torch.compile`` over a static cache with padded query counts
(:class:`~hf_cascade.drafters.static_forward.StaticDraftForward`); the same tokens are fed, the same rows drawn.
"""

from __future__ import annotations

import math
import struct
import time

import torch
from transformers import DynamicCache, LogitsProcessorList, PreTrainedModel

from ..compat import cache_kwargs
from ..core.categorical import categorical
from ..core.head_input import HeadInput
from ..core.payoff import ExpectedGainRule
from ..core.phases import checked_head
from ..core.static import static_rollback_supported
from ..core.stats import LevelStats
from ..placement import defer_reads, synchronize
from ..processors import process_positions
from .maxgram import common_prefix
from .static_forward import StaticDraftForward, keep_draft_prefix
from .stepped import SteppedDecoder

# Vocabularies whose sizes differ by at most this many rows are treated as padded copies of each
# other (e.g. 151936 vs 152064), provided their special tokens agree.
MAX_VOCAB_PADDING = 1024


def output_vocab_size(model: PreTrainedModel) -> int:
    """Rows of the model's output projection (falls back to ``config.vocab_size``). A drafter with a
    reduced output vocabulary (``config.draft_vocab_size``) returns full-vocabulary logits: its size
    is ``config.vocab_size``."""
    if getattr(model.config, "draft_vocab_size", None) is not None:
        return int(model.config.vocab_size)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if weight is not None:
        return int(weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


def check_same_vocabulary(
    target: PreTrainedModel, drafter: PreTrainedModel, target_tokenizer=None, drafter_tokenizer=None
) -> None:
    """Raise ``ValueError`` unless ``drafter`` shares ``target``'s vocabulary (padding aside)."""
    name = type(drafter).__name__
    if target_tokenizer is not None and drafter_tokenizer is not None:
        if target_tokenizer.get_vocab() != drafter_tokenizer.get_vocab():
            raise ValueError(
                f"Drafter {name} uses a different tokenizer than the target; "
                "hf_cascade drafters must share the target's vocabulary."
            )
    vt, vd = output_vocab_size(target), output_vocab_size(drafter)
    if abs(vt - vd) > MAX_VOCAB_PADDING:
        raise ValueError(
            f"Vocabulary mismatch: the target predicts {vt} tokens, drafter {name} predicts {vd}. "
            "hf_cascade drafters must share the target's tokenizer (a vocabulary padded to a different size is fine)."
        )
    tc, dc = target.config.get_text_config(), drafter.config.get_text_config()
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id"):
        a, b = getattr(tc, attr, None), getattr(dc, attr, None)
        if a is not None and b is not None and _as_set(a) != _as_set(b) and attr != "pad_token_id":
            raise ValueError(f"Vocabulary mismatch: target {attr}={a}, drafter {name} {attr}={b}.")


def model_name(model) -> str:
    """A drafter's name in statistics: its checkpoint's ``_name_or_path``, else its class name."""
    return getattr(getattr(model, "config", None), "_name_or_path", None) or type(model).__name__


def _as_set(x) -> set:
    return set(x) if isinstance(x, (list, tuple)) else {x}


class NeuralLevel:
    """One neural drafter for one ``generate()`` call.

    Args:
        model: the drafter (any HF causal LM sharing the target's tokenizer).
        vocab_size: the target's output vocabulary size ``V``.
        processors: the target's (lossless) logits processors.
        stats: where forward counts are recorded.
    """

    def __init__(self, model: PreTrainedModel, vocab_size: int, processors: LogitsProcessorList, stats: LevelStats):
        self.model = model
        self.vocab_size = vocab_size
        self.processors = processors
        self.stats = stats
        self.device = next(model.parameters()).device
        # A plain DynamicCache keeps every position in every layer, sliding-window layers included
        # (their window is applied by the attention mask), so ``crop`` can roll back any number of
        # tokens. transformers' sliding-window cache layers forget states past the window at each
        # crop, which a drafter's deeper rollbacks (across several forwards) cannot afford.
        self.cache = DynamicCache()
        self.cached: list[int] = []  # tokens whose K/V are in ``cache``
        self.last_forward_seconds = 0.0
        self.last_forward_tokens = 0
        # hf_cascade's own drafters predict over a reduced vocabulary and can return those logits only
        self._reduced = getattr(model.config, "draft_vocab_size", None) is not None and hasattr(model, "vocab_subset")
        self._subset: list[int] = model.vocab_subset.tolist() if self._reduced else []  # [N] target ids
        self.compiled: StaticDraftForward | None = None  # compiled calls: forwards over a static cache
        # the model's output head where it reproduces the model's logits (checked at the first plain forward; None:
        # the full model runs; False: not checked yet), and its decoder
        self._head = None if self._reduced else False
        self._decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        self._stepped = SteppedDecoder.of(self._decoder)  # its forward through its modules (None: the decoder runs)

    def compile_forwards(self, compile_config, capacity: int) -> None:
        """Run this call's forwards compiled with ``compile_config`` over a static cache of at least ``capacity``
        columns (the call's longest sequence), in place of the ``DynamicCache``."""
        if static_rollback_supported():  # static layers that roll back (transformers >= 5)
            self.compiled = StaticDraftForward(self.model, _lm_forward, compile_config, capacity)

    # -- scoring -----------------------------------------------------------------------------
    @torch.no_grad()
    def scores(self, seq: torch.Tensor, start: int, timed: bool = False) -> torch.Tensor:
        """Processed scores ``[L - start + 1, V]`` of the positions predicting ``seq[start:]`` and
        the token after ``seq`` (``seq``: ``[L]`` on any device, ``start >= 1``), on the drafter's device.
        ``timed``: synchronise around the forward so :attr:`last_forward_seconds` is its device time."""
        logits = self._to_target_vocab(self._forward(seq.tolist(), start, timed=timed).float())  # [1, needed, V]
        scores = process_positions(self.processors, seq[None].to(logits.device), logits, start)
        return scores[0]

    @torch.no_grad()
    def next_greedy(self, seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(token [1], q [])`` for the greedy token after ``seq`` and the drafter's probability of it,
        computed over the drafter's reduced vocabulary without building a full-vocabulary row; ``None``
        when that is not possible (a drafter without a reduced vocabulary, or logits processors, which
        act on full rows). The token and its probability equal ``scores``' argmax and softmax: outside
        the subset those rows are ``finfo.min``, whose exponential is 0."""
        if not self._greedy_reduced():
            return None
        tok, prob = self._greedy_token(seq.tolist())
        return (
            torch.tensor([tok], device=seq.device),
            torch.tensor(prob, dtype=torch.float32, device="cpu"),
        )  # a host value (exact: a float32)

    def _greedy_reduced(self) -> bool:
        return self._reduced and not len(self.processors)

    def _greedy_token(self, ids: list[int]) -> tuple[int, float]:
        """The greedy token after ``ids`` and its probability as Python numbers (:meth:`next_greedy`)."""
        q = self._reduced_logits(ids).float().softmax(dim=-1)  # [N]
        i = int(q.argmax())
        return self._subset[i], float(q[i])

    def _reduced_logits(self, ids: list[int]) -> torch.Tensor:
        """The drafter's logits ``[N]`` over its subset for the token after ``ids``."""
        return self._run(ids, self._sync(ids, len(ids)), 1, full_vocab=False)[0, -1]

    def _forward(self, ids: list[int], start: int, **kwargs) -> torch.Tensor:
        """Run the drafter on the tokens of ``ids`` its cache lacks; ``[1, L - start + 1, V_d]`` logits."""
        return self._run(ids, self._sync(ids, start), len(ids) - start + 1, **kwargs)

    @torch.no_grad()
    def draft_on_device(self, seq: torch.Tensor, k: int, do_sample: bool, reduced: bool = False):
        """Draft ``k`` tokens after ``seq`` feeding each drawn token back on the device, with one host read
        at the end (the tokens). Same forwards, rows and draws as ``k`` calls of :meth:`scores` (or of the
        reduced greedy path, ``reduced=True``: no processors, greedy). Returns ``(tokens`` (a list),
        ``token_probs [k]``, ``rows [k, V] | None`` (the processed distributions; ``None`` when reduced)``)``,
        tensors on the drafter's device; the cache then holds ``seq`` and the first ``k - 1`` drafts."""
        ids = seq.tolist()
        new = torch.tensor(ids[self._sync(ids, len(ids)) :], dtype=torch.long, device=self.device)[None]
        processed = not reduced and len(self.processors) > 0  # the processors see the sequence, drafts appended
        cur = seq.to(self.device) if processed else None
        kwargs = {"full_vocab": False} if reduced else {}
        toks, probs, rows = [], [], []
        for _ in range(k):
            t0 = time.perf_counter()
            if self.compiled is None:
                last = self._logits(new, 1, **kwargs)  # [1, 1, V_d]
            else:
                last = self.compiled(new[0], True, **kwargs)
            self._count_forward(t0, new.shape[1])
            if reduced:
                q = last[0, -1].float().softmax(dim=-1)  # [N]
                j = q.argmax()
                tok, q_tok = self.model.vocab_subset[j], q[j]
            else:
                s = self._to_target_vocab(last.float())  # [1, 1, V]
                if processed:
                    s = process_positions(self.processors, cur[None], s, cur.shape[0])
                s = s[0, -1]
                q = s.softmax(dim=-1)
                tok = categorical(q) if do_sample else s.argmax()
                q_tok = q[tok]
                rows.append(q)
            toks.append(tok.reshape(()))
            probs.append(q_tok)
            if processed:
                cur = torch.cat([cur, tok.reshape(1)])
            new = tok.reshape(1, 1)
        tokens = torch.stack(toks).tolist() if toks else []  # the one read
        self.cached = ids + tokens[:-1]
        return (
            tokens,
            (torch.stack(probs) if probs else torch.ones(0, device=self.device)),
            (torch.stack(rows) if rows else None),
        )

    def _sync(self, ids: list[int], start: int) -> int:
        """Roll the cache back to the longest prefix it shares with ``ids`` (at most ``start - 1``
        tokens, so the position predicting ``ids[start]`` is recomputed); returns its length."""
        keep = min(common_prefix(self.cached, ids), start - 1)
        self._rollback(keep)
        return keep

    def _run(self, ids: list[int], keep: int, needed: int, timed: bool = False, **kwargs) -> torch.Tensor:
        """The model's forward over ``ids[keep:]``; logits ``[1, needed, V_d]`` of its last positions."""
        new = torch.tensor(ids[keep:], dtype=torch.long, device=self.device)[None]  # [1, L - keep]
        if timed:
            synchronize(self.device)
        t0 = time.perf_counter()
        if self.compiled is None:
            logits = self._logits(new, needed, **kwargs)
        else:
            logits = self.compiled(new[0], needed == 1, **kwargs)
        if timed:
            synchronize(self.device)
        self._count_forward(t0, new.shape[1])
        self.cached = list(ids)
        return logits[:, -needed:, :]

    def _logits(self, new: torch.Tensor, needed: int, **kwargs) -> torch.Tensor:
        """The model's logits ``[1, needed, V_d]`` of the last ``needed`` positions of ``new`` (``[1, T]``), fed
        eagerly into :attr:`cache`. Without model-specific keywords, where the model's decoder and output head
        reproduce its logits (:func:`~hf_cascade.core.phases.checked_head`, at this call's first such forward) they
        run alone, as the core verifies: the full forward's wrappers and output objects are not built per token; a
        Llama decoder's forward stepped through its modules where nothing observes its call
        (:class:`~hf_cascade.drafters.stepped.SteppedDecoder`)."""
        if kwargs or self._head is None:
            return self.model(
                input_ids=new, **cache_kwargs(self.model, self.cache), logits_to_keep=needed, **kwargs
            ).logits
        if self._head is not False:
            if self._stepped is not None and self._stepped.usable():  # the decoder's forward, without its wrappers
                hidden = self._stepped(new, self.cache)
            else:
                hidden = self._decoder(input_ids=new, **cache_kwargs(self._decoder, self.cache)).last_hidden_state
            return self._head(hidden[:, -needed:])
        with HeadInput(self.model) as caught:  # the first forward: check the head on its rows
            logits = self.model(input_ids=new, **cache_kwargs(self.model, self.cache), logits_to_keep=needed).logits
        hidden = caught.rows()
        self._head = None
        if hidden is not None and hidden.shape[0] >= needed and logits.shape[1] == needed:
            self._head = checked_head(self.model, hidden[-needed:], logits[0])
        return logits

    def _count_forward(self, t0: float, tokens: int) -> None:
        self.last_forward_seconds = time.perf_counter() - t0
        self.last_forward_tokens = tokens
        self.stats.forward_calls += 1
        self.stats.forward_tokens += tokens

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        vd = logits.shape[-1]
        if vd > self.vocab_size:
            return logits[..., : self.vocab_size]
        if vd < self.vocab_size:
            pad = logits.new_full((*logits.shape[:-1], self.vocab_size - vd), -math.inf)
            return torch.cat([logits, pad], dim=-1)
        return logits

    def _rollback(self, length: int) -> None:
        """Drop cached K/V beyond ``length`` tokens (:func:`~hf_cascade.drafters.static_forward.keep_draft_prefix`)."""
        keep_draft_prefix(self.compiled, self.cache, length)
        del self.cached[length:]

    # -- autoregressive drafting (only when no smaller level exists) --------------------------
    @torch.no_grad()
    def generate(
        self,
        seq: torch.Tensor,
        k: int,
        do_sample: bool,
        stop_ids: set[int],
        min_confidence: float = 0.0,
        keep_unsure: bool = True,
        rule: ExpectedGainRule | None = None,
    ):
        """Draft ``k`` tokens autoregressively. Stops after a stop token; after a token drawn with
        probability ``< min_confidence`` when ``keep_unsure`` (transformers' rule); *before* a token
        whose probability is below a floor (``min_confidence`` when not ``keep_unsure``, and ``rule``'s
        ``floor()``), which is then dropped; without a forward when ``rule``'s floor exceeds 1.

        Dropping a drawn token by its probability changes the distribution the kept token came from:
        with floor ``t`` it is ``q`` restricted to ``{x: q(x) >= t}`` and renormalised, and that is the
        ``dists`` row returned, so speculative sampling stays exact. Returns ``(tokens [k'],
        token_probs [k'], dists [k', V] | None)``; ``token_probs`` are the unrestricted ``q(x)``.
        """
        if defer_reads(self.device):
            return self._generate_deferred(seq, k, do_sample, stop_ids, min_confidence, keep_unsure, rule)
        ids = seq.tolist()  # the sequence, drafts appended
        tokens, probs, dists = [], [], []
        greedy = not do_sample and self._greedy_reduced()
        for _ in range(k):
            rule_floor = rule.floor() if rule is not None else 0.0  # once per token: bins are scanned
            if rule_floor > 1.0:
                break  # no token could pay: skip the forward
            floor = max(0.0 if keep_unsure else min_confidence, rule_floor)
            if greedy:  # no full row needed
                tok, prob = self._greedy_token(ids)
                dist = None
                if floor > 0.0 and not prob >= _as_float32(floor):  # float32, as the tensor comparison
                    break  # drop it: the draft ends here
            else:
                tok, prob, dist = self._drawn_token(ids, seq.device, do_sample, floor)
                if tok is None:
                    break
            tokens.append(tok)
            probs.append(prob)
            if do_sample:
                dists.append(dist)
            if rule is not None:
                rule.extend(rule.estimate(prob))
            ids.append(tok)
            if tok in stop_ids or prob < min_confidence:
                break
        return self._result(seq, tokens, probs, dists, do_sample)

    def _result(self, seq: torch.Tensor, tokens: list[int], probs: list[float], dists: list, do_sample: bool):
        """``generate``'s outputs: tokens and dists on ``seq``'s device, the probabilities as host values."""
        if not tokens:
            return (
                seq[:0],
                torch.ones(0, device="cpu"),
                (torch.zeros(0, self.vocab_size, device=seq.device) if do_sample else None),
            )
        return (
            torch.tensor(tokens, dtype=torch.long, device=seq.device),
            torch.tensor(probs, device="cpu"),  # host values (float32-exact)
            torch.stack(dists).to(seq.device) if do_sample else None,
        )

    def _generate_deferred(self, seq, k, do_sample, stop_ids, min_confidence, keep_unsure, rule):
        """:meth:`generate` on an accelerator: :meth:`draft_on_device` (``k`` forwards, the tokens and their
        probabilities read once each), then the same stop rules, on the host, in the same order."""
        if k < 1 or (rule is not None and rule.floor() > 1.0):
            return self._result(seq, [], [], [], do_sample)  # no token could pay: no forward
        drafted, q_tok, rows = self.draft_on_device(seq, k, do_sample, reduced=not do_sample and self._greedy_reduced())
        drafted_probs = q_tok.tolist()
        tokens, probs, dists = [], [], []
        for i, (tok, prob) in enumerate(zip(drafted, drafted_probs)):
            rule_floor = rule.floor() if rule is not None else 0.0
            if rule_floor > 1.0:
                break
            floor = max(0.0 if keep_unsure else min_confidence, rule_floor)
            if floor > 0.0 and not prob >= _as_float32(floor):  # float32, as the tensor comparison
                break  # drop it: the draft ends here
            tokens.append(tok)
            probs.append(prob)
            if do_sample:
                q = rows[i]
                if floor > 0.0:  # what a kept token was drawn from
                    kept = torch.where(q >= floor, q, torch.zeros_like(q))
                    q = kept / kept.sum()
                dists.append(q)
            if rule is not None:
                rule.extend(rule.estimate(prob))
            if tok in stop_ids or prob < min_confidence:
                break
        return self._result(seq, tokens, probs, dists, do_sample)

    def _drawn_token(self, ids: list[int], device: torch.device, do_sample: bool, floor: float):
        """A token from the full processed row after ``ids``: ``(token, q(token), dist [V])``, ``dist``
        the distribution it was drawn from (``q`` restricted to ``{q >= floor}`` under sampling);
        ``(None, None, None)`` when its probability is below ``floor``."""
        s = self.scores(torch.tensor(ids, dtype=torch.long, device=device), len(ids))[-1]  # [V]
        q = s.softmax(dim=-1)  # [V] the drafter's distribution
        tok = categorical(q)[None] if do_sample else s.argmax()[None]
        q_tok = q[tok]
        dist = q
        if floor > 0.0:
            if not bool(q_tok >= floor):  # the same comparison as the mask
                return None, None, None
            if do_sample:  # what a kept token was drawn from
                kept = torch.where(q >= floor, q, torch.zeros_like(q))  # [V]
                dist = kept / kept.sum()
        return int(tok), float(q_tok), dist


def _lm_forward(model, input_ids: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor | None, **kwargs):
    """A causal LM's logits of ``rows`` (``None``: every query) for ``input_ids`` at ``positions``: what
    :class:`~hf_cascade.drafters.static_forward.StaticDraftForward` compiles."""
    return model(
        input_ids=input_ids, position_ids=positions[None], logits_to_keep=0 if rows is None else rows, **kwargs
    ).logits


def _as_float32(x: float) -> float:
    """``x`` rounded to float32: a float32 tensor compares with a Python float in float32."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)
