"""Base classes of the objects users pass as ``generate(assistant_model=...)``.

An :class:`Assistant` holds settings and (references to) drafter models. For every ``generate()``
call the hook (:mod:`hf_cascade.hook`) calls :meth:`Assistant.decode` in place of transformers'
``_assisted_decoding``: it checks the inputs, binds the drafters to the target (device, dtype),
builds a fresh drafter (no state survives the call), engages the verification backend the switch
asks for (:mod:`hf_cascade.backends`) and runs the decoding core
(:func:`~hf_cascade.core.loop.speculative_decode`). The call's statistics are :attr:`last_stats`. The one
state kept across calls is the assistant's answer memory (``Policy(memory=...)``, :attr:`Assistant.memory`): the
emitted tokens of each finished call, added after it (:meth:`Assistant.remember`).

* :class:`TreeAssistant`: strategies whose drafts are token trees (GLIDE+CAPE, ReDrafter, Max-Gram
  trees) implement :meth:`TreeAssistant.new_drafter`.
* :class:`LinearAssistant`: strategies whose drafts are one path (the cascade, HSDDW) implement
  :meth:`LinearAssistant.build`, a transformers ``CandidateGenerator``
  (:class:`~hf_cascade.candidate.SpeculativeCandidateGenerator`). It runs in the core by default;
  ``assistant.loop = "transformers"`` runs it in transformers' own assisted loop instead.
"""

from __future__ import annotations

import threading

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel

from .backends import verification_session
from .candidate import ChainDrafter, SpeculativeCandidateGenerator
from .core.batch import speculative_decode_batch
from .core.checks import check_supported, is_batched
from .core.compiled import call_compiles
from .core.forward import check_attention_backend
from .core.loop import speculative_decode
from .core.stats import BatchStats, GenerationStats, synchronized_phases
from .core.stopping import stop_token_ids
from .core.strategy import TreeDrafter
from .drafters.memory import AnswerMemory
from .processors import row_processors

_MEMORY_LOCK = threading.Lock()  # an assistant's memory is made once, whichever thread asks first


