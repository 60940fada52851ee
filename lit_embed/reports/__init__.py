"""``lit-embed report``'s library: the papers' tables from run folders (:mod:`~lit_embed.reports.papers`) and the
zoo's picture of score against bytes (:mod:`~lit_embed.reports.pareto`)."""
