"""A run and its folder: how run folders are claimed and found (:mod:`~lit_embed.runs.folders`), the logger every
run gets (:mod:`~lit_embed.runs.logger`), its ``results.json`` (:mod:`~lit_embed.runs.results`) and how a run stops
on a signal (:mod:`~lit_embed.runs.signals`). Only the logger imports Lightning, and only when it is asked for."""


def __getattr__(name: str):
    """``lit_embed.runs.RunLogger``: the logger's name in configs, the one every run's ``config.yaml`` records (as it
    did before the logger's module moved into this package), given without importing Lightning for the folders."""
    if name == "RunLogger":
        from lit_embed.runs.logger import RunLogger

        return RunLogger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