class Assistant:
    """Base of all hf_cascade assistants.

    An assistant takes its drafter or head and a few keyword options: ``settings`` (its strategy's own, a frozen
    dataclass of its folder), ``policy`` (:class:`~hf_cascade.options.Policy`: what it does beyond its paper so that
    drafting pays), ``loading`` (:class:`~hf_cascade.options.Loading`: where its models come from and run) and
    ``cpu_kernels``.

    Attributes:
        cpu_kernels: the verification backend switch (:mod:`hf_cascade.backends`): ``None``
            (automatic: hf_cascade's CPU kernels exactly for float32 targets on CPU, unless the
            environment variable ``HF_CASCADE_CPU_KERNELS=0``), ``True`` or ``False``.
        last_stats: the statistics of the last ``generate()`` call.
    """

    last_stats: GenerationStats | None = None
    cpu_kernels: bool | None = None
    trees: bool = True  # drafts may branch (lossy target rules need linear drafts)
    _memory: AnswerMemory | None = None

    @property
    def memory(self) -> AnswerMemory | None:
        """The target's answers of this assistant's earlier calls (``Policy(memory=N)``: at most ``N`` tokens),
        ``None`` without memory. Its own: two assistants share nothing."""
        limit = getattr(getattr(self, "policy", None), "memory", 0)
        if not limit:
            return None
        with _MEMORY_LOCK:
            if self._memory is None or self._memory.max_tokens != limit:
                self._memory = AnswerMemory(limit)
            return self._memory

    def forget(self) -> None:
        """Forget the answers of earlier calls (nothing to forget without memory)."""
        if self._memory is not None:
            self._memory.forget()

    def remember(self, input_ids: torch.Tensor, output, generation_config: GenerationConfig) -> None:
        """After a call: each row's emitted tokens (``output``'s sequences after the prompt's ``input_ids``, up to
        and including the first stop token: the padding of a finished row is not an answer) join the memory."""
        memory = self.memory
        if memory is None:
            return
        sequences = output if isinstance(output, torch.Tensor) else output.sequences
        stop, _ = stop_token_ids(generation_config)
        for row in sequences[:, input_ids.shape[1] :].tolist():
            end = next((i + 1 for i, t in enumerate(row) if t in stop), len(row))
            memory.add(row[:end])

    @property
    def block_kind(self) -> str:
        """The name a verification backend keeps this assistant's steps under (its rows per head call are priced
        over them: :mod:`hf_cascade.backends.cpu.head_block`)."""
        return type(self).__name__

    # -- to implement ---------------------------------------------------------------------------
    def new_stats(self) -> GenerationStats:
        """A fresh statistics object for one call."""
        return GenerationStats()

    def new_drafter(
        self,
        target: PreTrainedModel,
        generation_config: GenerationConfig,
        logits_processor: LogitsProcessorList,
        stats: GenerationStats,
        target_tokenizer=None,
    ) -> TreeDrafter:
        """A fresh drafter for one ``generate()`` call (no state survives the call)."""
        raise NotImplementedError

    def bind(self, target: PreTrainedModel) -> None:
        """Prepare for ``target``, once per call: place the drafters on its device and dtype, measure what the
        payoff rules need from it (:mod:`hf_cascade.measure`)."""

    def drafts_branches(self) -> bool:
        """Whether this assistant's drafts may branch (verified with the core's 4-D tree mask); ``False`` when every
        draft is one path (its drafters are ``linear``). Checked against the target's attention backend before
        :meth:`bind` (:func:`~hf_cascade.core.forward.check_attention_backend`), so that a refusal runs no forward,
        not even the verification profile's measurement."""
        return self.trees

    def finish(self, drafter: TreeDrafter, stats: GenerationStats) -> GenerationStats:
        """The call's final statistics (a strategy may add its drafter's own records)."""
        return stats

    # -- called by the hook ---------------------------------------------------------------------
    def decode(
        self,
        target: PreTrainedModel,
        input_ids,
        logits_processor: LogitsProcessorList | None,
        stopping_criteria,
        generation_config: GenerationConfig,
        streamer=None,
        synced_gpus: bool = False,
        model_kwargs: dict | None = None,
        target_tokenizer=None,
    ):
        """Called by the hook in place of transformers' ``_assisted_decoding`` (same inputs, same outputs)."""
        with synchronized_phases(self.sync_phases):
            output = self._decode(
                target,
                input_ids,
                logits_processor,
                stopping_criteria,
                generation_config,
                streamer,
                synced_gpus,
                model_kwargs,
                target_tokenizer,
            )
        self.remember(input_ids, output, generation_config)
        return output

    @property
    def sync_phases(self) -> bool:
        """Whether this assistant's phase timings synchronise the accelerators (``Policy(sync_phases=True)``)."""
        policy = getattr(self, "policy", None)
        return bool(getattr(policy, "sync_phases", False))

    def _decode(
        self,
        target,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        streamer,
        synced_gpus,
        model_kwargs,
        target_tokenizer,
    ):
        model_kwargs = model_kwargs or {}
        processors = logits_processor or LogitsProcessorList()
        check_supported(
            target, input_ids, generation_config, model_kwargs, processors, synced_gpus, self.trees, streamer
        )
        batched = is_batched(input_ids, model_kwargs)
        # before binding measures; a batch of chains runs under flash too (a 2-D ownership mask hides its padding
        # and holes: hf_cascade.core.batch_state.ownership_mask), a tree nowhere without the core's 4-D mask
        check_attention_backend(target, tree_shaped=self.drafts_branches())
        self.bind(target)
        if batched:
            return self._decode_batch(
                target,
                input_ids,
                model_kwargs.get("attention_mask"),
                processors,
                stopping_criteria,
                generation_config,
                target_tokenizer,
                model_kwargs,
            )
        stats = self.new_stats()
        self.last_stats = stats
        drafter = self.new_drafter(target, generation_config, processors, stats, target_tokenizer)
        compiled = _compile_drafters([drafter], target, model_kwargs, generation_config)
        kernels = False if compiled else self.cpu_kernels
        try:
            return self._in_session(
                target,
                kernels,
                stats,
                lambda session: speculative_decode(
                    target,
                    drafter,
                    input_ids,
                    processors,
                    stopping_criteria,
                    generation_config,
                    stats,
                    streamer,
                    session.block_rows,
                    session.argmax_screen,
                    model_kwargs,
                ),
            )
        finally:
            self.last_stats = self.finish(drafter, stats)

    def _decode_batch(
        self,
        target,
        input_ids,
        attention_mask,
        processors,
        stopping_criteria,
        generation_config,
        target_tokenizer,
        model_kwargs=None,
    ):
        """A batch (or a padded row): one drafter and one statistics object per row, one batched loop
        (:mod:`hf_cascade.core.batch`); :attr:`last_stats` is a :class:`~hf_cascade.core.stats.BatchStats`."""
        stats = BatchStats(rows=[self.new_stats() for _ in range(input_ids.shape[0])])
        self.last_stats = stats
        drafters = [
            self.new_drafter(
                target, generation_config, row_processors(processors, b, padded=False), s, target_tokenizer
            )
            for b, s in enumerate(stats.rows)
        ]
        compiled = _compile_drafters(drafters, target, model_kwargs or {}, generation_config)
        kernels = False if compiled else self.cpu_kernels
        try:
            return self._in_session(
                target,
                kernels,
                stats,
                lambda session: speculative_decode_batch(
                    target,
                    drafters,
                    input_ids,
                    attention_mask,
                    processors,
                    stopping_criteria,
                    generation_config,
                    stats,
                    session.block_rows,
                    session.argmax_screen,
                    model_kwargs,
                ),
            )
        finally:
            stats.rows = [self.finish(d, s) for d, s in zip(drafters, stats.rows)]

    def _in_session(self, target, kernels, stats, decode):
        """``decode(session)`` inside the call's verification session; the call's steps handed back to it after
        (the CPU backend prices this assistant's block of head rows over them)."""
        with verification_session(target, kernels, self.block_kind) as session:
            try:
                return decode(session)
            finally:
                session.record_steps(stats)

    def target_session(self, target: PreTrainedModel):
        """The verification backend for one call (see :mod:`hf_cascade.backends`)."""
        return verification_session(target, self.cpu_kernels)


