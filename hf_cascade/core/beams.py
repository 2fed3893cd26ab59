"""Beams and the token tree they pack into, as tensor ops (ReDrafter's dynamic tree attention, Cheng et al., 2024,
"Recurrent Drafter", §2 and Listing 1): :func:`get_prefix_match` finds the beams' shared prefixes, :func:`unpack` maps
per-node results back to beams. The tree itself is built on the host by :func:`~hf_cascade.core.structure.pack_beams`
(:meth:`TokenTree.from_beams <hf_cascade.core.structure.TokenTree.from_beams>`)."""

from __future__ import annotations

import torch


def get_prefix_match(beams: torch.Tensor) -> torch.Tensor:
    """ReDrafter Listing 1 (Cheng et al., 2024): ``[w, L] -> [w, L]``.

    ``prefix_match[i, j] = k``: ``k`` is the smallest beam index with ``beams[k, :j + 1] ==
    beams[i, :j + 1]`` (so ``k <= i``). Paper example::

        beams = [[91, 92, 93, 95],         prefix_match = [[0, 0, 0, 0],
                 [91, 92, 94, 96],                         [0, 0, 1, 1],
                 [91, 92, 93, 97]]                         [0, 0, 0, 2]]

    Same steps as the listing: token matches between beams, ``cumsum`` along positions equal to
    ``1..L`` marks matching prefixes, ``argmax`` over the other beam picks the first one. (The
    listing's broadcast ``beams[:, :, None] == beams[:, None, :]`` is written for a batched
    ``[b, w, L]`` input, as in the reference ``_dedup_prefix``; for ``[w, L]`` the pairwise beam
    comparison is ``beams[:, None, :] == beams[None, :, :]``.)
    """
    beams = torch.as_tensor(beams)
    if beams.ndim != 2:
        raise ValueError(f"beams must be [w, L], got shape {tuple(beams.shape)}")
    L = beams.shape[1]
    beam_index = torch.arange(1, L + 1, device=beams.device)
    matches = beams[:, None, :] == beams[None, :, :]                              # [w, w, L]
    seq_matches = torch.cumsum(matches.long(), dim=2) == beam_index[None, None, :]  # [w, w, L]
    # torch.argmax returns the first maximal index: the smallest beam sharing the prefix.
    return torch.argmax(seq_matches.long(), dim=1)                                 # [w, L]


def unpack(node_values: torch.Tensor, beam_to_node: torch.Tensor) -> torch.Tensor:
    """Per-node results ``[n, ...]`` back to the beams' layout ``[w, L, ...]`` (ReDrafter's
    ``unpack``): ``out[i, j] = node_values[beam_to_node[i, j]]``."""
    return node_values[beam_to_node.to(node_values.device)]


__all__ = ["get_prefix_match", "unpack"]
