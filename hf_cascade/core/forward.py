"""One target forward over a token tree, and the KV-cache bookkeeping after acceptance.

:func:`verify_tree` scores ``[last_token, tree tokens]`` in one forward: the last verified token
(the root: its K/V are not cached yet) and the ``n`` nodes, with explicit position ids (each node at
its branch position) and an explicit tree mask. :func:`keep_path` then keeps only the accepted
branch's K/V, through the ``Cache`` API: ``crop`` back to the prefix plus the root, then ``update``
with the gathered K/V of the path nodes. Their keys were computed at their branch positions (RoPE
included) and from their ancestors only, so the cache equals that of a plain forward over the path.

How the mask reaches the model (checked with transformers 4.57 and 5.x, eager and sdpa):

* ``masking_utils.create_causal_mask`` / ``create_sliding_window_causal_mask`` return a 4D
  ``attention_mask`` unchanged; eager attention *adds* it to the scores and sdpa passes it as
  ``attn_mask``. So the mask is additive, ``[1, 1, q, kv]``, in the attention's compute dtype (that of the
  input embeddings, :func:`mask_device_dtype`). flash / paged / hub-kernel backends read a 4D mask as padding:
  :func:`check_attention_backend` refuses them for trees with branches (chains need no mask).
* Models with several layer types (Gemma2/3, hybrid Qwen, ...: ``config.layer_types``) accept a dict
  ``{layer_type: mask}`` as ``attention_mask`` and would otherwise apply one 4D tensor to every layer,
  dropping the sliding window. We pass the dict, windowing the ``"sliding_attention"`` masks.
* The cache must keep every position in every layer: a ``DynamicCache()`` built without a config.
  transformers' sliding-window layers (``DynamicCache(config=...)`` on Gemma3) keep only the last
  ``W - 1`` positions after a forward, so a tree longer than the window would evict prefix K/V that
  the accepted branch still needs. Such caches are refused with a clear error.
"""

from __future__ import annotations

import torch
from transformers import Cache, PreTrainedModel

from ..compat import cache_kwargs
from ..placement import HOST, target_device_dtype, upload
from .attention import row_inputs
from .structure import TokenTree


def _check_cache(cache: Cache) -> None:
    if not isinstance(cache, Cache):
        raise TypeError(f"expected a transformers Cache (DynamicCache), got {type(cache).__name__}")
    layers = getattr(cache, "layers", [])
    if getattr(cache, "_hf_cascade_checked", None) == len(layers):
        return  # checked already with these layers: no work per layer per step
    for i, layer in enumerate(layers):
        if getattr(layer, "is_sliding", False) or not hasattr(layer, "keys"):
            raise ValueError(
                f"cache layer {i} ({type(layer).__name__}) does not keep every position; tree verification "
                "needs a DynamicCache() built without a config (sliding windows are applied by the mask)."
            )
    try:
        cache._hf_cascade_checked = len(layers)
    except AttributeError:  # a cache that takes no attributes: checked every time
        pass


def mask_device_dtype(model: PreTrainedModel) -> tuple[torch.device, torch.dtype]:
    """Where and in which dtype the additive tree mask is built: the device and dtype of ``model``'s
    input embeddings, i.e. of the hidden states and queries the attention computes with (not
    ``model.dtype``, the first parameter's, which differs under mixed dtypes; under ``device_map``
    accelerate moves the mask to each layer's device with the other inputs). A float32 mask added to
    bf16 scores would promote them (eager) or be refused (sdpa)."""
    device, dtype = target_device_dtype(model)
    return device, dtype if dtype.is_floating_point else torch.float32


def _tree_inputs(
    model: PreTrainedModel,
    cache: Cache,
    prefix_len: int,
    tree: TokenTree,
    last_token,
    chain: bool = False,
    where: tuple[torch.device, torch.dtype] | None = None,
) -> dict:
    """:func:`~hf_cascade.core.attention.row_inputs` after a dense ``cache`` of ``prefix_len`` positions, checked."""
    _check_cache(cache)
    if cache.get_seq_length() != prefix_len:
        raise ValueError(f"the cache holds {cache.get_seq_length()} positions, expected prefix_len={prefix_len}")
    return dict(
        row_inputs(model, prefix_len, tree, last_token, where or mask_device_dtype(model), linear=chain),
        **cache_kwargs(model, cache),
    )


