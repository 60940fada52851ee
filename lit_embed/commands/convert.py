"""``lit-embed convert --trust IN OUT``: a checkpoint you trust rewritten as tensors and plain data, so that every
other command reads it (:func:`~lit_embed.checkpoints.format.read_checkpoint` unpickles no Python object)."""

from __future__ import annotations

from lit_embed.commands.parsing import ArgumentParser


def main(argv: list[str]) -> int:
    """convert --trust IN OUT: rewrite a checkpoint you trust as tensors and plain data (unpickling it runs its code)."""
    parser = ArgumentParser(prog="lit-embed convert", allow_abbrev=False,
                                     description="Rewrite a checkpoint you trust as tensors and plain data: unpickle IN "
                                                 "trusting it (this runs whatever code it holds) and write OUT.")
    parser.add_argument("--trust", action="store_true", required=True,
                        help="required: you trust IN, since unpickling it runs whatever code it holds")
    parser.add_argument("source", metavar="IN")
    parser.add_argument("target", metavar="OUT", help="the file to write: never IN, nor a file that exists unless --overwrite")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT where it exists (never IN)")
    args = parser.parse_args(argv)
    from lit_embed.checkpoints.format import convert  # torch: once the arguments parse

    convert(args.source, args.target, overwrite=args.overwrite)
    print(f"wrote {args.target}")
    return 0
