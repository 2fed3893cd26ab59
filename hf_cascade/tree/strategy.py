"""The contract of tree strategies: a :class:`TreeDrafter` proposes a token tree, our own loop
(:mod:`hf_cascade.tree.decode`) verifies it in one target forward.

transformers' assisted loop verifies one linear candidate, so a :class:`TreeAssistant` does not go
through it: the hook (:mod:`hf_cascade.hook`) routes ``generate(..., assistant_model=<TreeAssistant>)``
from ``GenerationMixin._assisted_decoding`` to :meth:`TreeAssistant.decode`, which runs
:func:`~hf_cascade.tree.decode.tree_decode` with the generation's own logits processors, stopping
criteria, streamer and output options.

A strategy implements two classes:

* a :class:`TreeDrafter`: ``draft_tree(seq, state) -> (TokenTree, draft_probs | None)`` and the
  feedback ``on_accept(tree, acceptance, state)``; one is built per ``generate()`` call by
* a :class:`TreeAssistant` subclass (what users pass as ``assistant_model``), through
  :meth:`TreeAssistant.new_drafter`.

What the target left behind is handed to the drafter as a :class:`TreeStep`, at no extra target
forward: the verified sequence, the target's ``DynamicCache`` (GLIDE reads it) and the target's
last hidden state (ReDrafter drafts from it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import Cache, GenerationConfig, LogitsProcessorList, PreTrainedModel

from ..assistant import Assistant
from ..stats import GenerationStats
from .accept import TreeAcceptance
from .structure import TokenTree


@dataclass
class TreeStep:
    """The target's state between two verifications (read-only for drafters).

    Attributes:
        seq: ``[L]`` every verified token (prompt and generated). ``seq[-1]`` is the root of the
            next tree: the target has not processed it yet.
        cache: the target's ``DynamicCache`` (built without a config, every layer keeps every
            position), holding the K/V of ``seq[:-1]`` (positions ``0 .. L - 2``). Do not modify it.
        last_hidden: ``[H]`` the target's final hidden state (the input of its output head, i.e.
            after the final norm) at position ``L - 2``: the one whose logits produced ``seq[-1]``.
            ``None`` when the prompt has a single token (nothing was processed yet), or when the
            target has no output-embedding module.
        budget: the deepest useful tree: nodes at depth ``>= budget`` (0-based) can never be emitted
            before ``max_length`` (the loop prunes them); ``0`` means no tree is useful.
        step: 0 for the first draft of the call, then 1, 2, ...
    """

    seq: torch.Tensor
    cache: Cache
    last_hidden: torch.Tensor | None
    budget: int
    step: int


class TreeDrafter(ABC):
    """Proposes token trees below the last verified token; one instance per ``generate()`` call."""

    @abstractmethod
    def draft_tree(self, seq: torch.Tensor, state: TreeStep) -> tuple[TokenTree, torch.Tensor | None]:
        """A tree to follow ``seq`` (``[L]``; ``seq[-1]`` is the implicit root) and its draft probabilities.

        Returns ``(tree, draft_probs)``: ``draft_probs`` is ``[n, V]``, row ``i`` the distribution
        node ``i``'s token was *drawn from* (given its ancestors), each sibling an independent draw
        in node order; or ``None`` when the tree is a deterministic function of the context
        (suffix matches, top-k, beam search). Only sampling reads it (``sampling_tree_accept``);
        a wrong ``draft_probs`` breaks losslessness. An empty tree makes the step a plain decoding step.
        """

    def on_accept(self, tree: TokenTree, acceptance: TreeAcceptance, state: TreeStep) -> None:
        """Feedback after a verification: ``acceptance.path`` (node indices, root -> leaf) and
        ``acceptance.bonus``; ``state`` is the *new* state (``seq`` ends with the emitted tokens,
        ``last_hidden`` is the hidden state that produced the last of them). Called after every
        step, the last one included (when that step was cut at EOS / ``max_length``, ``state.seq``
        holds only the tokens actually emitted)."""


@dataclass
class TreeStats(GenerationStats):
    """:class:`~hf_cascade.stats.GenerationStats` of a tree strategy, plus the trees themselves.

    ``target_calls`` counts tree verifications (each emits ``accepted + 1`` tokens; the prefill of
    the prompt emits none and is timed in ``phase_seconds["prefill"]``); ``draft_len_per_call`` is
    the number of tree nodes verified at each call and ``acceptance_by_position`` is acceptance by
    *depth* (position ``i``: trees deeper than ``i``, and paths accepted beyond depth ``i``).

    Attributes:
        tree_sizes: nodes per verified tree (= ``draft_len_per_call``).
        tree_depths: depth (longest root -> leaf path) of each tree.
        tree_leaves: leaves (branches) of each tree.
        accepted_paths: accepted node indices per call (before an EOS / ``max_length`` cut).
        head_rows: rows whose logits the target's output head computed per call (of the
            ``n + 1`` verified; see :mod:`hf_cascade.tree.rows`).
        head_calls: output-head calls per target call (each reads the whole head weight).
    """

    tree_depths: list[int] = field(default_factory=list)
    tree_leaves: list[int] = field(default_factory=list)
    accepted_paths: list[list[int]] = field(default_factory=list)
    head_rows: list[int] = field(default_factory=list)
    head_calls: list[int] = field(default_factory=list)

    @property
    def tree_sizes(self) -> list[int]:
        return list(self.draft_len_per_call)

    @property
    def accepted_length_per_step(self) -> list[int]:
        return list(self.accepted_per_call)

    def record_tree_step(self, tree: TokenTree, acceptance: TreeAcceptance, emitted: int, head_rows: int | None = None,
                         head_calls: int = 1) -> None:
        """One verification of ``tree`` that emitted ``emitted`` tokens (``>= 1``), for which the
        output head computed ``head_rows`` rows (default: all ``n + 1``) in ``head_calls`` calls."""
        n = tree.num_nodes
        depth = int(tree.depth.max()) + 1 if n else 0
        self.target_calls += 1
        self.accepted_per_call.append(emitted - 1)
        self.draft_len_per_call.append(n)
        self.acceptance_by_position.record(depth, emitted - 1)
        self.tree_depths.append(depth)
        self.tree_leaves.append(len(tree.paths()) if n else 0)
        self.accepted_paths.append(acceptance.path.tolist())
        self.head_rows.append(n + 1 if head_rows is None else head_rows)
        self.head_calls.append(int(head_calls))

    def to_dict(self) -> dict:
        out = super().to_dict()
        out.update({
            "tree_sizes": self.tree_sizes,
            "tree_depths": list(self.tree_depths),
            "tree_leaves": list(self.tree_leaves),
            "accepted_paths": [list(p) for p in self.accepted_paths],
            "head_rows": list(self.head_rows),
            "head_calls": list(self.head_calls),
        })
        return out


class TreeAssistant(Assistant):
    """Base of assistants whose drafts are token trees, decoded by :mod:`hf_cascade.tree.decode`.

    Subclasses implement :meth:`new_drafter`. Greedy outputs equal plain ``generate``; sampling is
    lossless given correct ``draft_probs`` (see :meth:`TreeDrafter.draft_tree`).
    """

    last_stats: TreeStats | None = None

    def new_drafter(
        self, target: PreTrainedModel, generation_config: GenerationConfig, logits_processor: LogitsProcessorList
    ) -> TreeDrafter:
        """A fresh drafter for one ``generate()`` call (no state survives the call)."""
        raise NotImplementedError

    def candidate_generator(self, *args, **kwargs):
        raise RuntimeError(
            f"{type(self).__name__} is a tree assistant: it runs its own decoding loop, which the hf_cascade "
            "hook selects in GenerationMixin._assisted_decoding (is the hook installed? `import hf_cascade`)."
        )

    def decode(
        self,
        target: PreTrainedModel,
        input_ids: torch.Tensor,
        logits_processor: LogitsProcessorList | None,
        stopping_criteria,
        generation_config: GenerationConfig,
        streamer=None,
        synced_gpus: bool = False,
        model_kwargs: dict[str, Any] | None = None,
    ):
        """Called by the hook in place of transformers' ``_assisted_decoding`` (same inputs, same outputs)."""
        from .decode import check_tree_supported, tree_decode

        model_kwargs = model_kwargs or {}
        self.check_supported(target, input_ids, generation_config, model_kwargs)
        check_tree_supported(input_ids, logits_processor, generation_config, synced_gpus, model_kwargs)
        stats = TreeStats()
        self.last_stats = stats
        drafter = self.new_drafter(target, generation_config, logits_processor or LogitsProcessorList())
        return tree_decode(
            target, drafter, input_ids, logits_processor, stopping_criteria, generation_config, stats, streamer
        )
