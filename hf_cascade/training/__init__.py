"""Drafter training: distillation data (:mod:`.distill`, :mod:`.store`), reduced vocabularies
(:mod:`.vocab`) and the trainers behind ``hf-cascade train``."""

from .distill import DistillConfig, Prompt, distill, training_prompts
from .store import DistillStore, Record

__all__ = ["DistillConfig", "DistillStore", "Prompt", "Record", "distill", "training_prompts"]
