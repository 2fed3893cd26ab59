"""A Hugging Face causal LM used as a drafter or as a reviewer inside a cascade.

:class:`NeuralLevel` keeps the model's KV cache across draft steps of one ``generate()`` call and
rolls it back through the ``Cache`` API (``crop``), so each step only forwards the tokens the cache
has not seen: no prefix recomputation. Its logits are mapped onto the target's vocabulary (a draft
vocabulary padded to a different size is cut or padded with ``-inf``) and go through the same logits
processors as the target's.
"""

from __future__ import annotations

import math
import time

import torch
from transformers import DynamicCache, LogitsProcessorList, PreTrainedModel

from ..processors import process_positions
from ..stats import LevelStats
from .lookahead import ExpectedGainRule

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


def check_same_vocabulary(target: PreTrainedModel, drafter: PreTrainedModel, target_tokenizer=None, drafter_tokenizer=None) -> None:
    """Raise ``ValueError`` unless ``drafter`` shares ``target``'s vocabulary (padding aside)."""
    name = type(drafter).__name__
    if target_tokenizer is not None and drafter_tokenizer is not None:
        if target_tokenizer.get_vocab() != drafter_tokenizer.get_vocab():
            raise ValueError(f"Drafter {name} uses a different tokenizer than the target; hf_cascade drafters must share the target's vocabulary.")
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
        self.cached = torch.empty(0, dtype=torch.long)  # tokens whose K/V are in ``cache``
        self.last_forward_seconds = 0.0
        self.last_forward_tokens = 0
        # hf_cascade's own drafters predict over a reduced vocabulary and can return those logits only
        self._reduced = getattr(model.config, "draft_vocab_size", None) is not None and hasattr(model, "vocab_subset")

    # -- scoring -----------------------------------------------------------------------------
    @torch.no_grad()
    def scores(self, seq: torch.Tensor, start: int) -> torch.Tensor:
        """Processed scores ``[L - start + 1, V]`` of the positions predicting ``seq[start:]`` and
        the token after ``seq`` (``seq``: ``[L]`` on CPU or the target's device, ``start >= 1``)."""
        logits = self._to_target_vocab(self._forward(seq, start).float())  # [1, needed, V]
        scores = process_positions(self.processors, seq[None].to(logits.device), logits, start)
        return scores[0]

    @torch.no_grad()
    def next_greedy(self, seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(token [1], q [1, N] over the drafter's reduced vocabulary)`` for the greedy token after
        ``seq``, without building a full-vocabulary row; ``None`` when that is not possible (a drafter
        without a reduced vocabulary, or logits processors, which act on full rows). The token and its
        probability equal ``scores``' argmax and softmax: outside the subset those rows are
        ``finfo.min``, whose exponential is 0."""
        if len(self.processors) or not self._reduced:
            return None
        reduced = self._forward(seq, seq.shape[0], full_vocab=False)[0, -1].float()   # [N]
        q = reduced.softmax(dim=-1)
        i = int(q.argmax())
        return self.model.vocab_subset[i:i + 1].to(seq.device), q[i]

    def _forward(self, seq: torch.Tensor, start: int, **kwargs) -> torch.Tensor:
        """Run the drafter on the tokens of ``seq`` its cache lacks; ``[1, L - start + 1, V_d]`` logits."""
        length = seq.shape[0]
        keep = min(_common_prefix(self.cached, seq), start - 1)
        self._rollback(keep)
        new = seq[keep:].to(self.device)[None]                              # [1, L - keep]
        needed = length - start + 1
        t0 = time.perf_counter()
        out = self.model(input_ids=new, past_key_values=self.cache, use_cache=True, logits_to_keep=needed, **kwargs)
        self.last_forward_seconds = time.perf_counter() - t0
        self.last_forward_tokens = new.shape[1]
        self.stats.forward_calls += 1
        self.cached = seq.clone()
        return out.logits[:, -needed:, :]

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        vd = logits.shape[-1]
        if vd > self.vocab_size:
            return logits[..., : self.vocab_size]
        if vd < self.vocab_size:
            pad = logits.new_full((*logits.shape[:-1], self.vocab_size - vd), -math.inf)
            return torch.cat([logits, pad], dim=-1)
        return logits

    def _rollback(self, length: int) -> None:
        """Drop cached K/V beyond ``length`` tokens (``Cache.crop`` with a negative count)."""
        extra = self.cache.get_seq_length() - length
        if extra > 0:
            self.cache.crop(-extra)
        self.cached = self.cached[:length]

    # -- autoregressive drafting (only when no smaller level exists) --------------------------
    def generate(self, seq: torch.Tensor, k: int, do_sample: bool, stop_ids: set[int], min_confidence: float = 0.0,
                 keep_unsure: bool = True, rule: ExpectedGainRule | None = None):
        """Draft ``k`` tokens autoregressively. Stops after a stop token; after a token drawn with
        probability ``< min_confidence`` when ``keep_unsure`` (transformers' rule); *before* a token
        whose probability is below a floor (``min_confidence`` when not ``keep_unsure``, and ``rule``'s
        ``floor()``), which is then dropped; without a forward when ``rule``'s floor exceeds 1.

        Dropping a drawn token by its probability changes the distribution the kept token came from:
        with floor ``t`` it is ``q`` restricted to ``{x: q(x) >= t}`` and renormalised, and that is the
        ``dists`` row returned, so speculative sampling stays exact. Returns ``(tokens [k'],
        token_probs [k'], dists [k', V] | None)``; ``token_probs`` are the unrestricted ``q(x)``.
        """
        tokens, probs, dists = [], [], []
        cur = seq
        for _ in range(k):
            rule_floor = rule.floor() if rule is not None else 0.0            # once per token: bins are scanned
            if rule_floor > 1.0:
                break                                                        # no token could pay: skip the forward
            fast = None if do_sample else self.next_greedy(cur)
            if fast is not None:
                q = None                                                     # greedy: no full row needed
                tok, q_tok = fast                                            # [1], []
            else:
                s = self.scores(cur, cur.shape[0])[-1]                       # [V]
                q = s.softmax(dim=-1)                                        # [V] the drafter's distribution
                tok = torch.multinomial(q, 1) if do_sample else s.argmax()[None]
                q_tok = q[tok]
            prob = float(q_tok)
            dist = q
            floor = max(0.0 if keep_unsure else min_confidence, rule_floor)
            if floor > 0.0:
                if not bool(q_tok >= floor):                                 # the same comparison as the mask
                    break                                                    # drop it: the draft ends here
                if do_sample:                                                # what a kept token was drawn from
                    kept = torch.where(q >= floor, q, torch.zeros_like(q))   # [V]
                    dist = kept / kept.sum()
            tokens.append(tok.to(seq.device))
            probs.append(prob)
            if do_sample:
                dists.append(dist)
            if rule is not None:
                rule.extend(rule.estimate(prob))
            cur = torch.cat([cur, tok.to(seq.device)])
            if int(tok) in stop_ids or prob < min_confidence:
                break
        if not tokens:
            return seq[:0], torch.ones(0), (torch.zeros(0, self.vocab_size) if do_sample else None)
        return (
            torch.cat(tokens),
            torch.tensor(probs),
            torch.stack(dists).to(seq.device) if do_sample else None,
        )


def _common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    diff = (a[:n] != b[:n].to(a.device)).nonzero()
    return int(diff[0]) if diff.numel() else n
