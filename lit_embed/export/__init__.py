"""``lit-embed export``: a checkpoint as a folder ``transformers`` loads alone (``trust_remote_code=True``)."""
