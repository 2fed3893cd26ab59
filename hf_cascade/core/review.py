"""Reviews between drafters (CS Drafting's vertical cascade): a stronger drafter reviews a weaker one's linear draft,
greedily (with lenience: a draft token is kept when its probability is within a factor of the reviewer's best) or
by exact speculative sampling (the output distribution of each emitted token kept, so the target's own review
above stays exact). Lenience is only used when a draft model reviews (CS Drafting §3.1); the target's acceptance is
:mod:`hf_cascade.core.accept`'s."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .categorical import categorical


# -- reviews ------------------------------------------------------------
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


def _lenience_vector(lenience: Lenience, k: int, device: torch.device) -> tuple[torch.Tensor, bool]:
    """``([k] lenience on device, whether any is > 1)``, checked where it was given (a float: on the host)."""
    out = torch.as_tensor(lenience, dtype=torch.float32).expand(k).clone() if k else torch.ones(0, device="cpu")
    values = out.tolist()
    if any(v < 1.0 for v in values):
        raise ValueError("lenience must be >= 1")
    return out.to(device), any(v > 1.0 for v in values)


def greedy_review(
    drafts: torch.Tensor,
    reviewer_logits: torch.Tensor,
    draft_token_probs: torch.Tensor | None = None,
    lenience: Lenience = 1.0,
) -> Review:
    """Greedy review of ``drafts`` (``[k]``) with processed reviewer logits ``[k + 1, V]``.

    ``draft_token_probs`` (``[k]``) is the probability the drafting level gave each of its tokens;
    it is only read where ``lenience > 1`` (a scalar, or ``[k]`` per position).

    The review runs on the reviewer's device (``reviewer_logits``'), the drafts and probabilities move
    there; the returned tensors live there too. One device read (the number accepted).
    """
    k = drafts.shape[0]
    device = reviewer_logits.device
    drafts = drafts.to(device)
    best = reviewer_logits.argmax(dim=-1)  # [k + 1]
    ok = drafts == best[:k]  # [k]
    lenience, lenient = _lenience_vector(lenience, k, device)
    if k > 0 and draft_token_probs is not None and lenient:
        p = reviewer_logits[:k].float().softmax(dim=-1)
        p_draft = p.gather(-1, drafts[:, None]).squeeze(-1)  # [k]
        q_draft = draft_token_probs.to(device)
        ok = ok | ((lenience > 1.0) & ((lenience * p_draft >= q_draft) | torch.isinf(lenience)))
    n = int(torch.cumprod(ok.int(), dim=0).sum()) if k else 0
    tokens = torch.cat([drafts[:n], best[n : n + 1]])
    probs = reviewer_logits[: n + 1].float().softmax(dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    return Review(n, tokens, probs=probs)


def output_distribution(
    q: torch.Tensor, p: torch.Tensor, lenience: Lenience = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
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

    Runs on the reviewer's device (``reviewer_probs``'); the returned tensors live there.
    """
    k = drafts.shape[0]
    device = reviewer_probs.device
    drafts = drafts.to(device)
    p, q = reviewer_probs[:k].float(), draft_dists.to(device).float()
    lenience, lenient = _lenience_vector(lenience, k, device)
    lossless = not lenient
    if k:
        accept, residual = output_distribution(q, p, lenience[:, None])
        a = accept.gather(-1, drafts[:, None]).squeeze(-1)  # [k]
        u = torch.rand(k, generator=generator, device=drafts.device)
        n = int(torch.cumprod((u <= a).int(), dim=0).sum())
    else:
        n = 0
    if n < k:
        beta = (q[n] * accept[n]).sum()
        out_n = q[n] * accept[n] + (1.0 - beta).clamp_min(0.0) * residual[n]
        nxt = categorical(residual[n], generator)[None]
        out_acc = q[:n] * accept[:n] + (1.0 - (q[:n] * accept[:n]).sum(-1, keepdim=True)).clamp_min(0) * residual[:n]
    else:
        out_n = reviewer_probs[k].float()
        nxt = categorical(out_n, generator)[None]
        out_acc = q * accept + (1.0 - (q * accept).sum(-1, keepdim=True)).clamp_min(0) * residual if k else q[:0]
    tokens = torch.cat([drafts[:n], nxt])
    dists = torch.cat([out_acc, out_n[None]], dim=0)  # [n + 1, V]
    if lossless:
        # Without lenience the output is exactly p: avoid carrying rounding error upward.
        dists = p[: n + 1] if n < k else torch.cat([p[:n], out_n[None]], dim=0)
    return Review(n, tokens, dists=dists)


def one_hot_dists(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[k] -> [k, V]`` point masses: the draft distribution of a deterministic drafter."""
    out = torch.zeros(tokens.shape[0], vocab_size, device=tokens.device)
    out[torch.arange(tokens.shape[0], device=tokens.device), tokens] = 1.0
    return out
