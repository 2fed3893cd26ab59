"""Tried, not kept (see README.md here): transformers' DynamicCache with layers that append in place.

``DynamicLayer.update`` concatenates, copying every layer's whole cache at every forward. This layer keeps keys and
values in a buffer with spare columns (grown by half when full), writes new columns into it and exposes the filled
columns as a view; tensors put in by others (compaction, dropped rows) are adopted into a new buffer at the next
update, and a ``crop`` (a shorter view of the buffer) stays the buffer's own."""
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_SPARE = 64


class GrowingLayer(DynamicLayer):
    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self._key_buffer = _append(self.keys, getattr(self, "_key_buffer", None), key_states)
        self.values, self._value_buffer = _append(self.values, getattr(self, "_value_buffer", None), value_states)
        return self.keys, self.values

    def reset(self):
        self._key_buffer = self._value_buffer = None
        super().reset()


def _append(current, buffer, new):
    filled = current.shape[-2] if current is not None and current.numel() else 0
    total = filled + new.shape[-2]
    if not _views(current, buffer, filled) or buffer.shape[-2] < total:
        grown = new.new_empty(*new.shape[:-2], total + max(total // 2, MIN_SPARE), new.shape[-1])
        if filled:
            grown[..., :filled, :].copy_(current)
        buffer = grown
    buffer[..., filled:total, :].copy_(new)
    return buffer[..., :total, :], buffer


def _views(current, buffer, filled):
    if buffer is None or not filled:
        return False
    return (current.data_ptr() == buffer.data_ptr() and current.stride() == buffer.stride()
            and current.shape[:-2] == buffer.shape[:-2] and current.shape[-1] == buffer.shape[-1])


def growing_cache():
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer
    return cache
