"""``lit-embed export``: a checkpoint as a folder ``transformers`` loads alone (the backbone's own architecture for a
dense model, lit-embed's code with ``trust_remote_code=True`` for a compact strategy)."""
