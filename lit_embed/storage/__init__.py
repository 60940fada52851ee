"""Files on disk, written and read safely: atomic writes and output folders (:mod:`~lit_embed.storage.files`), PyTorch
files read as plain data (:mod:`~lit_embed.storage.plain_data`) and the cache of what is computed once
(:mod:`~lit_embed.storage.cache`). Below every package that writes or reads a file; imports no Lightning."""
