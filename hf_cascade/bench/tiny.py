"""Tiny random models built in-process: the target of ``hf-cascade bench --overhead`` and of the test suite.

Nothing here downloads anything; every builder fixes its seed, so the models are the same in every process:

* :func:`llama` (a tiny Llama-style causal LM) and :func:`llama_target` (the standard one: vocabulary 96, 2 layers,
  hidden 32, blocks that write little into the residual stream, so greedy outputs fall into cycles that drafters
  predict and that break now and then);
* drafters for it: :func:`copy_model` (an exact copy, every greedy draft accepted), :func:`truncated_copy` (its
  first layers only); :func:`echo_glide` (a GLIDE head sharing its embeddings and head), :func:`fit_head` (a
  ReDrafter head distilled from its greedy continuations in a few seconds, cached per process);
* :func:`sharpen` scales an output head; :func:`ids` makes a ``[1, L]`` prompt.

``tests/tiny_models.py`` re-exports these (and adds the builders only the tests use): one implementation.
"""

from __future__ import annotations

import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 96
BOS, EOS, PAD = 1, 2, 0


def _finish(model):
    model.eval()
    model.requires_grad_(False)
    gc = model.generation_config
    gc.pad_token_id = PAD
    gc.eos_token_id = EOS
    gc.bos_token_id = BOS
    return model


def llama(
    vocab_size: int = VOCAB,
    layers: int = 2,
    hidden: int = 32,
    seed: int = 0,
    head_scale: float = 1.0,
    block_scale: float = 1.0,
    eos_token_id: int = EOS,
) -> LlamaForCausalLM:
    """A tiny Llama-style causal LM (random weights, fixed ``seed``)."""
    torch.manual_seed(seed)
    config = LlamaConfig(**_common_config(vocab_size, layers, hidden, eos_token_id))
    model = _build(LlamaForCausalLM, config, head_scale, block_scale)
    model.generation_config.eos_token_id = eos_token_id
    return model


def _common_config(vocab_size: int, layers: int, hidden: int, eos_token_id: int) -> dict:
    return dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=BOS,
        eos_token_id=eos_token_id,
        pad_token_id=PAD,
        tie_word_embeddings=False,
        initializer_range=0.5,
    )


def _build(cls, config, head_scale: float, block_scale: float):
    model = cls(config)
    _scale_blocks(model, block_scale)
    if head_scale != 1.0:
        sharpen(model, head_scale)
    return _finish(model)


def _scale_blocks(model, scale: float) -> None:
    """Scale what every decoder block writes into the residual stream (attention ``o_proj`` and MLP
    ``down_proj``). ``scale < 1`` makes the next token depend mostly on the last token, so greedy
    outputs fall into short cycles that Max-Gram predicts, while the context still matters a bit."""
    if scale != 1.0:
        with torch.no_grad():
            for layer in model.model.layers:
                if hasattr(layer, "post_feedforward_layernorm"):  # Gemma3: (1 + w) post-norms
                    for norm in (layer.post_attention_layernorm, layer.post_feedforward_layernorm):
                        norm.weight.copy_((1.0 + norm.weight) * scale - 1.0)
                else:
                    layer.self_attn.o_proj.weight.mul_(scale)
                    layer.mlp.down_proj.weight.mul_(scale)


def sharpen(model, scale: float):
    """Multiply the output head by ``scale`` (> 1: peakier, < 1: flatter distributions).

    Gemma3 ties its head to the input embeddings, so its final norm is scaled instead."""
    with torch.no_grad():
        if model.config.get_text_config().tie_word_embeddings:
            # Gemma3's RMSNorm multiplies by (1 + weight): make (1 + weight) ``scale`` times larger.
            w = model.model.norm.weight
            w.copy_((1.0 + w) * scale - 1.0)
        else:
            model.lm_head.weight.mul_(scale)
    return model


def copy_model(model):
    """An exact copy (a drafter whose greedy drafts the target always accepts)."""
    return _finish(copy.deepcopy(model))


def truncated_copy(model, layers: int = 1):
    """The target with only its first ``layers`` decoder layers (shares no tensors with it)."""
    out = copy.deepcopy(model)
    out.model.layers = out.model.layers[:layers]
    out.config.num_hidden_layers = layers
    if getattr(out.config, "layer_types", None) is not None:
        out.config.layer_types = out.config.layer_types[:layers]
    return _finish(out)


def ids(*tokens: int) -> torch.Tensor:
    """A ``[1, L]`` prompt."""
    return torch.tensor([list(tokens)], dtype=torch.long)


