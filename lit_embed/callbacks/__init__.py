"""Callbacks every run gets from the shipped trainer configs: the papers' figures and results files."""

from lit_embed.callbacks.efficiency import EfficiencyMonitor
from lit_embed.callbacks.results import ResultsWriter

__all__ = ["EfficiencyMonitor", "ResultsWriter"]
