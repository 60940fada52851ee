"""lit-embed's test plugin: each module adds one thing through the entry point its pyproject.toml declares.

Nothing is imported here: lit-embed imports each entry point's own module, and reads the command's line of help
from its source without importing it.
"""
