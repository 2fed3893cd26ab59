"""Tiny random causal LMs (and a word-level tokenizer) built in-process for the hf_cascade tests.

Nothing here downloads anything. Every builder fixes its seed so the models are deterministic:

* :func:`llama` / :func:`gemma3`: a target (Llama-style, or Gemma3-style with sliding-window layers
  whose window is small, so drafts roll back through sliding layers);
* :func:`copy_model` (a drafter identical to the target: greedy drafts are always accepted),
  :func:`truncated_copy` (the target with fewer layers: high but imperfect acceptance),
  :func:`noisy_copy` (the target with perturbed weights: rejections happen),
  :func:`padded_vocab_copy` (the same model with extra output rows);
* :func:`sharpen` scales the output head so greedy decoding is less repetitive / sampling less peaked;
* :func:`word_tokenizer`: a ``PreTrainedTokenizerFast`` over ``w0 .. w{V-1}`` for pipeline tests.
"""

from __future__ import annotations

import copy

import pytest

import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

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


def llama(vocab_size: int = VOCAB, layers: int = 2, hidden: int = 32, seed: int = 0, head_scale: float = 1.0,
          block_scale: float = 1.0, eos_token_id: int = EOS) -> LlamaForCausalLM:
    """A tiny Llama-style causal LM (random weights, fixed ``seed``)."""
    torch.manual_seed(seed)
    config = LlamaConfig(**_common_config(vocab_size, layers, hidden, eos_token_id))
    model = _build(LlamaForCausalLM, config, head_scale, block_scale)
    model.generation_config.eos_token_id = eos_token_id
    return model


def gemma3(vocab_size: int = VOCAB, layers: int = 2, hidden: int = 32, seed: int = 0, sliding_window: int = 8,
           head_scale: float = 1.0, block_scale: float = 1.0) -> Gemma3ForCausalLM:
    """A tiny Gemma3-style causal LM: layer 0 uses sliding-window attention (window ``sliding_window``),
    the last layer full attention."""
    torch.manual_seed(seed)
    layer_types = ["sliding_attention"] * (layers - 1) + ["full_attention"]
    config = Gemma3TextConfig(
        **_common_config(vocab_size, layers, hidden, EOS),
        head_dim=8,
        query_pre_attn_scalar=8,
        sliding_window=sliding_window,
        layer_types=layer_types,
    )
    return _build(Gemma3ForCausalLM, config, head_scale, block_scale)


def _common_config(vocab_size: int, layers: int, hidden: int, eos_token_id: int) -> dict:
    return dict(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, bos_token_id=BOS,
        eos_token_id=eos_token_id, pad_token_id=PAD, tie_word_embeddings=False, initializer_range=0.5,
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


def noisy_copy(model, noise: float = 0.3, seed: int = 1):
    """A copy with Gaussian noise (relative ``noise``) added to every weight: an imperfect drafter."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise * p.detach().float().std().clamp_min(1e-3))
    return _finish(out)


def truncated_copy(model, layers: int = 1):
    """The target with only its first ``layers`` decoder layers (shares no tensors with it)."""
    out = copy.deepcopy(model)
    out.model.layers = out.model.layers[:layers]
    out.config.num_hidden_layers = layers
    if getattr(out.config, "layer_types", None) is not None:
        out.config.layer_types = out.config.layer_types[:layers]
    return _finish(out)


def padded_vocab_copy(model, extra: int = 32):
    """The same model with ``extra`` more rows in its embeddings and output head, like a checkpoint
    whose vocabulary was padded to a multiple of 64. The extra head rows are 1.5x copies of the first
    real rows, so they would often win the argmax if a library forgot to cut them off."""
    out = copy.deepcopy(model)
    old = out.get_output_embeddings().weight.shape[0]
    out.resize_token_embeddings(old + extra, mean_resizing=False)
    with torch.no_grad():
        head = out.get_output_embeddings().weight
        assert head.shape[0] == old + extra
        head[old:] = 1.5 * head[:extra]
    return _finish(out)


def word_tokenizer(vocab_size: int = VOCAB) -> PreTrainedTokenizerFast:
    """Word-level tokenizer: ``<pad>`` 0, ``<s>`` 1, ``</s>`` 2, ``<unk>`` 3, then ``w4 .. w{V-1}``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def ids(*tokens: int) -> torch.Tensor:
    """A ``[1, L]`` prompt."""
    return torch.tensor([list(tokens)], dtype=torch.long)


def random_prompts(n: int, seed: int = 5, max_len: int = 11) -> list[torch.Tensor]:
    """``n`` random ``[1, L]`` prompts (``1 <= L <= max_len``, ids ``>= 4``), reproducible from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return [ids(*torch.randint(4, VOCAB, (int(torch.randint(1, max_len + 1, (1,), generator=g)),), generator=g).tolist())
            for _ in range(n)]


# -- the standard test targets ------------------------------------------------------------------
# Chosen so greedy outputs fall into cycles that break now and then: Max-Gram drafts get both
# accepted and rejected (the parity tests assert that this actually happened).

def llama_target():
    return llama(seed=0, block_scale=0.005)


def gemma3_target():
    return gemma3(seed=0, block_scale=0.1, sliding_window=8)


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """Tiny models run faster on one thread (and the suite's CPU budget is small)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
