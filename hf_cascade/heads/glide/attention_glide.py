"""Attention building blocks of the hf_cascade GLIDE draft model (Du et al., ICML 2024, "GLIDE with a CAPE",
Section 4.1): the cross-attention masks, RMSNorm, the gated MLP, the draft's causal self-attention and the
cross-attention over one target layer's cached K/V, and how a tensor reaches a module's weight (device, dtype).
Split from ``modeling_glide.py``; remote-code ready (imports only torch, transformers and its sibling configuration
file, and is copied next to ``modeling_glide.py`` by ``save_pretrained`` as a relative import)."""

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from .configuration_glide import GlideConfig


def rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A rotary embedding's ``cos``/``sin`` ``[B, T, d]`` as :func:`_apply_rope` reads them, made once per forward:
    ``[B, 1, T, d]`` each, ``sin``'s first half negated. Then ``rotate_half(x) * sin``, whose first half is
    ``-x2 * sin1`` and second ``x1 * sin2``, is ``roll(x, d / 2) * sin`` with the sign moved onto ``sin`` (the same
    products, exactly)."""
    half = sin.shape[-1] // 2
    return cos[:, None], torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)[:, None]


def _apply_rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """``x`` ``[B, heads, T, d]`` rotated: ``x * cos + rotate_half(x) * sin`` (``rope``: :func:`rope_tables`)."""
    cos, sin = rope
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


def _rotary(rope: dict, head_dim: int, max_position_embeddings: int) -> LlamaRotaryEmbedding:
    """transformers' Llama rotary embedding for ``rope`` (``{"rope_type", "rope_theta", ...}``) and ``head_dim``
    (every rope type transformers knows; its buffers are re-derived by ``_init_weights`` on meta loads)."""
    params = dict(rope)
    theta = float(params.pop("rope_theta"))
    params.pop("type", None)
    scaling = None if params.get("rope_type", "default") == "default" else params
    config = LlamaConfig(
        hidden_size=head_dim,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=head_dim,
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=max_position_embeddings,
    )
    return LlamaRotaryEmbedding(config)


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    scale: float,
    empty_rows: bool = True,
) -> torch.Tensor:
    """Softmax attention (float32 softmax). ``q`` ``[B, h, T, d]``, ``k``/``v`` ``[B, h, S, d]``, ``allowed``
    bool broadcastable to ``[B, h, T, S]`` (``None``: every key, the same result as an all-True mask). Rows
    with no allowed key return zeros; ``empty_rows=False`` says that no row is empty (every query sees a key, as
    in causal self-attention), and the zeroing, a product by one on every row, is left out."""
    scores = _as(torch.matmul(q, k.transpose(-1, -2)), torch.float32) * _scalar(scale, q)  # [B, h, T, S]
    if allowed is None:
        return torch.matmul(_as(scores.softmax(dim=-1), v.dtype), v)  # [B, h, T, d]
    probs = scores.masked_fill(~allowed, torch.finfo(torch.float32).min).softmax(dim=-1)
    if empty_rows:
        probs = probs * allowed.any(dim=-1, keepdim=True)  # empty rows -> 0
    return torch.matmul(_as(probs, v.dtype), v)  # [B, h, T, d]


def _scalar(value: float, like: torch.Tensor) -> torch.Tensor | float:
    """``value`` for a float32 tensor op with a tensor on ``like``'s device: a 0-dim float32 tensor there, made once
    per value, device and inference mode (a Python number is converted to a float32 tensor at every op; the op then
    computes the same float32 values). ``value`` itself while compiling (a constant to the graph)."""
    if torch.compiler.is_compiling():
        return value
    key = (value, like.device, torch.is_inference_mode_enabled())
    made = _SCALARS.get(key)
    if made is None:
        if len(_SCALARS) >= 64:
            _SCALARS.clear()
        made = _SCALARS[key] = torch.tensor(value, dtype=torch.float32, device=like.device)
    return made


_SCALARS: dict[tuple, torch.Tensor] = {}  # (value, device, inference mode) -> _scalar's tensor


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x.to(dtype)`` without the call when it is in ``dtype`` already (a call per op counts in a tiny draft)."""
    return x if x.dtype == dtype else x.to(dtype)


