"""``lit-embed analyze --ckpt CKPT``: the k-sub-embedding paper's figures of a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lit_embed.commands.parsing import ArgumentParser
from lit_embed.errors import ConfigError
from lit_embed.hub import trusting_remote_code
from lit_embed.runs.folders import checkpoints_taken, start_checkpoint
from lit_embed.storage.files import atomic_folder, check_output, writing


def main(argv: list[str]) -> int:
    """The k-sub-embedding paper's figures (PCA of the embedding, layer-wise similarity) of a checkpoint."""
    parser = ArgumentParser(
        allow_abbrev=False,
        prog="lit-embed analyze",
        description="PCA of the embedding vectors, layer-wise hidden-state similarity and per-layer PCA of hidden states "
        "of a checkpoint (k-sub-embedding Figures 2, 3 and 4-10): PNGs, analysis.json, and TensorBoard figures in the run folder.",
    )
    parser.add_argument("--ckpt", required=True, help="a checkpoint written by lit-embed fit, its run folder, or its experiment folder (the newest finished run)")
    parser.add_argument("--text", default="sample-corpus", help="text file for the hidden states (default: the shipped sample corpus)")
    parser.add_argument("--tokenizer", help="tokenizer name or folder (default: the one the run's data used)")
    parser.add_argument("--max-texts", type=int, default=200, help="texts to run through the model (default 200)")
    parser.add_argument("--points", type=int, default=10_000, help="vectors drawn in the scatter (default 10000)")
    parser.add_argument("--out", help="output folder (default: RUN_DIR/analysis beside the checkpoint's folder)")
    parser.add_argument("--no-tensorboard", action="store_true", help="do not write the figures to TensorBoard")
    parser.add_argument("--trust_remote_code", action="store_true", help="let the tokenizer run the code it ships "
                        "(LINE's Japanese tokenizer); what the checkpoint records never grants it")
    args = parser.parse_args(argv)
    # torch comes with these: imported once the arguments parse, so that --help and a typo answer without it
    from torch.utils.tensorboard import SummaryWriter

    from lit_embed.analysis.embedding_space import (
        ANALYSIS_DIR,
        ANALYSIS_FILES,
        analyse,
        draw,
        earlier_analysis,
        read_texts,
        save_analysis,
    )
    from lit_embed.checkpoints.format import load_model, recorded_tokenizer
    from lit_embed.models.base import EmbeddingModule

    if args.max_texts < 1 or args.points < 1:
        raise ConfigError(f"--max-texts={args.max_texts} and --points={args.points} must be positive")
    ckpt = start_checkpoint(args.ckpt)
    run_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
    out = Path(args.out) if args.out else run_dir / ANALYSIS_DIR
    inputs = [args.ckpt, ckpt, args.text, args.tokenizer]  # what it reads: never inside the --out it replaces
    check_output(out, True, earlier_analysis, inputs)  # before the work
    model, checkpoint = load_model(ckpt)
    if not isinstance(model, EmbeddingModule):
        raise ConfigError(f"{args.ckpt} holds a {type(model).__name__}, not a lit-embed EmbeddingModule: nothing to analyse")
    tokenizer = args.tokenizer or recorded_tokenizer(checkpoint)
    if tokenizer is None and model.embedding.reads_tokenizer:
        raise ConfigError(f"{args.ckpt} does not name the tokenizer its data used: pass --tokenizer NAME_OR_FOLDER")
    texts = read_texts(args.text, args.max_texts)
    if not texts:
        raise ConfigError(f"--text {args.text} holds no text: give a file with at least one non-empty line")
    with trusting_remote_code(args.trust_remote_code, "--trust_remote_code"):
        result = analyse(model, texts, tokenizer, points=args.points)
    result["checkpoints_taken"] = checkpoints_taken()
    # The folder appears whole (a stop or a full disk midway leaves the earlier one, or none), then the figures go to
    # TensorBoard, only inside the run's own event folder: anywhere else they would show as a stray run.
    figures = draw(result)
    atomic_folder(out, True, lambda folder: save_analysis(result, folder, figures=figures), replaceable=earlier_analysis,
                  inputs=[*inputs, tokenizer])
    paths = [out / name for name in sorted(ANALYSIS_FILES)]
    is_run = any(run_dir.glob("events.out.tfevents.*"))
    if not args.no_tensorboard and is_run:
        with writing(run_dir):  # TensorBoard appends to its event file: on a full disk, name the run folder
            writer = SummaryWriter(log_dir=str(run_dir))
            try:
                for name, figure in figures.items():
                    writer.add_figure(f"analysis/{name}", figure, global_step=int(checkpoint.get("global_step", 0)))
            finally:
                writer.close()
    print(json.dumps(_printable(result), indent=2))
    print("\n".join(f"wrote {p}" for p in paths))
    if not args.no_tensorboard and not is_run:
        print(f"no TensorBoard run folder at {run_dir}: the figures are in {out} only")
    return 0


def _printable(result: dict) -> dict[str, Any]:
    ratios = result["pca"]["explained_variance_ratio"]
    return {
        "strategy": result["strategy"],
        "r_3": round(float(ratios[:3].sum()), 4),
        "similarity": [{k: round(v, 4) if isinstance(v, float) else v for k, v in layer.items()}
                       for layer in result["similarity"]["layers"]],
    }
