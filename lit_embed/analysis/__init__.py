"""The embedding-space analysis of the k-sub-embedding paper: what it computes and draws
(:mod:`~lit_embed.analysis.embedding_space`), and the callback that runs it when training ends
(:mod:`~lit_embed.analysis.callback`; ``lit-embed analyze`` runs it on a checkpoint)."""
