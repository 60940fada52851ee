"""Callbacks: the papers' figures and results.json (on in the shipped trainer configs), the plots, and the
guard every CLI run gets (atomic checkpoints, folders of its own, a clean stop on a signal)."""

from lit_embed.analysis.callback import EmbeddingAnalysis
from lit_embed.callbacks.efficiency import EfficiencyMonitor
from lit_embed.callbacks.guard import RunGuard
from lit_embed.callbacks.predictions import PredictionWriter
from lit_embed.callbacks.results_writer import ResultsWriter

__all__ = ["EfficiencyMonitor", "EmbeddingAnalysis", "PredictionWriter", "ResultsWriter", "RunGuard"]
