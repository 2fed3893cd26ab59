"""A drafter made of the target's own first layers (shared weights, no copy).

Until trained drafters exist for a target, its first ``n`` decoder layers with its final norm and
output head make a drafter that shares the vocabulary by construction (the "early exit" drafter
of LayerSkip / Draft & Verify). It is useful for parity tests and as a baseline neural level of a
cascade; with a 262k-token head it is not cheap, so trained drafters with reduced vocabularies
(see the training issue) are what make neural cascades pay on CPU.
"""

from __future__ import annotations

import copy

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel


def first_layers_drafter(target: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """A causal LM running the first ``num_layers`` layers of ``target`` and its head.

    The returned model shares every parameter tensor with ``target`` (memory is not duplicated);
    its config is ``target``'s with ``num_hidden_layers = num_layers`` (and ``layer_types`` cut).
    Nothing is moved: each shared tensor stays where the target keeps it (moving the drafter would move
    the target's own parameters with it). A target dispatched by accelerate (``device_map``, offload)
    lends its hooks to the drafter's modules of the same names, so its layers run where the target's do.
    """
    text_config = target.config.get_text_config()
    total = int(text_config.num_hidden_layers)
    if not 1 <= num_layers <= total:
        raise ValueError(f"num_layers must be in [1, {total}], got {num_layers}")
    config = copy.deepcopy(text_config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types)[:num_layers]
    with torch.device("meta"):
        drafter = AutoModelForCausalLM.from_config(config)
    source = dict(target.named_parameters())
    source.update(dict(target.named_buffers()))
    own = dict(drafter.named_parameters())
    own.update(dict(drafter.named_buffers()))
    missing = [name for name in own if name not in source]
    if missing:
        raise ValueError(f"Cannot map drafter weights {missing[:3]} onto {type(target).__name__}")
    drafter.load_state_dict({name: source[name] for name in own}, strict=False, assign=True)
    for module_name, module in drafter.named_modules():  # non-persistent buffers (e.g. rotary inv_freq)
        for buffer_name, buffer in list(module._buffers.items()):
            if buffer is not None and buffer.is_meta:
                module._buffers[buffer_name] = source[f"{module_name}.{buffer_name}" if module_name else buffer_name]
    drafter.tie_weights()
    drafter.config._name_or_path = f"{target.config._name_or_path or type(target).__name__}[:{num_layers} layers]"
    _share_dispatch(target, drafter)
    return drafter.eval()


def _share_dispatch(target: PreTrainedModel, drafter: PreTrainedModel) -> None:
    """Give ``drafter`` copies of the accelerate hooks of ``target``'s modules of the same names (device
    alignment, offload); a hook's init replaces the drafter's own ``Parameter`` objects, never the target's."""
    hooked = [(name, m._hf_hook) for name, m in target.named_modules() if getattr(m, "_hf_hook", None) is not None]
    if not hooked:
        return
    from accelerate.hooks import SequentialHook, add_hook_to_module

    modules = dict(drafter.named_modules())
    for name, hook in hooked:
        if name in modules:  # shallow copies: an offload weights_map is shared, not duplicated
            mine = SequentialHook(*map(copy.copy, hook.hooks)) if isinstance(hook, SequentialHook) else copy.copy(hook)
            add_hook_to_module(modules[name], mine)
    device_map = getattr(target, "hf_device_map", None)
    if device_map is not None:
        drafter.hf_device_map = {k: v for k, v in device_map.items() if k in modules or k == ""}
