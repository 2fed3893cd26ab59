"""Token-tree verification shared by the tree strategies (GLIDE+CAPE, ReDrafter).

* :mod:`.structure` -- :class:`TokenTree` (nodes, parents, depth, ancestor mask, paths) and its
  builders: ReDrafter beams (:func:`get_prefix_match`, packing, :func:`unpack`) and CAPE expansions;
* :mod:`.attention` -- the additive 4D tree mask and the position ids;
* :mod:`.accept` -- greedy and lossless (recursive rejection sampling) acceptance of a path;
* :mod:`.forward` -- one target forward over a tree, and keeping the accepted path in the KV cache;
* :mod:`.budget` -- hardware-aware tree size: the measured cost of verifying ``n`` nodes and the most
  probable node set that pays for it.
"""

from .accept import TreeAcceptance, greedy_tree_accept, sampling_tree_accept
from .attention import tree_allowed, tree_attention_mask, tree_position_ids
from .budget import VerifyCost, measure_verify_cost
from .forward import keep_path, model_tree_mask, verify_tree
from .structure import TokenTree, get_prefix_match, unpack

__all__ = [
    "TokenTree",
    "TreeAcceptance",
    "VerifyCost",
    "get_prefix_match",
    "greedy_tree_accept",
    "keep_path",
    "measure_verify_cost",
    "model_tree_mask",
    "sampling_tree_accept",
    "tree_allowed",
    "tree_attention_mask",
    "tree_position_ids",
    "unpack",
    "verify_tree",
]
