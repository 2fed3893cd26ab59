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

The Llama target and the builders ``hf-cascade bench --overhead`` needs too (:func:`llama`, :func:`llama_target`,
:func:`copy_model`, :func:`truncated_copy`, :func:`sharpen`, :func:`ids`) live in :mod:`hf_cascade.bench.tiny`
and are re-exported here.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, PreTrainedTokenizerFast

# The target and its drafters live in the package (hf_cascade.bench.tiny: ``hf-cascade bench --overhead`` runs them);
# re-exported here with the builders only the tests use.
from hf_cascade.bench.tiny import (  # the re-exported names: tests import them from here
    BOS,  # noqa: F401
    EOS,
    PAD,  # noqa: F401
    VOCAB,
    _build,
    _common_config,
    _finish,
    _scale_blocks,  # noqa: F401
    copy_model,  # noqa: F401
    ids,
    llama,  # noqa: F401
    llama_target,  # noqa: F401
    sharpen,  # noqa: F401
    truncated_copy,  # noqa: F401
)


def gemma3(
    vocab_size: int = VOCAB,
    layers: int = 2,
    hidden: int = 32,
    seed: int = 0,
    sliding_window: int = 8,
    head_scale: float = 1.0,
    block_scale: float = 1.0,
) -> Gemma3ForCausalLM:
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


def noisy_copy(model, noise: float = 0.3, seed: int = 1):
    """A copy with Gaussian noise (relative ``noise``) added to every weight: an imperfect drafter."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise * p.detach().float().std().clamp_min(1e-3))
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


def random_prompts(n: int, seed: int = 5, max_len: int = 11) -> list[torch.Tensor]:
    """``n`` random ``[1, L]`` prompts (``1 <= L <= max_len``, ids ``>= 4``), reproducible from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return [
        ids(*torch.randint(4, VOCAB, (int(torch.randint(1, max_len + 1, (1,), generator=g)),), generator=g).tolist())
        for _ in range(n)
    ]


# -- the standard test targets ------------------------------------------------------------------
# Chosen so greedy outputs fall into cycles that break now and then: Max-Gram drafts get both
# accepted and rejected (the parity tests assert that this actually happened). llama_target: hf_cascade.bench.tiny.


def gemma3_target():
    return gemma3(seed=0, block_scale=0.1, sliding_window=8)


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """Tiny models run faster on one thread (and the suite's CPU budget is small)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