@torch.no_grad()
def verify_tree(
    model: PreTrainedModel,
    cache: Cache,
    prefix_len: int,
    tree: TokenTree,
    last_token: int | torch.Tensor,
    hidden_only: bool = False,
    chain: bool = False,
    where: tuple[torch.device, torch.dtype] | None = None,
    decoder: torch.nn.Module | None = None,
) -> torch.Tensor:
    """Score a token tree in one forward.

    Args:
        model: a decoder-only HF causal LM (batch size 1).
        cache: a ``DynamicCache()`` holding exactly the ``prefix_len`` verified tokens before
            ``last_token`` (positions ``0 .. prefix_len - 1``); it is extended in place by ``n + 1``
            entries (root, then the nodes in tree order).
        prefix_len: the cache length before the call.
        tree: the ``n``-node draft tree below ``last_token``.
        last_token: the last verified token (the root), at position ``prefix_len``.
        hidden_only: run ``model.get_decoder()`` only (same inputs, same cache update) and return
            the final hidden states, the output head's input; :func:`output_head` turns rows of
            them into logits (see :mod:`hf_cascade.core.rows`).
        chain: the caller knows ``tree`` is one path (node ``i``'s parent is ``i - 1``): no tree mask
            and no position ids are passed, so the model's own causal masking applies.
        where: ``model``'s :func:`mask_device_dtype`, when the caller keeps it (a loop asks once per call).
        decoder: ``model.get_decoder()`` (``hidden_only``), when the caller keeps it (a loop asks once per call).

    Returns:
        ``[n + 1, V]`` raw logits: row 0 predicts the token after the root, row ``i + 1`` the token
        after node ``i`` (the layout :func:`~hf_cascade.core.accept.greedy_tree_accept` and
        :func:`~hf_cascade.core.accept.sampling_tree_accept` take); ``[n + 1, H]`` hidden states
        with ``hidden_only``.
    """
    inputs = _tree_inputs(model, cache, prefix_len, tree, last_token, chain, where)
    if hidden_only:
        return (decoder if decoder is not None else model.get_decoder())(**inputs).last_hidden_state[0]
    return model(**inputs).logits[0]


# -- attention backends ------------------------------------------------------------------------------
#: Attention implementations that apply a custom 4D additive mask as given (transformers' eager adds it
#: to the scores, sdpa passes it as ``attn_mask``). flash_attention_2/3, paged and hub kernels
#: ("kernels-community/...") read a 4D mask as padding, or ignore it; flex_attention turns it into a
#: score_mod whose reads past the mask's padded blocks are unchecked (a CPU run aborted): refused too.
TREE_ATTENTION = ("eager", "sdpa")


def attention_backend(model: PreTrainedModel) -> str | None:
    """``model``'s attention implementation (``config._attn_implementation``; its text config's when that
    differs), ``None`` when unset (transformers then picks eager or sdpa)."""
    config = getattr(model, "config", None)
    impls = []
    for c in (config, config.get_text_config() if hasattr(config, "get_text_config") else None):
        impl = getattr(c, "_attn_implementation", None) if c is not None else None
        if isinstance(impl, str) and impl and impl not in impls:
            impls.append(impl)
    bad = [i for i in impls if i not in TREE_ATTENTION]
    return bad[0] if bad else (impls[0] if impls else None)


def verifies_trees(model: PreTrainedModel) -> bool:
    """Whether ``model``'s attention backend applies our 4D tree mask (:data:`TREE_ATTENTION`, or unset), so it
    can verify trees with branches; otherwise it verifies chains only (plain causal attention)."""
    impl = attention_backend(model)
    return impl is None or impl in TREE_ATTENTION


