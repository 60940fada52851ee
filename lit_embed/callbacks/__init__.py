"""Callbacks: the papers' figures and results.json (on in the shipped trainer configs), and the plots."""

from lit_embed.callbacks.analysis import EmbeddingAnalysis
from lit_embed.callbacks.checkpoint import PeriodicCheckpoint
from lit_embed.callbacks.efficiency import EfficiencyMonitor
from lit_embed.callbacks.results import ResultsWriter

__all__ = ["EfficiencyMonitor", "EmbeddingAnalysis", "PeriodicCheckpoint", "ResultsWriter"]