def llama_target():
    """The standard tiny target: :func:`llama` with seed 0 and blocks scaled by 0.005 (greedy outputs fall into
    cycles that break now and then: Max-Gram drafts get both accepted and rejected)."""
    return llama(seed=0, block_scale=0.005)


# -- draft heads for a tiny target -----------------------------------------------------------------------


def echo_glide(target, cross: float = 0.3, layers: int = 1, seed: int = 0):
    """A GLIDE sharing the target's embeddings and head whose self-attention and MLP write nothing: it
    predicts ``head(norm(embed(x) + cross-attention))``, close to the tiny targets (whose blocks write
    little), so drafts are often but not always accepted; ``cross`` scales the glimpse's output."""
    from ..heads import GlideConfig, GlideForCausalLM

    torch.manual_seed(seed)
    g = GlideForCausalLM(
        GlideConfig.from_target(
            target,
            share_target_embeddings=True,
            num_hidden_layers=layers,
            intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            initializer_range=0.3,
        )
    ).eval()
    with torch.no_grad():
        for layer in g.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
            layer.cross_attn.o_proj.weight.mul_(cross)
    return g.tie_to_target(target)


_HEADS: dict = {}


def continuations(target, n: int = 24, new: int = 24, seed: int = 0) -> list[tuple[list[int], int]]:
    """``n`` (sequence, prompt length) pairs: random prompts of 1-6 tokens and the target's greedy
    continuation (``new`` tokens, or up to its EOS)."""
    g = torch.Generator().manual_seed(seed)
    vocab = target.config.get_text_config().vocab_size
    out = []
    with torch.no_grad():
        for _ in range(n):
            plen = int(torch.randint(1, 7, (1,), generator=g))
            prompt = [BOS] + torch.randint(4, vocab, (plen,), generator=g).tolist()
            seq = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=new)[0].tolist()
            out.append((seq, len(prompt)))
    return out


def batch_of(sequences):
    """A training :class:`~hf_cascade.training.loop.Batch` of ``(sequence, prompt length)`` pairs: responses weigh
    1, prompt tokens 0.1."""
    from ..training.loop import Batch

    width = max(len(s) for s, _ in sequences)
    ids = torch.full((len(sequences), width), PAD, dtype=torch.long)
    weights = torch.zeros(len(sequences), width)
    mask = torch.zeros(len(sequences), width, dtype=torch.long)
    for b, (s, plen) in enumerate(sequences):
        ids[b, : len(s)] = torch.tensor(s)
        mask[b, : len(s)] = 1
        weights[b, 1 : len(s)] = 0.1
        weights[b, plen : len(s)] = 1.0
    return Batch(ids, weights, mask, list(range(len(sequences))))


def fit_head(
    target, key: str, steps: int = 150, L: int = 4, layers: int = 1, seed: int = 0, draft_vocab_size: int | None = None
):
    """A :class:`~hf_cascade.heads.ReDrafterModel` for ``target`` distilled from its greedy continuations of random
    prompts (:func:`continuations`) with the real training loss, ``steps`` full-batch steps (cached by ``key``
    and the settings for the process): its drafts are often, but not always, right."""
    from ..heads import ReDrafterConfig, ReDrafterModel
    from ..training.redrafter import redrafter_loss

    cache_key = (key, steps, L, layers, seed, draft_vocab_size)
    if cache_key in _HEADS:
        return _HEADS[cache_key]
    tc = target.config.get_text_config()
    torch.manual_seed(seed)
    head = ReDrafterModel(
        ReDrafterConfig(
            vocab_size=tc.vocab_size,
            hidden_size=tc.hidden_size,
            num_draft_layers=layers,
            draft_vocab_size=draft_vocab_size,
        )
    )
    if draft_vocab_size is not None:
        head.set_vocab_subset(torch.arange(draft_vocab_size))
    batch = batch_of(continuations(target, seed=seed))
    opt = torch.optim.AdamW(head.parameters(), lr=1e-2)
    head.train()
    for _ in range(steps):
        loss, _ = redrafter_loss(head, target, batch, L=L)
        opt.zero_grad()
        loss.backward()
        opt.step()
    head.eval().requires_grad_(False)
    _HEADS[cache_key] = head
    return head


__all__ = [
    "BOS",
    "EOS",
    "PAD",
    "VOCAB",
    "batch_of",
    "continuations",
    "copy_model",
    "echo_glide",
    "fit_head",
    "ids",
    "llama",
    "llama_target",
    "sharpen",
    "truncated_copy",
]