def _device_of(module: nn.Module, default: torch.Tensor) -> torch.device:
    """Where ``module`` takes its input: its weight's device (``default``'s when offloaded: accelerate's hook
    moves the input)."""
    w = getattr(module, "weight", None)
    return w.device if isinstance(w, torch.Tensor) and w.device.type != "meta" else default.device


def _like_weight(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """``x`` on ``module``'s weight device and in its dtype (a target's shared LM head; unchanged when they agree)."""
    w = getattr(module, "weight", None)
    if not isinstance(w, torch.Tensor):
        return x
    if w.device.type == "meta":
        return _as_weight(x, None, w.dtype)
    return _as_weight(x, w.device, w.dtype)


def _as_weight(x: torch.Tensor, device: torch.device | None, dtype: torch.dtype) -> torch.Tensor:
    """``x`` on ``device`` (``None``: where it is) in ``dtype``; ``x`` itself, without a call, when it is already
    (a call per op counts in a tiny draft's forward)."""
    if x.dtype == dtype and (device is None or x.device == device):
        return x
    return x.to(dtype=dtype) if device is None else x.to(device=device, dtype=dtype)


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``[B, kv_heads, S, d]`` -> ``[B, kv_heads * n_rep, S, d]`` (each kv head serves ``n_rep`` query heads)."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def glide_cross_mask(q_len: int, kv_len: int, block: int = 5, first_block: str = "none") -> torch.Tensor:
    """The block-wise cross-attention mask of GLIDE training (Du et al. 2024, Section 4.1), ``[q_len, kv_len]``
    bool, True = may attend: query position ``j`` sees target position ``k`` iff ``k // block < j // block``
    (``Mask_Block(A_jk) = A_jk if block(j) > block(k) else -inf``), i.e. only target positions before the start
    of its own block.

    The first block sees nothing (``first_block="none"``, the paper's definition; the model then adds a zero
    cross-attention output there). ``first_block="causal"`` instead lets block 0 see ``k <= j``, as the
    authors' training code does to keep every softmax row non-empty."""
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}.")
    if first_block not in ("none", "causal"):
        raise ValueError(f"first_block must be 'none' or 'causal', got {first_block!r}.")
    j = torch.arange(q_len)[:, None]  # [T, 1] query positions
    k = torch.arange(kv_len)[None, :]  # [1, S] target positions
    mask = (k // block) < (j // block)  # [T, S]
    if first_block == "causal":
        mask = mask | ((j < block) & (k <= j))
    return mask


def cross_allowed(mask, s, cache_position, attention_mask, b, t, first=None) -> torch.Tensor | None:
    """Boolean ``[B|1, 1|h, T, S]`` cross-attention mask (see ``GlideForCausalLM.forward``); ``None`` when every
    query sees every entry (no mask given, and the first query's index ``first``, a host count, is at least ``S``)."""
    device = cache_position.device
    if mask is None and attention_mask is None and first is not None and first >= s:
        return None
    if mask is None:
        allowed = (torch.arange(s, device=device)[None, :] < cache_position[:, None])[None, None]  # [1, 1, T, S]
    else:
        allowed = mask.to(device=device, dtype=torch.bool)
        if allowed.dim() not in (2, 3, 4):
            raise ValueError(f"cross_attention_mask must be 2-, 3- or 4-dimensional, got {tuple(allowed.shape)}.")
        allowed = allowed[None, None] if allowed.dim() == 2 else allowed[:, None] if allowed.dim() == 3 else allowed
        if allowed.shape[-2:] != (t, s):
            raise ValueError(f"cross_attention_mask ends in {tuple(allowed.shape[-2:])}, expected {(t, s)}.")
    if attention_mask is not None and attention_mask.shape[-1] >= s:
        allowed = allowed & attention_mask[:, :s].bool().to(device)[:, None, None, :]
    return allowed


class GlideRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = _as(x, torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _scalar(self.variance_epsilon, x))
        return self.weight * _as(x, dtype)


class GlideMLP(nn.Module):
    def __init__(self, config: GlideConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class GlideSelfAttention(nn.Module):
    """Causal grouped-query self-attention with the draft's own rotary embedding and DynamicCache."""

    def __init__(self, config: GlideConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)

    def forward(self, x, rope, allowed, cache=None):
        """``rope``: :func:`rope_tables` at the queries' positions."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # [B, h_D, T, d_D]
        k = self.k_proj(x).view(b, t, self.num_kv, self.head_dim).transpose(1, 2)  # [B, kv_D, T, d_D]
        v = self.v_proj(x).view(b, t, self.num_kv, self.head_dim).transpose(1, 2)
        q, k = _apply_rope(q, rope), _apply_rope(k, rope)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # [B, kv_D, P + T, d_D]
        n_rep = self.num_heads // self.num_kv
        # every query sees its own key (a padded one: itself only), so no row is empty
        out = _attend(q, _repeat_kv(k, n_rep), _repeat_kv(v, n_rep), allowed, self.head_dim**-0.5, False)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))  # [B, T, H]


class GlideCrossAttention(nn.Module):
    """Cross-attention from the draft's hidden states to one target layer's cached K/V (Section 4.1):
    ``q_proj`` ``[H -> h * d_k]`` (the ``h`` per-head ``W_j``), ``o_proj`` ``[h * d_k -> H]`` (``W^O``)."""

    def __init__(self, config: GlideConfig, layer_idx: int):
        super().__init__()
        self.num_heads, self.head_dim = config.target_num_attention_heads, config.target_head_dim
        self.scale = config.cross_attention_scale if config.cross_attention_scale is not None else self.head_dim**-0.5
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        rope = config.cross_rope[layer_idx] if config.cross_rope is not None else config.self_rope()
        self.rotary_emb = _rotary(rope, self.head_dim, config.max_position_embeddings)
        # the same rotary settings and head size as the self-attention's: its cos / sin serve here too
        self.self_rope = rope == config.self_rope() and self.head_dim == config.head_dim

    def forward(self, x, position_ids, key, value, allowed, rope=None):
        """``x`` ``[B, T, H]``; ``key``/``value`` ``[B, kv_T, S, d_k]`` (target cache, post-rotary; or as
        :meth:`read_target` returns them); ``allowed`` bool ``[B|1, 1|h, T, S]`` (``None``: every entry);
        ``rope``: the self-attention's :func:`rope_tables` at ``position_ids`` when :attr:`self_rope` (the same
        values this layer's rotary embedding gives), else ``None``."""
        b, t, _ = x.shape
        if key.shape[-1] != self.head_dim or self.num_heads % key.shape[1]:
            raise ValueError(
                f"target K/V of shape {tuple(key.shape)} do not fit the cross-attention "
                f"({self.num_heads} query heads of size {self.head_dim})."
            )
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # [B, h, T, d_k]
        if rope is None or rope[0].dtype != q.dtype:
            rope = rope_tables(*self.rotary_emb(q, position_ids))  # [B, 1, T, d_k] each
        q = _apply_rope(q, rope)
        key, value = self.read_target(key, value, q.device, q.dtype)  # [B, h, S, d_k]
        out = _attend(q, key, value, allowed, self.scale)  # [B, h, T, d_k]
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))  # [B, T, H]

    def read_target(self, key: torch.Tensor, value: torch.Tensor, device=None, dtype=None):
        """The target's cached ``key``/``value`` ``[B, kv_T, S, d_k]`` as the attention reads them: on ``device``
        in ``dtype`` (default: the query projection's), repeated to the ``h`` query heads. The target's cache
        layer may live on another device (device_map) or dtype: it is read where it is and moved here (no copy
        when the GLIDE was placed like the target). Idempotent: pairs it returned come back unchanged."""
        w = self.q_proj.weight
        device = device if device is not None else w.device
        dtype = dtype if dtype is not None else w.dtype
        n_rep = self.num_heads // key.shape[1]
        if n_rep == 1 and key.device == value.device == device and key.dtype == value.dtype == dtype:
            return key, value  # read as they are already
        return _repeat_kv(_as_weight(key, device, dtype), n_rep), _repeat_kv(_as_weight(value, device, dtype), n_rep)
