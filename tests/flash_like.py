"""A flash-attention-2 stand-in for the CPU: what ``flash_attention_2`` computes, registered under another name.

transformers (5.x) hands flash attention (``integrations/flash_attention.py``, ``modeling_flash_attention_utils.py``):

* the mask of ``masking_utils.flash_attention_mask``: ``None`` when every column is a real token and the key length is
  the 2-D mask's, else the 2-D padding mask ``[B, T]`` (a 4-D mask is passed through unchanged and never read as one);
* keys and values of the layer's cache as they are: a static layer's whole capacity. Only with a 2-D mask does
  ``_upad_input`` slice them to the mask's ``T`` columns and drop its padded columns (varlen); padded queries are read
  from the mask's last ``q_len`` columns (left padding), except for one query, never padding;
* causal attention **bottom-right aligned** (flash-attn >= 2.1): over a row's ``k`` kept keys and ``q`` kept queries,
  the ``j``-th query sees the first ``k - q + j + 1`` keys; a sliding window ``W`` (when the key length exceeds it)
  keeps the last ``W`` of those; padded queries' outputs are zeros.

:func:`flash_like_attention` computes exactly that in float32 with plain tensor ops, and :func:`flash_like` registers
it (and transformers' own flash mask function) as :data:`NAME`. A name hf_cascade does not know is a backend that
does not apply its 4-D tree mask (``hf_cascade.core.forward.verifies_trees``), as ``flash_attention_2`` is.
"""

from __future__ import annotations

import contextlib

import torch

NAME = "flash_like"


def flash_like_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling=None,
    sliding_window=None,
    softcap=None,
    is_causal=None,
    **kwargs,
):
    """Flash-attention-2's output for transformers' inputs (``query`` ``[B, H, q, D]``, ``key``/``value``
    ``[B, Hkv, K, D]``); returns ``([B, q, H, D], None)`` as transformers' attention functions do."""
    is_causal = module.is_causal if is_causal is None else is_causal
    B, H, q, D = query.shape
    key_length = key.shape[2]  # what flash's window rule compares (before any slicing)
    mask = attention_mask if attention_mask is not None and attention_mask.ndim == 2 else None  # 4-D: not read
    if mask is not None and key.shape[2] > mask.shape[-1]:  # _upad_input: a static layer's capacity
        key, value = key[:, :, : mask.shape[-1]], value[:, :, : mask.shape[-1]]
    K = key.shape[2]
    keys = torch.ones(B, K, dtype=torch.bool, device=query.device) if mask is None else mask.bool()
    if mask is None or q == 1:
        queries = torch.ones(B, q, dtype=torch.bool, device=query.device)
    else:
        queries = keys if q == K else keys[:, -q:]
    key_rank = keys.long().cumsum(-1) - 1  # rank among the row's kept keys
    query_rank = queries.long().cumsum(-1) - 1
    diagonal = keys.sum(-1, keepdim=True) - queries.sum(-1, keepdim=True) + query_rank  # [B, q]: bottom-right
    allowed = keys[:, None, :] & queries[:, :, None]
    if is_causal:
        allowed &= key_rank[:, None, :] <= diagonal[:, :, None]
        if sliding_window is not None and key_length > sliding_window:
            allowed &= key_rank[:, None, :] >= diagonal[:, :, None] - (sliding_window - 1)
    groups = H // key.shape[1]
    k = key.float().repeat_interleave(groups, dim=1)
    v = value.float().repeat_interleave(groups, dim=1)
    scores = query.float() @ k.transpose(-1, -2) * (D**-0.5 if scaling is None else scaling)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a query with no key: zeros, as flash pads
    out = (weights @ v).masked_fill(~queries[:, None, :, None], 0.0)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def register() -> None:
    """Register :data:`NAME` with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(NAME, flash_like_attention)
    AttentionMaskInterface.register(NAME, flash_attention_mask)


@contextlib.contextmanager
def flash_like(model):
    """``model`` running :data:`NAME` inside the block (its attention implementation restored after)."""
    register()
    config = model.config
    configs = [c for c in {id(c): c for c in (config, config.get_text_config())}.values()]
    before = [c._attn_implementation for c in configs]
    for c in configs:
        c._attn_implementation = NAME
    try:
        yield model
    finally:
        for c, impl in zip(configs, before):
            c._attn_implementation = impl
