"""Drafters: the statistical Max-Gram and wrappers for neural draft models."""

from .corpus import CorpusNGrams
from .maxgram import BigramTable, MaxGram, longest_suffix_match
from .neural import NeuralLevel, check_same_vocabulary

__all__ = ["BigramTable", "CorpusNGrams", "MaxGram", "NeuralLevel", "check_same_vocabulary", "longest_suffix_match"]
