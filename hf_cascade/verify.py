"""Verification core: greedy acceptance and lossless speculative sampling, with lenience.

One review = a reviewer model scores ``k`` draft tokens in one forward and emits ``n + 1`` tokens:
the ``n`` accepted drafts and one token of its own (a correction after a rejection, or a bonus
token when all ``k`` drafts were accepted).

* Greedy: Leviathan et al. (2023) / CS Drafting §3.1: accept while the draft equals the reviewer's
  argmax. With lenience ``l > 1`` a draft is also accepted when ``l * p(x) >= q(x)`` (CS Drafting's
  greedy rule, with ``q(x)`` the probability the drafting level gave its own token).
* Sampling: Leviathan et al. Algorithm 1 (speculative sampling). Accept ``x ~ q`` with probability
  ``min(1, l * p(x) / q(x))``; on rejection sample from ``norm(max(0, p - q / l))``. With ``l = 1``
  this is lossless: every emitted token is distributed as ``p``.

Lenience is only ever used when a *draft* model reviews (CS Drafting §3.1); the target's review is
done by transformers' own loop, which never sees our lenience. Because the cascade hands its drafts
upward, :func:`sampling_review` also returns ``out``: the exact distribution each emitted token was
drawn from (``q * accept + (1 - beta) * residual``, or ``p`` for the bonus token). That is the ``q``
the next reviewer (ultimately the target) must use, which keeps the whole cascade lossless at the
target even when lenience > 1 between drafters.

All functions take batch size 1 without the batch dimension. Shapes: ``k`` drafts, vocabulary ``V``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Review:
    """The result of one review.

    Attributes:
        num_accepted: ``n``, how many leading drafts were accepted.
        tokens: ``[n + 1]`` emitted tokens (accepted drafts, then the reviewer's own token).
        probs: greedy only: ``[n + 1]`` the reviewer's probability of each emitted token (what a
            lenient reviewer above compares against); ``None`` under sampling.
        dists: sampling only: ``[n + 1, V]`` the exact distribution each emitted token was drawn
            from; ``None`` under greedy.
    """

    num_accepted: int
    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    dists: torch.Tensor | None = None


Lenience = float | torch.Tensor  # a scalar, or one value per draft position ([k])


def _lenience_vector(lenience: Lenience, k: int, device: torch.device) -> torch.Tensor:
    out = torch.as_tensor(lenience, dtype=torch.float32, device=device).expand(k).clone() if k else torch.ones(0)
    if (out < 1.0).any():
        raise ValueError("lenience must be >= 1")
    return out


def greedy_review(
    drafts: torch.Tensor,
    reviewer_logits: torch.Tensor,
    draft_token_probs: torch.Tensor | None = None,
    lenience: Lenience = 1.0,
) -> Review:
    """Greedy review of ``drafts`` (``[k]``) with processed reviewer logits ``[k + 1, V]``.

    ``draft_token_probs`` (``[k]``) is the probability the drafting level gave each of its tokens;
    it is only read where ``lenience > 1`` (a scalar, or ``[k]`` per position).
    """
    k = drafts.shape[0]
    best = reviewer_logits.argmax(dim=-1)                                  # [k + 1]
    ok = drafts == best[:k]                                                # [k]
    lenience = _lenience_vector(lenience, k, drafts.device)
    if k > 0 and draft_token_probs is not None and bool((lenience > 1.0).any()):
        p = reviewer_logits[:k].float().softmax(dim=-1)
        p_draft = p.gather(-1, drafts[:, None]).squeeze(-1)                # [k]
        ok = ok | ((lenience > 1.0) & ((lenience * p_draft >= draft_token_probs) | torch.isinf(lenience)))
    n = int(torch.cumprod(ok.int(), dim=0).sum()) if k else 0
    tokens = torch.cat([drafts[:n], best[n : n + 1]])
    probs = reviewer_logits[: n + 1].float().softmax(dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    return Review(n, tokens, probs=probs)


def output_distribution(q: torch.Tensor, p: torch.Tensor, lenience: Lenience = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Acceptance probabilities and residual of lenient speculative sampling, row-wise.

    Args:
        q: ``[k, V]`` draft distributions; p: ``[k, V]`` reviewer distributions;
        lenience: a scalar or ``[k, 1]``.
    Returns:
        ``accept [k, V]`` = ``min(1, l p / q)`` (1 where ``q = 0``) and ``residual [k, V]`` =
        ``norm(max(0, p - q / l))`` (``p`` where that has no mass).
    """
    lt = torch.as_tensor(lenience, dtype=p.dtype, device=p.device)
    # infinite lenience accepts every draft token (also where the reviewer gives it p = 0)
    accept = torch.where((q > 0) & ~torch.isinf(lt), (lt * p / q.clamp_min(1e-30)).clamp(max=1.0), torch.ones_like(q))
    residual = (p - q / lenience).clamp_min(0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    residual = torch.where(mass > 1e-12, residual / mass.clamp_min(1e-30), p)
    return accept, residual


def sampling_review(
    drafts: torch.Tensor,
    draft_dists: torch.Tensor,
    reviewer_probs: torch.Tensor,
    lenience: Lenience = 1.0,
    generator: torch.Generator | None = None,
) -> Review:
    """Speculative sampling (Leviathan et al., Algorithm 1) with optional lenience.

    Args:
        drafts: ``[k]`` draft tokens, ``drafts[i] ~ draft_dists[i]``.
        draft_dists: ``[k, V]`` the processed distributions the drafts were drawn from.
        reviewer_probs: ``[k + 1, V]`` the reviewer's processed distributions.
    """
    k = drafts.shape[0]
    p, q = reviewer_probs[:k].float(), draft_dists.float()
    lenience = _lenience_vector(lenience, k, drafts.device)
    lossless = not bool((lenience > 1.0).any())
    if k:
        accept, residual = output_distribution(q, p, lenience[:, None])
        a = accept.gather(-1, drafts[:, None]).squeeze(-1)                 # [k]
        u = torch.rand(k, generator=generator, device=drafts.device)
        n = int(torch.cumprod((u <= a).int(), dim=0).sum())
    else:
        n = 0
    if n < k:
        beta = (q[n] * accept[n]).sum()
        out_n = q[n] * accept[n] + (1.0 - beta).clamp_min(0.0) * residual[n]
        nxt = torch.multinomial(residual[n], 1, generator=generator)
        out_acc = q[:n] * accept[:n] + (1.0 - (q[:n] * accept[:n]).sum(-1, keepdim=True)).clamp_min(0) * residual[:n]
    else:
        out_n = reviewer_probs[k].float()
        nxt = torch.multinomial(out_n, 1, generator=generator)
        out_acc = (
            q * accept + (1.0 - (q * accept).sum(-1, keepdim=True)).clamp_min(0) * residual if k else q[:0]
        )
    tokens = torch.cat([drafts[:n], nxt])
    dists = torch.cat([out_acc, out_n[None]], dim=0)                      # [n + 1, V]
    if lossless:
        # Without lenience the output is exactly p: avoid carrying rounding error upward.
        dists = p[: n + 1] if n < k else torch.cat([p[:n], out_n[None]], dim=0)
    return Review(n, tokens, dists=dists)


def one_hot_dists(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[k] -> [k, V]`` point masses: the draft distribution of a deterministic drafter."""
    out = torch.zeros(tokens.shape[0], vocab_size, device=tokens.device)
    out[torch.arange(tokens.shape[0]), tokens] = 1.0
    return out
