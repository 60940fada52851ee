"""A command: ``lit-embed vocab TEXT...``."""

from __future__ import annotations

from lit_embed.commands.parsing import ArgumentParser
from lit_embed.hub import load_tokenizer


def vocab(argv: list[str]) -> int:
    """Print the tokens and ids a tokenizer gives each text (a plugin's command).

    Imported only when it runs: ``lit-embed --help`` shows this line without importing it.
    """
    parser = ArgumentParser(prog="lit-embed vocab", allow_abbrev=False, description="The tokens and ids of each text.")
    parser.add_argument("texts", nargs="+", metavar="TEXT")
    parser.add_argument("--tokenizer", default="all-MiniLM-L6-v2", help="a hub name or folder (default %(default)s)")
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer(args.tokenizer)
    for text in args.texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        print(" ".join(f"{token}:{i}" for token, i in zip(tokenizer.convert_ids_to_tokens(ids), ids)))
    return 0
