"""``lit-embed params --config FILE``: a config's parameter counts against the dense baseline."""

from __future__ import annotations

import json

from lit_embed.hub import shapes_only
from lit_embed.measures.accounting import format_parameters, parameter_report

HELP = """usage: lit-embed params --config FILE [--json] [--model.init_args.KEY VALUE ...]

Build a config's model only (no data, no download, no training) and print its parameter counts against the
dense baseline of the same backbone and vocabulary: total, embedding, PCR_All, PCR_Emb, PoEP.

options:
  --config FILE   a lit-embed config (several compose, as for fit)
  --json          print the report as JSON instead of a table
  --model.*       any model option, as `lit-embed fit --help` lists them
                  (e.g. --model.init_args.embedding configs/embedding/subspace_4.yaml)
"""


def main(argv: list[str]) -> int:
    """Count a config's parameters against the dense baseline (PCR, PoEP), building the model only."""
    if {"-h", "--help"} & set(argv):
        print(HELP, end="")
        return 0
    as_json = "--json" in argv
    rest = [a for a in argv if a != "--json"]
    from lit_embed.commands.lightning import ModelOnlyCLI  # Lightning: only to build a model

    with shapes_only():
        cli = ModelOnlyCLI(args=rest, run=False, prog="lit-embed params")
    if cli.model.embedding.shaped_by_prepare:
        cli.model.embedding.prepare()  # e.g. naive k-means: computes (or reads the cached) codes from the matrix
    report = parameter_report(cli.model)
    print(json.dumps(report, indent=2) if as_json else format_parameters(report))
    return 0
