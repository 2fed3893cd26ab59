"""hf_cascade's lossless speculative decoding as a transformers ``custom_generate`` recipe.

``model.generate(**inputs, custom_generate=<this repo or folder>, trust_remote_code=True,
assistant_model=<hf_cascade assistant or checkpoint>, ...)`` returns what plain ``model.generate(**inputs, ...)``
returns (greedy: the same tokens; sampling: the same distribution), drafted and verified by hf_cascade's
decoding core. See the README next to this folder for the arguments.

How: transformers' ``generate`` takes ``custom_generate=<callable>`` as its decoding loop. This recipe calls
``generate`` again with ``assistant_model`` removed and a callable that runs ``assistant.decode(...)``, so
transformers prepares the generation config, logits processors, stopping criteria, attention mask and lengths
as for plain (non-assisted) decoding, and the callable decodes. transformers 4.57.6 to 5.25.0 do not pass
``streamer``, ``synced_gpus`` or ``tokenizer`` on to a callable, so the callable takes the first two from this
call; a call with ``tokenizer=`` (stop strings, token healing: transformers needs the tokenizer while it builds
the stopping criteria) goes through hf_cascade's ``generate(assistant_model=...)`` hook instead, the same core.

Self-contained on purpose (transformers copies this file into its modules cache and imports it alone).
"""

from __future__ import annotations

import os

import hf_cascade  # noqa: F401  (also installs hf_cascade's generate() hook, used for tokenizer= calls)
from hf_cascade import Assistant, CascadeAssistant, MaxGram, assistant_for
from hf_cascade.auto import checkpoint_kind
from hf_cascade.core.checks import refuse_unsupported_config


def default_assistant() -> Assistant:
    """The assistant used when none is given: Max-Gram alone (suffix matches of the text so far; no model)."""
    return CascadeAssistant([MaxGram()])


def resolve_assistant(assistant_model) -> Assistant:
    """An hf_cascade assistant as is; an hf_cascade checkpoint (a loaded GLIDE / ReDrafter head or drafter, a local
    path or a Hub repo id) as the assistant made for it; ``None`` as :func:`default_assistant`."""
    if assistant_model is None:
        return default_assistant()
    if isinstance(assistant_model, Assistant):
        return assistant_model
    if checkpoint_kind(assistant_model) is not None:
        return assistant_for(assistant_model)
    shown = assistant_model if isinstance(assistant_model, (str, os.PathLike)) else type(assistant_model).__name__
    raise ValueError(
        f"assistant_model={shown!r} is neither an hf_cascade assistant nor an hf_cascade checkpoint (a GLIDE or "
        "ReDrafter head or an hf_cascade drafter: a loaded model, a local path or a Hub repo id). For transformers' "
        "own assisted generation with an ordinary draft model, call generate() without custom_generate."
    )


def _auto_synced_gpus(model) -> bool:
    """transformers' default for ``synced_gpus=None`` (DeepSpeed ZeRO-3 or FSDP on more than one process)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return False
    from transformers.integrations import is_deepspeed_zero3_enabled
    from transformers.integrations.fsdp import is_fsdp_managed_module

    return bool(is_deepspeed_zero3_enabled() or is_fsdp_managed_module(model))


def _refuse_unsupported(model, generation_config) -> None:
    """What the assistants cannot honour, refused before the first forward: other decoding modes, transformers'
    own draft sources, other caches (:func:`hf_cascade.core.checks.refuse_unsupported_config`), stateful models
    (the core checks the rest)."""
    refuse_unsupported_config(generation_config)
    if getattr(model, "_is_stateful", False):
        raise ValueError(
            f"hf_cascade assistants need a model whose KV cache can be rolled back; {type(model).__name__} is stateful."
        )


def generate(model, assistant_model=None, streamer=None, synced_gpus=None, **kwargs):
    """``model.generate(**kwargs)`` decoded by ``assistant_model`` (see :func:`resolve_assistant`); the output is
    plain ``generate``'s: a tensor of sequences, or with ``return_dict_in_generate=True`` a
    ``GenerateDecoderOnlyOutput`` (sequences, and scores / logits when asked)."""
    assistant = resolve_assistant(assistant_model)
    generate_method = type(model).generate  # the class's, also when this recipe replaced model.generate

    if kwargs.get("tokenizer") is not None:
        # transformers drops `tokenizer` before building the stopping criteria of a callable decoding loop.
        return generate_method(model, assistant_model=assistant, streamer=streamer, synced_gpus=synced_gpus, **kwargs)

    synced = _auto_synced_gpus(model) if synced_gpus is None else bool(synced_gpus)
    call_streamer = streamer

    def decode(
        self,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        synced_gpus=False,
        streamer=None,
        **model_kwargs,
    ):
        """The decoding loop transformers calls once it has prepared the call (in place of ``_sample``)."""
        _refuse_unsupported(self, generation_config)
        return assistant.decode(
            target=self,
            input_ids=input_ids,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            generation_config=generation_config,
            streamer=streamer if streamer is not None else call_streamer,
            synced_gpus=bool(synced_gpus) or synced,
            model_kwargs=model_kwargs,
        )

    # `streamer` is passed on too: generate() puts the prompt into it before the loop, as for plain decoding.
    return generate_method(model, custom_generate=decode, streamer=streamer, synced_gpus=synced, **kwargs)
