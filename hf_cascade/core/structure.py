"""Token trees: the draft structure verified by one target forward (a linear draft is a tree with one path).

A :class:`TokenTree` of ``n`` nodes hangs below an implicit *root*: the last verified token (the one
whose K/V the target has not cached yet). Node ``i`` holds ``tokens[i]`` and its parent's index
``parents[i]`` (``-1`` = child of the root). Parents precede their children, so the node order is a
valid linearization for one forward pass, and every node ``i`` sees exactly its ancestors: the tree
attention of SpecInfer (Miao et al., 2024, §4) and Medusa (Cai et al., 2024).

Builders, for every strategy: :meth:`TokenTree.chain` (a linear draft), :meth:`TokenTree.from_host` (host lists,
for drafters that expand on the host) and :func:`prefix_tree` (paths merged into one tree, each shared prefix one
node). A strategy's own layout is built from these in its folder (GLIDE's CAPE tree, ReDrafter's beam trees).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch

from ..placement import HOST, upload
from .closure import closure_bits, unpack_closure


@dataclass(frozen=True, eq=False)
class TokenTree:
    """A token tree below the last verified token.

    Attributes:
        tokens: ``[n]`` LongTensor, the token of each node.
        parents: ``[n]`` LongTensor, the parent's node index, ``-1`` for children of the root;
            ``-1 <= parents[i] < i`` (parents precede children).
        host_parents / host_tokens: the same values as Python ints, when the builder has them on the
            host (they must equal the tensors; not checked against them). The structure is kept on the
            host beside the device tensors (:attr:`parent_list`, :attr:`token_list`, :attr:`depth_list`):
            walks over the tree (acceptance, rows, paths) read no device value per node. A tree built
            from device tensors alone reads its parents and tokens once, at construction, in one transfer;
            one with host parents but no host tokens reads its tokens then only when they live on the host
            (no sync; a device tree's are read at most once, by :attr:`token_list`); an empty tree reads
            nothing. :meth:`with_root` (given a host int root), :meth:`select` and the builders below carry
            the host structure over.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    host_parents: Sequence[int] | None = field(default=None, repr=False)
    host_tokens: Sequence[int] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        tokens = torch.as_tensor(self.tokens)
        parents = torch.as_tensor(self.parents, device=tokens.device)
        if tokens.ndim != 1 or parents.ndim != 1:
            raise ValueError(
                f"tokens and parents must be 1-D, got shapes {tuple(tokens.shape)} and {tuple(parents.shape)}"
            )
        if tokens.shape != parents.shape:
            raise ValueError(f"tokens ({tokens.shape[0]}) and parents ({parents.shape[0]}) must have the same length")
        for name, t in (("tokens", tokens), ("parents", parents)):
            if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
                raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")
        tokens, parents = tokens.long(), parents.long()
        n = tokens.shape[0]
        host_p, host_t = self.host_parents, self.host_tokens
        on_host = tokens.device.type == "cpu"
        if n == 0:  # nothing to read
            host_p, host_t = (() if host_p is None else host_p), (() if host_t is None else host_t)
        elif host_p is None:
            if host_t is None:  # one transfer: parents and tokens (kept on the host)
                both = torch.cat([parents, tokens]).tolist()
                host_p, host_t = both[:n], both[n:]
            else:
                host_p = parents.tolist()
        elif on_host and host_t is None:
            host_t = tokens.tolist()  # a host tensor: one read, then kept (no device sync)
        host_p = tuple(int(p) for p in host_p)
        if len(host_p) != n:
            raise ValueError(f"host_parents has {len(host_p)} entries for {n} nodes")
        for i, p in enumerate(host_p):
            if p < -1 or p >= i:
                raise ValueError(
                    f"node {i} has parent {p}: parents must precede their children "
                    "(-1 <= parents[i] < i, with -1 meaning the root)"
                )
        if host_t is not None:
            host_t = tuple(int(t) for t in host_t)
            if len(host_t) != n:
                raise ValueError(f"host_tokens has {len(host_t)} entries for {n} nodes")
            if n and min(host_t) < 0:
                raise ValueError("tokens must be >= 0")
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "host_parents", host_p)
        object.__setattr__(self, "host_tokens", host_t)

    # -- basic properties -----------------------------------------------------------------------
    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_nodes(self) -> int:
        return len(self.host_parents)  # one per node, on the host

    @property
    def parent_list(self) -> tuple[int, ...]:
        """:attr:`parents` on the host (kept since construction: no device read)."""
        return self.host_parents

    @cached_property
    def token_list(self) -> tuple[int, ...]:
        """:attr:`tokens` on the host (read once per tree when no builder gave them)."""
        return self.host_tokens if self.host_tokens is not None else tuple(self.tokens.tolist())

    @cached_property
    def depth_list(self) -> tuple[int, ...]:
        """:attr:`depth` on the host, from :attr:`parent_list` (no device read)."""
        depth: list[int] = []
        for p in self.host_parents:
            depth.append(0 if p < 0 else depth[p] + 1)
        return tuple(depth)

    @cached_property
    def _ancestors(self) -> torch.Tensor:
        """``[n, n]`` bool closure of the parent relation (reflexive). Up to 64 nodes from the host structure:
        each node's ancestors as the bits of one int (its parent's and its own), unpacked on the device (one copy
        of ``n`` ints); larger trees by repeated squaring: ``A <- A | A @ A`` doubles the covered distance, so
        ``ceil(log2 n)`` products suffice."""
        n = self.num_nodes
        device = self.parents.device
        if n <= 64:
            packed = torch.tensor(closure_bits(self.host_parents), dtype=torch.long, device=device)
            return unpack_closure(packed).bool()
        idx = torch.arange(n, device=device)
        a = torch.zeros(n, n, dtype=torch.float32, device=device)
        a[idx, idx] = 1.0
        child = [i for i, p in enumerate(self.host_parents) if p >= 0]  # from the host structure
        if child:
            a[
                torch.tensor(child, device=device), torch.tensor([self.host_parents[i] for i in child], device=device)
            ] = 1.0
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
        return torch.tensor(self.depth_list, dtype=torch.long, device=self.tokens.device)

    def position_offsets(self) -> torch.Tensor:
        """``[n]`` position of each node relative to the root's first child (= :attr:`depth`): node
        ``i`` sits at absolute position ``root_position + 1 + depth[i]``, as on its own branch."""
        return self.depth

    def children(self, node: int) -> torch.Tensor:
        """Indices of the children of ``node`` (``-1``: the root), in node order."""
        kids = [i for i, p in enumerate(self.host_parents) if p == node]
        return torch.tensor(kids, dtype=torch.long, device=self.tokens.device)

    def paths(self) -> list[list[int]]:
        """Root-to-leaf node index lists, one per leaf, leaves in node order."""
        parents = self.host_parents
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

    def shape(self, linear: bool = False) -> tuple[int, int]:
        """``(depth, leaves)`` from the host structure (no read); ``linear``: a chain's, without walking it."""
        if not self.num_nodes:
            return 0, 0
        if linear:
            return self.num_nodes, 1
        return max(self.depth_list) + 1, len(set(range(self.num_nodes)) - set(self.host_parents))

    def with_root(self, token: int | torch.Tensor) -> TokenTree:
        """The ``n + 1``-node tree whose node 0 is the root ``token`` (the last verified token) and
        whose node ``i + 1`` is this tree's node ``i``."""
        host_p = (-1,) + tuple(p + 1 for p in self.host_parents)
        if self.host_tokens is not None and (not isinstance(token, torch.Tensor) or token.device.type == "cpu"):
            host_t = (int(token),) + self.host_tokens
            both = torch.tensor([host_t, host_p], dtype=torch.long, device=self.tokens.device)
            return TokenTree._unchecked(both[0], both[1], host_p, host_t)
        root = torch.as_tensor(token, device=self.tokens.device).long().reshape(1)
        return TokenTree._unchecked(
            torch.cat([root, self.tokens]), torch.cat([root.new_full((1,), -1), self.parents + 1]), host_p, None
        )

    def select(self, keep: torch.Tensor) -> TokenTree:
        """The subtree of the nodes where ``keep`` (``[n]`` bool, a tensor or host bools) is true, renumbered in node
        order.

        ``keep`` must be closed under ancestors (a kept node's parent is kept), as the masks of
        :func:`~hf_cascade.core.stopping.prune_tree` and of confidence pruning are."""
        if isinstance(keep, torch.Tensor):
            if keep.shape != self.tokens.shape:
                raise ValueError(f"keep must have one entry per node ({self.num_nodes}), got {tuple(keep.shape)}")
            keep_list = keep.bool().tolist()  # one read; the rest runs on the host
        else:
            keep_list = [bool(k) for k in keep]  # host values: no read
            if len(keep_list) != self.num_nodes:
                raise ValueError(f"keep must have one entry per node ({self.num_nodes}), got ({len(keep_list)},)")
        parents = self.host_parents
        if any(k and p >= 0 and not keep_list[p] for k, p in zip(keep_list, parents)):
            raise ValueError("keep must be closed under ancestors: a kept node has a dropped parent")
        kept = [i for i, k in enumerate(keep_list) if k]
        new_index = {old: new for new, old in enumerate(kept)}
        new_parents = [new_index[parents[i]] if parents[i] >= 0 else -1 for i in kept]
        device = self.tokens.device
        if self.host_tokens is not None:  # host values: the tensors in one copy, no check
            host_t = tuple(self.host_tokens[i] for i in kept)
            both = upload(torch.tensor([host_t, new_parents], dtype=torch.long, device=HOST), device)
            both = both.reshape(2, len(kept))
            return TokenTree._unchecked(both[0], both[1], tuple(new_parents), host_t)
        return TokenTree._unchecked(
            self.tokens.index_select(0, torch.tensor(kept, dtype=torch.long, device=device)),
            torch.tensor(new_parents, dtype=torch.long, device=device),
            tuple(new_parents),
            None,
        )

    # -- builders -------------------------------------------------------------------------------
    @classmethod
    def chain(cls, tokens: torch.Tensor, host_tokens: Sequence[int] | None = None) -> TokenTree:
        """A single path (a plain speculative-decoding draft); ``host_tokens``: ``tokens`` as host ints when the
        drafter has them (then nothing of the tree is ever read from the device)."""
        tokens = torch.as_tensor(tokens).long().flatten()
        n = tokens.shape[0]
        if host_tokens is None:
            return cls(tokens, torch.arange(-1, n - 1, device=tokens.device), host_parents=tuple(range(-1, n - 1)))
        host_tokens = tuple(map(int, host_tokens))
        if len(host_tokens) != n or (n and min(host_tokens) < 0):
            raise ValueError(f"host_tokens must be {n} token ids >= 0, got {host_tokens}")
        return cls._unchecked(tokens, *_chain_parents(n, tokens.device), host_tokens)

    @classmethod
    def empty(cls, device: torch.device | str | None = None) -> TokenTree:
        """The tree without nodes on ``device``: made once per device and shared (a tree is never written), for
        the steps a drafter drafts nothing."""
        device = torch.device(device if device is not None else "cpu")
        tree = _EMPTY.get(device)
        if tree is None:
            tree = _EMPTY[device] = cls.from_host((), (), device)
        return tree

    @classmethod
    def from_host(
        cls, tokens: Sequence[int], parents: Sequence[int], device: torch.device | str | None = None
    ) -> TokenTree:
        """A tree from host lists (checked on the host as :class:`TokenTree` checks them), its tensors made on
        ``device`` in one copy: the builder of drafters that expand on the host."""
        host_t, host_p = tuple(map(int, tokens)), tuple(map(int, parents))
        if len(host_t) != len(host_p):
            raise ValueError(f"tokens ({len(host_t)}) and parents ({len(host_p)}) must have the same length")
        if host_t and min(host_t) < 0:
            raise ValueError("tokens must be >= 0")
        for i, p in enumerate(host_p):
            if p < -1 or p >= i:
                raise ValueError(
                    f"node {i} has parent {p}: parents must precede their children "
                    "(-1 <= parents[i] < i, with -1 meaning the root)"
                )
        both = (
            upload(torch.tensor([host_t, host_p], dtype=torch.long, device=HOST), device or HOST)
            if host_t
            else torch.empty(2, 0, dtype=torch.long, device=device)
        )
        return cls._unchecked(both[0], both[1], host_p, host_t)

    @classmethod
    def _unchecked(
        cls,
        tokens: torch.Tensor,
        parents: torch.Tensor,
        host_parents: tuple[int, ...],
        host_tokens: tuple[int, ...] | None,
    ) -> TokenTree:
        """A tree whose fields are valid by construction (built from a valid tree or checked on the host): no
        check per node and no conversion (a tree is built at every step)."""
        tree = object.__new__(cls)
        for name, value in (
            ("tokens", tokens),
            ("parents", parents),
            ("host_parents", host_parents),
            ("host_tokens", host_tokens),
        ):
            object.__setattr__(tree, name, value)
        return tree


