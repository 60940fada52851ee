"""``lit-embed export --ckpt CKPT --out DIR``: a checkpoint as a folder transformers loads alone."""

from __future__ import annotations

import json

from lit_embed.commands.parsing import ArgumentParser
from lit_embed.export.folder import export


def main(argv: list[str]) -> int:
    """A checkpoint as a folder transformers loads alone (trust_remote_code=True), to share on the hub."""
    parser = ArgumentParser(prog="lit-embed export", allow_abbrev=False, description=(
        "Write a checkpoint as a folder that transformers loads without lit-embed: "
        "AutoModel (or AutoModelForSequenceClassification).from_pretrained(OUT, trust_remote_code=True)."))
    parser.add_argument("--ckpt", required=True, help="a lit-embed checkpoint (.ckpt), a run folder or an experiment folder")
    parser.add_argument("--out", required=True, help="the folder to write (must not exist, unless --overwrite)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it is an earlier export")
    parser.add_argument("--tokenizer", help="the tokenizer the weights expect, where the checkpoint records none")
    parser.add_argument("--trust_remote_code", action="store_true", help="let the tokenizer run the code it ships "
                        "(LINE's Japanese tokenizer); what the checkpoint records never grants it")
    args = parser.parse_args(argv)
    out = export(args.ckpt, args.out, overwrite=args.overwrite, tokenizer=args.tokenizer,
                 trust_remote_code=args.trust_remote_code)
    architectures = json.loads((out / "config.json").read_text()).get("architectures") or []
    auto = "AutoModelForSequenceClassification" if "LitEmbedForSequenceClassification" in architectures else "AutoModel"
    print(f"wrote {out}: load it with {auto}.from_pretrained({str(out)!r}, trust_remote_code=True)")
    return 0
