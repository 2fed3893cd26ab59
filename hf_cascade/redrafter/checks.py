"""Whether a ReDrafter head was built for a target (vocabulary, hidden size, output head):
:func:`check_head_matches`."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel


def check_head_matches(head, target: PreTrainedModel) -> None:
    """``ValueError`` unless ``head`` was built for ``target``: same vocabulary size ``V`` (the head's
    token ids are the target's), same hidden size ``H`` (it reads the target's hidden states and
    token embeddings), and a target whose output head exposes its input (the last hidden state)."""
    tc = target.config.get_text_config()
    hc = head.config
    v_target = int(tc.vocab_size)
    if int(hc.vocab_size) != v_target:
        raise ValueError(
            f"the ReDrafter head predicts a vocabulary of {hc.vocab_size} tokens but the target's has {v_target}: "
            "the head must be trained for this target (same tokenizer and vocabulary)."
        )
    emb = target.get_input_embeddings()
    h_target = int(getattr(tc, "hidden_size", emb.weight.shape[-1]))
    if int(hc.hidden_size) != h_target or emb.weight.shape[-1] != h_target:
        raise ValueError(
            f"the ReDrafter head reads hidden states of size {hc.hidden_size} but the target's hidden size is "
            f"{h_target} (embeddings {emb.weight.shape[-1]}): the head must be trained for this target."
        )
    subset = getattr(head, "vocab_subset", None)
    if subset is not None and subset.numel() and int(subset.max()) >= emb.weight.shape[0]:
        raise ValueError(
            f"the head's vocabulary subset holds id {int(subset.max())}, beyond the target's "
            f"{emb.weight.shape[0]} embeddings."
        )
    out = target.get_output_embeddings() if hasattr(target, "get_output_embeddings") else None
    if not isinstance(out, torch.nn.Module):
        raise ValueError(
            "ReDrafter drafts from the target's last hidden state (the input of its output head), "
            f"but {type(target).__name__} exposes no output-embedding module."
        )


__all__ = ["check_head_matches"]
