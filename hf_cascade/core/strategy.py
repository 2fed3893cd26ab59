"""The drafter contract of the decoding core: a :class:`TreeDrafter` proposes a draft (a token tree; a
linear draft is a tree with one path), :func:`~hf_cascade.core.loop.speculative_decode` verifies it
in one target forward, accepts a path and hands the result back.

What the target left behind is handed to the drafter as a :class:`TreeStep`, at no extra target
forward: the verified sequence, the target's ``DynamicCache`` (GLIDE reads it), the target's last
hidden state (ReDrafter drafts from it) and the measured time of the last verification.

Assistants (what users pass as ``generate(assistant_model=...)``, :mod:`hf_cascade.assistant`) build
one drafter per ``generate()`` call, so no state survives a call.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from transformers import Cache

from .accept import TreeAcceptance
from .structure import TokenTree


@dataclass
class TreeStep:
    """The target's state between two verifications (read-only for drafters).

    Attributes:
        seq: ``[L]`` every verified token (prompt and generated), on the target's device. ``seq[-1]``
            is the root of the next draft: the target has not processed it yet.
        cache: the target's ``DynamicCache`` (built without a config, every layer keeps every
            position), holding the K/V of ``seq[:-1]`` (positions ``0 .. L - 2``). Do not modify it.
        last_hidden: ``[H]`` the target's final hidden state (the input of its output head, i.e.
            after the final norm) at position ``L - 2``: the one whose logits produced ``seq[-1]``.
            ``None`` when the prompt has a single token (nothing was processed yet), or when the
            target has no output-embedding module.
        budget: the deepest useful draft: nodes at depth ``>= budget`` (0-based) can never be emitted
            before ``max_length`` (the loop prunes them); ``0`` means no draft is useful.
        step: 0 for the first draft of the call, then 1, 2, ...
        tokens: ``seq`` as a host list (read it instead of ``seq`` on hot paths: no device read).
        verify_seconds: wall time of the last verification (forward and acceptance, which ends with a
            host read, so the device is synchronised); ``None`` before the first and for the first,
            which includes the prompt's prefill.
        verify_nodes: in a batch (:mod:`hf_cascade.core.batch`), the widest row's draft in that verification:
            every row's block is padded to it, so the step's cost is set by it, not by this row's own draft;
            ``None`` at batch 1 (the cost is the row's own).
        rows: in :meth:`TreeDrafter.on_accept` only, the last verification's rows of target logits
            (:class:`~hf_cascade.core.rows.TreeRows`; row 0 follows the root, row ``i + 1`` node ``i``) for
            drafters that learn from the target's distributions. Read the rows already computed
            (``rows.computed()``): any other row costs an output-head call. ``None`` elsewhere.
    """

    seq: torch.Tensor
    cache: Cache
    last_hidden: torch.Tensor | None
    budget: int
    step: int
    tokens: list[int] | None = None
    verify_seconds: float | None = None
    verify_nodes: int | None = None
    rows: object | None = None


class TreeDrafter(ABC):
    """Proposes drafts below the last verified token; one instance per ``generate()`` call."""

    #: ``True`` when every draft is one path: the core then verifies without a tree mask (any
    #: attention backend) and with the linear drafts' options (lossy target rules)
    linear: bool = False
    #: ``True`` when :meth:`draft_tree` reads ``state.cache`` (the target's K/V); the batched loop
    #: (:mod:`hf_cascade.core.batch`) then builds the row's cache for it, otherwise it passes ``None``
    #: (also with a budget of 0, and to :meth:`on_accept`: neither may read it)
    reads_target_cache: bool = False
    #: ``True`` when :meth:`on_accept` reads ``state.rows`` (the target's logits): the core then computes the
    #: rows acceptance reads in full, never their argmax alone (:mod:`hf_cascade.backends.cpu.argmax_screen`)
    reads_rows: bool = False
    #: with ``reads_rows``: ``k`` when the drafter reads only each row's ``k`` largest outputs, as probabilities
    #: relative to one another; rows exact at the outputs that can be among them (``-inf`` elsewhere) then serve
    #: it (:meth:`~hf_cascade.backends.cpu.argmax_screen.ArgmaxScreen.top`). ``None``: full rows.
    rows_top_k: int | None = None

    @abstractmethod
    def draft_tree(self, seq: torch.Tensor, state: TreeStep) -> tuple[TokenTree, torch.Tensor | None]:
        """A draft to follow ``seq`` (``[L]``; ``seq[-1]`` is the implicit root) and its draft probabilities.

        Returns ``(tree, draft_probs)``: ``draft_probs`` is ``[n, V]``, row ``i`` the distribution
        node ``i``'s token was *drawn from* (given its ancestors), each sibling an independent draw
        in node order; or ``None`` when the tree is a deterministic function of the context
        (suffix matches, top-k, beam search). Only sampling reads it (``sampling_tree_accept``);
        a wrong ``draft_probs`` breaks losslessness. An empty tree makes the step a plain decoding step.
        """

    # an optional hook, empty by default (not abstract): hence noqa B027, here and on on_accept
    def compile_forwards(self, compile_config) -> None:  # noqa: B027
        """Optional: this call's verification runs compiled (``compile_config``: the call's
        :class:`~transformers.CompileConfig`, ``None`` for its defaults); a drafter compiles its own forwards the same
        way (:func:`~hf_cascade.core.compiled.compiled_draft`). Default: they stay eager."""

    def reach(self, tree: TokenTree) -> list[float] | None:
        """Optional: the drafter's estimate, for its last draft ``tree`` (as returned by :meth:`draft_tree`, then
        pruned), of the probability that the target accepts at least ``k`` of its tokens, for ``k = 1 .. depth``
        (non-increasing). A batch's draft gate sizes the step's drafts by it
        (:meth:`~hf_cascade.core.payoff.DraftGate.width_for`); ``None`` (the default): no estimate, the gate
        judges drafting by the past steps' outcomes."""
        return None

    def on_accept(self, tree: TokenTree, acceptance: TreeAcceptance, state: TreeStep) -> None:  # noqa: B027
        """Feedback after a verification: ``acceptance.path`` (node indices, root -> leaf) and
        ``acceptance.bonus``; ``state`` is the *new* state (``seq`` ends with the emitted tokens,
        ``last_hidden`` is the hidden state that produced the last of them). Called after every
        step, the last one included (when that step was cut at EOS / ``max_length``, ``state.seq``
        holds only the tokens actually emitted)."""


__all__ = ["TreeDrafter", "TreeStep"]
