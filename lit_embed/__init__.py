"""lit-embed: PyTorch Lightning templates for research on compact token embeddings."""

__version__ = "0.1.0"
