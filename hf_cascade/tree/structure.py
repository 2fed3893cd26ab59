"""Token trees: the draft structure verified by one target forward (GLIDE+CAPE, ReDrafter).

A :class:`TokenTree` of ``n`` nodes hangs below an implicit *root*: the last verified token (the one
whose K/V the target has not cached yet). Node ``i`` holds ``tokens[i]`` and its parent's index
``parents[i]`` (``-1`` = child of the root). Parents precede their children, so the node order is a
valid linearization for one forward pass, and every node ``i`` sees exactly its ancestors: the tree
attention of SpecInfer (Miao et al., 2024, §4) and Medusa (Cai et al., 2024).

Builders:

* :meth:`TokenTree.from_beams` -- ReDrafter's *dynamic tree attention* (Cheng et al., 2024,
  "Recurrent Drafter", §2 and Listing 1): the ``w`` beams of length ``L`` share prefixes; they are
  deduplicated with tensor ops only (:func:`get_prefix_match`), packed into unique nodes, and per-node
  results map back to beams with :func:`unpack`.
* :meth:`TokenTree.from_expansions` -- GLIDE's *CAPE* (Du et al., 2024, "GLIDE with a CAPE", §4.2 and
  Appendix A, Algorithm 2): a main draft path plus, at each step ``t``, expansion tokens that are
  siblings of ``main[t]`` and leaves of the tree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import torch


@dataclass(frozen=True, eq=False)
class TokenTree:
    """A token tree below the last verified token.

    Attributes:
        tokens: ``[n]`` LongTensor, the token of each node.
        parents: ``[n]`` LongTensor, the parent's node index, ``-1`` for children of the root;
            ``-1 <= parents[i] < i`` (parents precede children).
    """

    tokens: torch.Tensor
    parents: torch.Tensor

    def __post_init__(self) -> None:
        tokens = torch.as_tensor(self.tokens)
        parents = torch.as_tensor(self.parents, device=tokens.device)
        if tokens.ndim != 1 or parents.ndim != 1:
            raise ValueError(f"tokens and parents must be 1-D, got shapes {tuple(tokens.shape)} and {tuple(parents.shape)}")
        if tokens.shape != parents.shape:
            raise ValueError(f"tokens ({tokens.shape[0]}) and parents ({parents.shape[0]}) must have the same length")
        for name, t in (("tokens", tokens), ("parents", parents)):
            if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
                raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")
        tokens, parents = tokens.long(), parents.long()
        if tokens.numel() and int(tokens.min()) < 0:
            raise ValueError("tokens must be >= 0")
        idx = torch.arange(parents.shape[0], device=parents.device)
        bad = (parents < -1) | (parents >= idx)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            raise ValueError(
                f"node {i} has parent {int(parents[i])}: parents must precede their children "
                "(-1 <= parents[i] < i, with -1 meaning the root)"
            )
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "parents", parents)

    # -- basic properties -----------------------------------------------------------------------
    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[0]

    @cached_property
    def _ancestors(self) -> torch.Tensor:
        """``[n, n]`` bool closure of the parent relation (reflexive), by repeated squaring:
        ``A <- A | A @ A`` doubles the covered distance, so ``ceil(log2 n)`` products suffice."""
        n = self.num_nodes
        device = self.parents.device
        idx = torch.arange(n, device=device)
        a = torch.zeros(n, n, dtype=torch.float32, device=device)
        a[idx, idx] = 1.0
        has = self.parents >= 0
        a[idx[has], self.parents[has]] = 1.0
        for _ in range(math.ceil(math.log2(n)) if n > 1 else 0):
            a = ((a @ a) > 0).float()
        return a > 0

    def ancestor_mask(self) -> torch.Tensor:
        """``[n, n]`` bool: ``mask[i, j]`` iff node ``j`` is node ``i`` or one of its ancestors
        (the tree attention mask restricted to the tree's own keys)."""
        return self._ancestors

    @cached_property
    def depth(self) -> torch.Tensor:
        """``[n]`` LongTensor: ``0`` for children of the root, ``depth[parent] + 1`` otherwise."""
        return self._ancestors.sum(dim=-1) - 1

    def position_offsets(self) -> torch.Tensor:
        """``[n]`` position of each node relative to the root's first child (= :attr:`depth`): node
        ``i`` sits at absolute position ``root_position + 1 + depth[i]``, as on its own branch."""
        return self.depth

    def children(self, node: int) -> torch.Tensor:
        """Indices of the children of ``node`` (``-1``: the root), in node order."""
        return (self.parents == node).nonzero().flatten()

    def paths(self) -> list[list[int]]:
        """Root-to-leaf node index lists, one per leaf, leaves in node order."""
        parents = self.parents.tolist()
        is_parent = set(parents)
        out = []
        for leaf in range(len(parents)):
            if leaf in is_parent:
                continue
            path, node = [], leaf
            while node >= 0:
                path.append(node)
                node = parents[node]
            out.append(path[::-1])
        return out

    def with_root(self, token: int | torch.Tensor) -> "TokenTree":
        """The ``n + 1``-node tree whose node 0 is the root ``token`` (the last verified token) and
        whose node ``i + 1`` is this tree's node ``i``."""
        root = torch.as_tensor(token, device=self.tokens.device).long().reshape(1)
        return TokenTree(torch.cat([root, self.tokens]), torch.cat([root.new_full((1,), -1), self.parents + 1]))

    def select(self, keep: torch.Tensor) -> "TokenTree":
        """The subtree of the nodes where ``keep`` (``[n]`` bool) is true, renumbered in node order.

        ``keep`` must be closed under ancestors (a kept node's parent is kept), as the masks of
        :func:`~hf_cascade.tree.decode.prune_tree` and of confidence pruning are."""
        keep = torch.as_tensor(keep, dtype=torch.bool, device=self.tokens.device)
        if keep.shape != self.tokens.shape:
            raise ValueError(f"keep must have one entry per node ({self.num_nodes}), got {tuple(keep.shape)}")
        parents_kept = torch.where(self.parents >= 0, keep[self.parents.clamp_min(0)], torch.ones_like(keep))
        if bool((keep & ~parents_kept).any()):
            raise ValueError("keep must be closed under ancestors: a kept node has a dropped parent")
        new_index = keep.long().cumsum(0) - 1
        parents = self.parents[keep]
        parents = torch.where(parents >= 0, new_index[parents.clamp_min(0)], parents)
        return TokenTree(self.tokens[keep], parents)

    # -- builders -------------------------------------------------------------------------------
    @classmethod
    def chain(cls, tokens: torch.Tensor) -> "TokenTree":
        """A single path (a plain speculative-decoding draft)."""
        tokens = torch.as_tensor(tokens).long().flatten()
        return cls(tokens, torch.arange(tokens.shape[0], device=tokens.device) - 1)

    @classmethod
    def from_beams(cls, beams: torch.Tensor) -> tuple["TokenTree", torch.Tensor]:
        """ReDrafter's dynamic tree attention: pack ``beams`` (``[w, L]``) into unique nodes.

        Position ``(i, j)`` opens a node iff no earlier beam shares ``beams[i, :j + 1]``, i.e. iff
        ``get_prefix_match(beams)[i, j] == i``. Nodes are numbered in beam-major order (as the
        reference implementation's ``pack``), which keeps parents before children, because the beam
        owning the prefix up to ``j - 1`` has an index ``<=`` that owning the prefix up to ``j``.

        Returns:
            ``(tree, beam_to_node)``: ``beam_to_node [w, L]`` is the node holding ``beams[i, j]``
            (with prefix ``beams[i, :j]``); ``tree.tokens[beam_to_node] == beams``.
        """
        beams = torch.as_tensor(beams)
        if beams.ndim != 2 or beams.shape[0] == 0:
            raise ValueError(f"beams must be [w, L] with w >= 1, got shape {tuple(beams.shape)}")
        beams = beams.long()
        w, L = beams.shape
        match = get_prefix_match(beams)                                          # [w, L]
        owns = match == torch.arange(w, device=beams.device)[:, None]              # [w, L]
        node_id = (owns.flatten().long().cumsum(0) - 1).view(w, L)                 # valid where owns
        beam_to_node = node_id.gather(0, match)                                    # [w, L]
        parent_grid = torch.cat([beam_to_node.new_full((w, 1), -1), beam_to_node[:, :-1]], dim=1)
        return cls(beams[owns], parent_grid[owns]), beam_to_node

    @classmethod
    def from_expansions(cls, main: torch.Tensor, expansions: Sequence[torch.Tensor], dedupe: bool = True) -> "TokenTree":
        """GLIDE's CAPE expanded proposal (Du et al., 2024, §4.2; Appendix A, Algorithms 1-2).

        ``main`` (``[k]``) is the draft path; ``expansions[t]`` (``[K_t]``, possibly empty) holds the
        alternative tokens for step ``t``. The node order is Algorithm 2's linearized input: ``main``
        first, then ``expansions[0]``, ``expansions[1]``, ... Each expansion token of step ``t`` is a
        sibling of ``main[t]`` (parent ``t - 1``, the root for ``t = 0``) and a leaf ("tokens in the
        expansion sets are not used for predicting future tokens", §4.2). Hence

        * ``position_offsets()`` is Algorithm 2's ``input_pi``: ``t`` for ``main[t]`` and for every
          token of ``expansions[t]``;
        * ``ancestor_mask()`` is §4.2's ``Mask_CAPE``: token ``i`` attends to itself and to the main
          tokens ``j`` with ``pos(i) > j``. (Algorithm 2's line ``VAM[:, γ:] <- CAM[:, γ:]`` must read
          ``VAM[:γ, :] <- CAM[:γ, :]``: as printed, main tokens would not see each other and
          expansion tokens would see earlier expansion tokens, contradicting ``Mask_CAPE`` and the text.)

        ``dedupe`` drops expansion tokens equal to ``main[t]`` or repeated within ``expansions[t]``
        (Algorithm 1 takes ``topk`` including the argmax, while §4.2 excludes ``x_{t+i}``); with
        ``dedupe=False`` the tokens are kept exactly as given.
        """
        main = torch.as_tensor(main).long().flatten()
        k = main.shape[0]
        if len(expansions) != k:
            raise ValueError(f"need one expansion set per main token: {k} main tokens, {len(expansions)} sets")
        tokens, parents = [main], [torch.arange(k, device=main.device) - 1]
        main_list = main.tolist()
        for t, x in enumerate(expansions):
            x = torch.as_tensor(x, device=main.device).long().flatten()
            if dedupe and x.numel():
                seen, keep = {main_list[t]}, []
                for tok in x.tolist():
                    if tok not in seen:
                        seen.add(tok)
                        keep.append(tok)
                x = torch.tensor(keep, dtype=torch.long, device=main.device)
            tokens.append(x)
            parents.append(torch.full((x.shape[0],), t - 1, dtype=torch.long, device=main.device))
        return cls(torch.cat(tokens), torch.cat(parents))


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
