"""Sweeps: the papers' grids of runs (models x tasks x seeds, a searched grid with the best on validation,
stages that start from earlier stages' results) from one sweep file, resumable, and reported as tables.

:mod:`~lit_embed.sweeps.plan` reads the file into runs; :mod:`~lit_embed.sweeps.outcomes` says what each run
left on disk and which earlier run a reference takes; :mod:`~lit_embed.sweeps.launch` runs them here (one at a
time, or one per GPU); :mod:`~lit_embed.sweeps.slurm` submits them as job arrays; ``lit-embed report
SWEEP_FOLDER`` turns them into tables (:mod:`~lit_embed.sweeps.progress`).
"""