def check_attention_backend(model: PreTrainedModel, tree_shaped: bool) -> None:
    """``ValueError`` before the first forward when ``model``'s attention backend cannot verify what will be
    sent: a tree with branches (``tree_shaped``) needs a backend that applies our 4D mask
    (:func:`verifies_trees`); a chain (``tree_shaped=False``, verified with plain causal attention) runs on
    every backend."""
    if not tree_shaped or verifies_trees(model):
        return
    impl = attention_backend(model)
    raise ValueError(
        f"tree assistants need eager or sdpa attention to verify trees with branches, but the target runs "
        f"attn_implementation={impl!r}, which does not apply a custom 4D tree mask (flash / paged / hub kernels "
        "read it as padding; flex_attention is not supported). Set attn_implementation='sdpa' (or 'eager') when "
        "loading the target, or call target.set_attn_implementation('sdpa'); or draft chains only "
        "(e.g. GlideAssistant(head, settings=GlideSettings.chain()), "
        "ReDrafterAssistant(head, settings=ReDrafterSettings(beam_width=1)), MaxGramTreeAssistant(branches=1); "
        "Token Recycling drafts trees only: CascadeAssistant([MaxGram()]) is its chain-drafting lookup)."
    )


def logit_cap(model: torch.nn.Module) -> float | None:
    """Gemma-2/3's ``final_logit_softcapping`` when ``model``'s config sets it, else ``None``."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    return getattr(config.get_text_config(), "final_logit_softcapping", None) or None


def logit_transform(model: torch.nn.Module):
    """What ``model``'s forward applies to its head's output: Gemma-2/3's ``final_logit_softcapping``
    when set, else nothing (other transforms are caught by the check against the model's own logits at prefill)."""
    cap = logit_cap(model)
    if not cap:
        return lambda logits: logits
    return lambda logits: torch.tanh(logits / cap) * cap


def output_head(model: PreTrainedModel):
    """The function ``[k, H] -> [k, V]`` from final hidden states to the raw logits ``model`` returns:
    its output embeddings, then Gemma-2/3's ``final_logit_softcapping`` when the config sets it.
    ``None`` when the model has no output-embedding module or no decoder to run without it. Other
    post-head transforms are not reproduced: :func:`~hf_cascade.core.loop.speculative_decode` checks this
    function against the model's own logits on the prompt and falls back to full logits if they differ."""
    get_head, get_decoder = getattr(model, "get_output_embeddings", None), getattr(model, "get_decoder", None)
    head = get_head() if get_head is not None else None
    decoder = get_decoder() if get_decoder is not None else None
    if not isinstance(head, torch.nn.Module) or not isinstance(decoder, torch.nn.Module) or decoder is model:
        return None
    transform = logit_transform(model)

    def logits(hidden: torch.Tensor) -> torch.Tensor:
        return transform(head(hidden))

    return logits


def keep_path(cache: Cache, prefix_len: int, path_nodes: torch.Tensor, total: int | None = None) -> None:
    """Keep the prefix, the root and the accepted ``path_nodes`` (``[m]`` node indices of the tree
    given to :func:`verify_tree`, root -> leaf), in place. Afterwards the cache holds
    ``prefix_len + 1 + m`` positions, the K/V of ``prefix + [root] + tree.tokens[path_nodes]``."""
    _check_cache(cache)
    # the path as host ints (acceptance returns it on the host: no read); each cache layer gathers on its
    # own device (under device_map the layers live on several)
    nodes = [int(i) for i in (path_nodes.tolist() if isinstance(path_nodes, torch.Tensor) else path_nodes)]
    keep = prefix_len + 1
    m = len(nodes)
    total = cache.get_seq_length() if total is None else total  # the caller's count, when it keeps one
    if m and keep + max(nodes) >= total:
        raise ValueError(f"path node {max(nodes)} is beyond the cache ({total} positions, prefix_len={prefix_len})")
    gathered = []
    if nodes == list(range(m)):
        keep += m  # the first branch is already in place: crop only
    else:
        # the columns to keep, sent once per device the layers live on (one copy per step, not one per layer)
        index = torch.tensor([prefix_len + 1 + i for i in nodes], dtype=torch.long, device=HOST)
        on: dict[torch.device, torch.Tensor] = {}
        for layer in cache.layers:
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                gathered.append(None)
                continue
            device = layer.keys.device
            idx = on.get(device)
            if idx is None:
                idx = on[device] = upload(index, device)
            gathered.append((layer.keys.index_select(-2, idx), layer.values.index_select(-2, idx)))
    extra = total - keep
    if extra > 0:
        cache.crop(-extra)  # negative: remove ``extra`` positions (4.57 and 5.x)
    for layer_idx, kv in enumerate(gathered):
        if kv is not None:
            cache.update(kv[0], kv[1], layer_idx)