def prefix_tree(
    paths: torch.Tensor, rows: list[list[int]] | None = None
) -> tuple[TokenTree, torch.Tensor, list[list[int]]]:
    """The ``w`` token paths ``paths`` (``[w, L]``) merged into one tree, each shared prefix one node.

    Position ``(i, j)`` opens a node iff no earlier path shares ``paths[i, :j + 1]``. Nodes are numbered path-major,
    which keeps parents before children: the path owning the prefix up to ``j - 1`` has an index ``<=`` that owning
    the prefix up to ``j``. (ReDrafter's dynamic tree attention, Cheng et al., 2024, §2 and Listing 1, packs its
    beams so, node order included; the Max-Gram tree merges its continuations so.)

    Returns:
        ``(tree, path_to_node, path_to_node as lists)``: ``path_to_node [w, L]`` is the node holding ``paths[i, j]``
        (with prefix ``paths[i, :j]``); ``tree.tokens[path_to_node] == paths``. The paths are read once (not at all
        when ``rows``, their host copy, is given); the merge runs on the host (``w * L`` small).
    """
    paths = torch.as_tensor(paths)
    if paths.ndim != 2 or paths.shape[0] == 0:
        raise ValueError(f"paths must be [w, L] with w >= 1, got shape {tuple(paths.shape)}")
    rows = paths.long().tolist() if rows is None else rows
    w, L = paths.shape
    owner: dict[tuple[int, ...], int] = {}  # prefix -> the smallest path holding it
    match = [[owner.setdefault(tuple(row[: j + 1]), i) for j in range(L)] for i, row in enumerate(rows)]
    node_id = [[-1] * L for _ in range(w)]
    tokens, parents, count = [], [], 0
    for i in range(w):  # path-major node numbering
        for j in range(L):
            if match[i][j] == i:
                node_id[i][j] = count
                count += 1
    path_to_node = [[node_id[match[i][j]][j] for j in range(L)] for i in range(w)]
    for i in range(w):
        for j in range(L):
            if match[i][j] == i:
                tokens.append(rows[i][j])
                parents.append(path_to_node[i][j - 1] if j else -1)
    device = paths.device
    tree = TokenTree.from_host(tokens, parents, device)
    return tree, upload(torch.tensor(path_to_node, dtype=torch.long, device=HOST), device), path_to_node


_EMPTY: dict[torch.device, TokenTree] = {}  # device -> TokenTree.empty's tree
_CHAIN: dict[tuple[int, torch.device], tuple[torch.Tensor, tuple[int, ...]]] = {}  # (n, device) -> a chain's parents


def _chain_parents(n: int, device: torch.device) -> tuple[torch.Tensor, tuple[int, ...]]:
    """A chain of ``n`` nodes' parents ``[-1, 0, ..., n - 2]`` on ``device`` and on the host: made once per length and
    device and shared (a tree is never written), as a drafter drafts the same few lengths at every step."""
    parents = _CHAIN.get((n, device))
    if parents is None:
        parents = _CHAIN[(n, device)] = (torch.arange(-1, n - 1, device=device), tuple(range(-1, n - 1)))
    return parents