def _compile_drafters(drafters, target, model_kwargs: dict, generation_config) -> bool:
    """Whether this call's verification runs compiled (:func:`~hf_cascade.core.compiled.call_compiles`); if so, the
    drafters' own forwards compile with the call's ``CompileConfig`` (``compile_forwards``, where a drafter has them).
    The CPU kernels then stay off: compiling is what replaces them."""
    compiled = call_compiles(target, model_kwargs, generation_config)
    for drafter in drafters if compiled else ():
        if hasattr(drafter, "compile_forwards"):
            drafter.compile_forwards(getattr(generation_config, "compile_config", None))
    return compiled


class TreeAssistant(Assistant):
    """Base of assistants whose drafts are token trees. Greedy outputs equal plain ``generate``;
    sampling is exact given correct ``draft_probs`` (see :meth:`TreeDrafter.draft_tree`)."""

    def candidate_generator(self, *args, **kwargs):
        raise RuntimeError(
            f"{type(self).__name__} is a tree assistant: transformers' assisted loop verifies one linear candidate, "
            "so it runs in hf_cascade's decoding core only, which the hook selects (is it installed? `import "
            "hf_cascade`)."
        )


class LinearAssistant(Assistant):
    """Base of assistants whose drafts are one path, written as a transformers ``CandidateGenerator``
    (:meth:`build`). ``loop``: ``"core"`` (default) runs it in hf_cascade's decoding core;
    ``"transformers"`` in transformers' ``_assisted_decoding`` (same outputs)."""

    trees = False
    loop: str = "core"

    def build(
        self, target, generation_config, logits_processor, stats, target_tokenizer=None
    ) -> SpeculativeCandidateGenerator:
        raise NotImplementedError

    def new_drafter(self, target, generation_config, logits_processor, stats, target_tokenizer=None) -> TreeDrafter:
        return ChainDrafter(self.build(target, generation_config, logits_processor, stats, target_tokenizer))

    def candidate_generator(
        self,
        target: PreTrainedModel,
        input_ids,
        generation_config: GenerationConfig,
        logits_processor: LogitsProcessorList | None,
        model_kwargs: dict,
        target_tokenizer=None,
    ) -> SpeculativeCandidateGenerator:
        """transformers' loop (``loop = "transformers"``): called by the hook once per ``generate()`` call."""
        check_supported(target, input_ids, generation_config, model_kwargs, logits_processor, trees=False, batch=False)
        self.bind(target)
        stats = self.new_stats()
        with synchronized_phases(self.sync_phases):  # its phase timer is built here
            generator = self.build(target, generation_config, logits_processor, stats, target_tokenizer)
        self.last_stats = stats
        return generator
