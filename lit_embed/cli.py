"""``lit-embed``: LightningCLI for fit/validate/test/predict, plus ``params``, ``report``, ``analyze``
and ``compress``.

Strategies, data modules and models are chosen by ``class_path`` in YAML; jsonargparse resolves
them, so a user's own strategy is one class in an importable module and one YAML file.
"""

from __future__ import annotations

import importlib
import json
import sys
import warnings

import pytorch_lightning as pl
from pytorch_lightning.cli import LightningCLI

from lit_embed.accounting import format_report, parameter_report
from lit_embed.hub import shapes_only

USER_ERRORS = (ValueError, FileNotFoundError, OSError, RuntimeError, KeyError)


# We hand LightningCLI the arguments ourselves (after taking our own subcommands off).
warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")


class LitEmbedCLI(LightningCLI):
    """LightningCLI in subclass mode; configs compose by naming piece files (see ``configs/``)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("parser_kwargs", {"default_env": False})
        super().__init__(pl.LightningModule, pl.LightningDataModule, *args, subclass_mode_model=True,
                         subclass_mode_data=True, auto_configure_optimizers=False, **kwargs)

    def after_fit(self) -> None:
        """Fine-tuning data with test sets: test the selected checkpoint (the best ``val/score``
        where a ModelCheckpoint monitors it, else the last weights) right after ``fit``."""
        if not hasattr(self.datamodule, "test_dataloader") or not hasattr(self.datamodule, "eval_set_names"):
            return
        if self.trainer.interrupted:
            return
        callback = self.trainer.checkpoint_callback
        best = callback is not None and callback.monitor is not None and callback.best_model_path
        self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path="best" if best else None)


class ModelOnlyCLI(LitEmbedCLI):
    """Parses a full config but builds only the model: no data, no trainer, no download."""

    def instantiate_classes(self) -> None:
        from jsonargparse import ArgumentParser

        parser = ArgumentParser(exit_on_error=False)
        parser.add_subclass_arguments(pl.LightningModule, "model", required=True)
        self.model = parser.instantiate_classes(parser.parse_object({"model": self.config["model"]}))["model"]


def params_main(argv: list[str]) -> int:
    as_json = "--json" in argv
    rest = [a for a in argv if a != "--json"]
    with shapes_only():
        cli = ModelOnlyCLI(args=rest, run=False)
    report = parameter_report(cli.model)
    print(json.dumps(report, indent=2) if as_json else format_report(report))
    return 0


#: Subcommands beside Lightning's fit/validate/test/predict: name -> "module:function(argv) -> int".
COMMANDS = {
    "params": "lit_embed.cli:params_main",
    "report": "lit_embed.report:main",
    "analyze": "lit_embed.analysis:main",
    "compress": "lit_embed.compress.command:main",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in COMMANDS:
            module, _, function = COMMANDS[argv[0]].partition(":")
            return getattr(importlib.import_module(module), function)(argv[1:])
        LitEmbedCLI(args=argv)
    except USER_ERRORS as error:
        print(f"lit-embed: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
