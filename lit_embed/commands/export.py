"""``lit-embed export --ckpt CKPT --out DIR``: a checkpoint as a folder transformers loads alone."""

from __future__ import annotations

import json

from lit_embed.commands.parsing import ArgumentParser


def main(argv: list[str]) -> int:
    """A checkpoint as a folder transformers loads alone, to share on the hub."""
    parser = ArgumentParser(prog="lit-embed export", allow_abbrev=False, description=(
        "Write a checkpoint as a folder that transformers loads without lit-embed. A dense model (or, with "
        "--materialise, any strategy's table in full) is the backbone's own architecture: "
        "AutoModelForSequenceClassification.from_pretrained(OUT), pipeline(..., model=OUT); a compact strategy "
        "keeps its size with its own code: from_pretrained(OUT, trust_remote_code=True)."))
    parser.add_argument("--ckpt", required=True, help="a lit-embed checkpoint (.ckpt), a run folder or an experiment folder")
    parser.add_argument("--out", required=True, help="the folder to write (must not exist, unless --overwrite)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it is an earlier export")
    parser.add_argument("--tokenizer", help="the tokenizer the weights expect, where the checkpoint records none")
    parser.add_argument("--trust_remote_code", action="store_true", help="let the tokenizer run the code it ships "
                        "(LINE's Japanese tokenizer); what the checkpoint records never grants it")
    parser.add_argument("--materialise", action="store_true", help="write a compact strategy's table out in full "
                        "(vocabulary x hidden floats) and export the backbone's own architecture, without custom code")
    parser.add_argument("--push_to_hub", "--push-to-hub", metavar="REPO", help="then upload the folder to the "
                        "hub's model repository REPO (USER/NAME; created if missing), with your token "
                        "(hf auth login, or HF_TOKEN); lit_embed_export.json, which holds local paths, stays here")
    args = parser.parse_args(argv)
    from lit_embed.export.folder import check_push, export, push  # torch: once the arguments parse

    if args.push_to_hub:
        check_push(args.push_to_hub)
    out = export(args.ckpt, args.out, overwrite=args.overwrite, tokenizer=args.tokenizer,
                 trust_remote_code=args.trust_remote_code, materialise=args.materialise)
    architectures = json.loads((out / "config.json").read_text()).get("architectures") or ["LitEmbedModel"]
    custom = architectures[0].startswith("LitEmbed")
    auto = "AutoModelForSequenceClassification" if architectures[0].endswith("ForSequenceClassification") else "AutoModel"
    print(f"wrote {out} ({architectures[0]}): load it with {auto}.from_pretrained({str(out)!r}"
          f"{', trust_remote_code=True' if custom else ''})")
    if args.push_to_hub:
        print(f"pushed to {push(out, args.push_to_hub)}")
    return 0
