"""The decoding core shared by every strategy: draft -> verify -> accept -> update.

* :mod:`.loop` -- :func:`~.loop.speculative_decode`, the loop for one row (each step a named function);
  :mod:`.batch` -- :func:`~.batch.speculative_decode_batch`, the same steps over a left-padded batch;
  :mod:`.phases` -- each step's work for one row, which both call (and what still differs between them);
* :mod:`.strategy` -- the drafter contract (:class:`~.strategy.TreeDrafter`, :class:`~.strategy.TreeStep`);
* :mod:`.structure` -- :class:`TokenTree` (a linear draft is a tree with one path) and its generic builders (a
  strategy's own trees are built in its folder); :mod:`.closure` -- its ancestor closure as bits per row;
* :mod:`.forward` -- one target forward over a draft, and keeping the accepted path in the KV cache;
* :mod:`.attention` -- the verification queries of a tree, their additive 4D mask and position ids (and the dense
  reference ops they are tested against);
* :mod:`.rows` -- row selection: the logits acceptance reads, computed when it reads them;
* :mod:`.accept` -- acceptance: greedy and exact speculative sampling (and reviews between drafters);
* :mod:`.draws` -- drafts drawn from the drafter's ``q`` under sampling: the rules that keep them exact, and the
  per-call choice between drawing and the argmax; :mod:`.categorical` -- one draw from a distribution;
* :mod:`.stopping` -- EOS, length budget and stopping criteria;
* :mod:`.checks` -- clear errors for unsupported inputs;
* :mod:`.stats` -- the statistics every strategy fills;
* :mod:`.payoff` -- whether drafting pays: verification costs, calibrated acceptance, the expected-gain rule, the
  tree budget and the batch's draft gate (it receives measured numbers; :mod:`hf_cascade.measure` measures).

The core runs the target with its own kernels on any device; optional verification backends
(:mod:`hf_cascade.backends`) sit beside it and are never imported by it.
"""

from .accept import TreeAcceptance, greedy_tree_accept, sampling_tree_accept
from .attention import tree_allowed, tree_attention_mask, tree_position_ids
from .forward import keep_path, verify_tree
from .payoff import VerifyCost
from .structure import TokenTree

__all__ = [
    "TokenTree",
    "TreeAcceptance",
    "VerifyCost",
    "greedy_tree_accept",
    "keep_path",
    "sampling_tree_accept",
    "tree_allowed",
    "tree_attention_mask",
    "tree_position_ids",
    "verify_tree",
]
