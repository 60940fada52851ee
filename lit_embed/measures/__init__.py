"""What a run is measured by and how a measure is shown: the papers' figures against a baseline and the bytes at
inference (:mod:`~lit_embed.measures.accounting`), the task metrics' names (:mod:`~lit_embed.measures.metric_names`),
and tables of them as Markdown, CSV or LaTeX (:mod:`~lit_embed.measures.tables`). Imports no torch."""
