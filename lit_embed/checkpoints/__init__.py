"""Checkpoints and what they record: the one reader and writer of lit-embed checkpoints
(:mod:`~lit_embed.checkpoints.format`), the one reader of the configs that files record
(:mod:`~lit_embed.checkpoints.recorded`), and Lightning's checkpoint writer made atomic
(:mod:`~lit_embed.checkpoints.atomic_io`)."""
