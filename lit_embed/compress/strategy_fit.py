"""``fit``: any vocabulary strategy fitted to the table (``lit-embed compress --method fit --strategy YAML``), so every
zoo method can start from a pretrained encoder without pre-training. The loss and the stopping rule are
:class:`FitOptions`'s; a strategy whose rows are linear in its parameters is solved exactly
(:mod:`lit_embed.compress.closed_form`).
"""

from __future__ import annotations

import inspect
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import yaml
from torch import Tensor
from torch.nn import functional as F

from lit_embed.checkpoints.format import build_from_config, resolve_class
from lit_embed.compress import closed_form
from lit_embed.compress.methods import CompressionMethod, Job
from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.embeddings.mixed_dimension import DATA
from lit_embed.embeddings.sizing import fit_budget
from lit_embed.errors import ConfigError, MissingFileError

#: Rows whose loss is computed at once in an evaluation over the whole table.
EVAL_ROWS = 8192


@dataclass
class FitOptions:
    """Which strategy to fit, the loss and the stopping rule.

    The loss, per batch of rows ``B`` drawn uniformly at random (a seeded permutation, epoch after epoch)::

        L = sum_{i in B} w_i l_i / sum_{i in B} w_i,   l_i = mean_j (e_ij - x_ij)^2  (mse)   or   1 - cos(e_i, x_i)  (cosine)

    with ``e_i`` the strategy's row of token ``i`` and ``x_i`` the table's; ``w_i = log(2 + c_i)`` for ``c_i`` the
    token's count in the data (``weighting: frequency``: frequent rows weigh more, rare ones still count) or 1
    (``uniform``). Adam minimises it. The stopping rule, whichever comes first: ``max_steps`` steps; an evaluation of
    ``L`` over the whole table (every ``eval_every`` steps) improving on the best before it by less than ``tolerance``
    (relative); ``max_seconds`` of fitting. With the ``mse`` loss, a strategy whose rows are linear in its parameters
    is instead solved exactly (``solver: auto``; :mod:`lit_embed.compress.closed_form`: the hashing trick, ROBE, QR,
    hash embeddings, ALBERT's factorisation), in alternating rounds where two tensors multiply, stopped by the same
    ``tolerance`` between rounds or ``max_rounds``.

    Args:
        strategy: the strategy to fit: a YAML file of one (``configs/embedding/*.yaml``, ``budget:`` included) or its
            ``class_path``/``init_args`` inline; the vocabulary and hidden sizes are the table's.
        budget: size the strategy to this many bytes at inference, or this fraction of the table's bytes, in place of its
            file's ``budget`` (a sweep gives one strategy file several budgets).
        loss: ``mse`` (mean squared error of each row) or ``cosine`` (1 - cosine similarity of each row).
        weighting: ``frequency``: each row weighs log(2 + its count in the data); ``uniform``: all rows alike.
        max_steps: stop after this many steps.
        tolerance: stop when an evaluation of the loss over the whole table improves on the best before it by less
            than this fraction.
        eval_every: steps between evaluations over the whole table.
        max_seconds: stop after this many seconds of fitting (``null``: no limit).
        batch_size: rows per step.
        lr: Adam's learning rate.
        solver: ``closed_form``: least squares solved exactly (``mse`` only; refused for a strategy without one);
            ``gradient``: Adam; ``auto``: the closed form where the strategy has one and the loss is ``mse``.
        max_rounds: stop alternating least squares after this many rounds.
    """

    strategy: str | dict | None = None
    budget: int | float | None = None
    loss: Literal["mse", "cosine"] = "mse"
    weighting: Literal["frequency", "uniform"] = "frequency"
    max_steps: int = 2000
    tolerance: float = 1e-3
    eval_every: int = 100
    max_seconds: float | None = None
    batch_size: int = 1024
    lr: float = 1e-2
    solver: Literal["auto", "closed_form", "gradient"] = "auto"
    max_rounds: int = 100

    def check(self) -> None:
        if self.strategy is None:
            raise ConfigError("method 'fit' needs --strategy: a strategy YAML (configs/embedding/*.yaml) to fit")
        if self.loss not in ("mse", "cosine") or self.weighting not in ("frequency", "uniform"):
            raise ConfigError(f"loss={self.loss!r} must be 'mse' or 'cosine', weighting={self.weighting!r} 'frequency' "
                              f"or 'uniform'")
        if self.solver not in ("auto", "closed_form", "gradient"):
            raise ConfigError(f"solver={self.solver!r} must be 'auto', 'closed_form' or 'gradient'")
        if self.solver == "closed_form" and self.loss != "mse":
            raise ConfigError(f"solver='closed_form' solves the mse loss, not loss={self.loss!r}: use solver 'gradient'")
        for name in ("max_steps", "eval_every", "batch_size", "max_rounds"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be at least 1")
        if self.lr <= 0 or self.tolerance < 0 or (self.max_seconds is not None and self.max_seconds <= 0):
            raise ConfigError(f"lr={self.lr} and max_seconds={self.max_seconds} must be positive, tolerance="
                              f"{self.tolerance} at least 0")

    def describe(self, closed_form: str | None = None) -> dict[str, str]:
        """The loss and the stopping rule in words, for the report (``closed_form``: how it was solved, where it was)."""
        weights = "log(2 + the token's count in the data)" if self.weighting == "frequency" else "1"
        row = "mean squared error" if self.loss == "mse" else "1 - cosine similarity"
        if closed_form is not None:
            return {"loss": f"{row} of each rebuilt row, weighted by {weights}; solved in closed form: {closed_form}",
                    "stopping rule": f"exact in one solve; alternating rounds stop when one improves the whole-table loss "
                                     f"by less than {self.tolerance:g}, or after {self.max_rounds}"}
        limit = "" if self.max_seconds is None else f", or {self.max_seconds:g} s"
        return {
            "loss": f"{row} of each rebuilt row, weighted by {weights}; Adam lr {self.lr:g}, {self.batch_size} rows a step",
            "stopping rule": f"{self.max_steps} steps, or a whole-table loss (every {self.eval_every} steps) improving "
                             f"by less than {self.tolerance:g} of the best before it{limit}",
        }


class NoVocabularyError(ConfigError):
    """A strategy with no row per vocabulary id (the HashFormers hash words): there is no table to fit it to, so its
    post-hoc cell of a comparison does not exist (a sweep leaves it out and says so, as a budget it cannot meet)."""


def strategy_from(given: str | dict, vocab_size: int, hidden_size: int, budget: int | float | None = None,
                  counts: Tensor | None = None) -> EmbeddingStrategy:
    """The strategy a YAML file (or an inline config) describes, built for a ``vocab_size x hidden_size`` table
    (sized to ``budget`` where given; ranking tokens by ``counts``, the data's, where it asks for them:
    ``frequencies: data``)."""
    config = given
    if isinstance(given, str):
        path = Path(given).expanduser()
        if not path.is_file():
            raise MissingFileError(f"strategy {given!r} does not exist: give a strategy YAML (configs/embedding/*.yaml)")
        config = yaml.safe_load(path.read_text())
    if not isinstance(config, dict) or "class_path" not in config:
        raise ConfigError(f"strategy {given!r} is not a strategy config: it needs a class_path (and init_args), as "
                          f"configs/embedding/*.yaml have")
    cls = resolve_class(str(config["class_path"]))
    if isinstance(cls, type) and issubclass(cls, EmbeddingStrategy) and (cls.unlimited_vocabulary or tuple(cls.code_shape)):
        raise NoVocabularyError(f"{cls.__name__} does not index vocabulary ids, so it has no row per token to fit to the "
                          f"table: choose a vocabulary strategy (configs/embedding/: hashing_trick, qr, tt, ...)")
    init = {**(config.get("init_args") or {}), "vocab_size": vocab_size, "hidden_size": hidden_size}
    if budget is not None:
        init["budget"] = budget
    frequencies = inspect.signature(cls).parameters.get("frequencies") if isinstance(cls, type) else None
    if frequencies is None or init.get("frequencies", frequencies.default) != DATA or init.get("block_dims"):
        return build_from_config(EmbeddingStrategy, {"class_path": config["class_path"], "init_args": init}, "embedding")
    if counts is None:  # a budget its structure cannot meet is said first (a sweep's plan counts nothing)
        if budget is not None:
            fit_budget(cls, vocab_size, hidden_size, budget, {k: v for k, v in init.items()
                                                               if k not in ("vocab_size", "hidden_size", "budget")})
        raise ConfigError(f"{config['class_path']} ranks tokens by the data's counts (frequencies: data) and none were "
                          f"counted: give --data, or a count file as its frequencies")
    with tempfile.TemporaryDirectory() as folder:  # the strategy reads it once, when built: its buffers keep the ranking
        path = Path(folder) / "token_counts.txt"
        path.write_text("".join(f"{count}\n" for count in counts.tolist()))
        init["frequencies"] = str(path)
        return build_from_config(EmbeddingStrategy, {"class_path": config["class_path"], "init_args": init}, "embedding")


def row_losses(rebuilt: Tensor, target: Tensor, loss: str) -> Tensor:
    """Each row's loss ``l_i``."""
    if loss == "cosine":
        return 1.0 - F.cosine_similarity(rebuilt, target, dim=-1)
    return (rebuilt - target).pow(2).mean(-1)


def fit_strategy(strategy: EmbeddingStrategy, weight: Tensor, counts: Tensor | None, options: FitOptions, seed: int = 0,
                 device: str = "cpu") -> dict:
    """Fit ``strategy``'s parameters to ``weight`` (in place) under the module's loss and stopping rule, in closed form
    where :func:`closed_form_of` finds one; returns what happened (steps or rounds, why it stopped, the first and last
    whole-table loss, seconds)."""
    started = time.perf_counter()
    strategy.prepare()
    vocab = len(weight)
    frequent = counts is not None and options.weighting == "frequency"
    weights = torch.log(2.0 + counts.double()).float() if frequent else torch.ones(vocab)
    exact = closed_form_of(strategy, options)
    if exact is not None:
        target = weight.detach().float().cpu()
        strategy.cpu().eval()
        return closed_form.fit_closed_form(strategy, exact[0], target, weights, options.tolerance, options.max_rounds,
                                           lambda: weighted_loss(strategy, target, weights, options.loss))
    strategy.to(device).train()
    target, weights = weight.detach().float().to(device), weights.to(device)
    optimizer = torch.optim.Adam([p for p in strategy.parameters() if p.requires_grad], lr=options.lr)
    order = torch.Generator().manual_seed(seed)

    first = best = weighted_loss(strategy, target, weights, options.loss)
    steps, stopped = 0, f"max_steps ({options.max_steps})"
    batches: list[Tensor] = []
    while steps < options.max_steps:
        if not batches:
            batches = list(torch.randperm(vocab, generator=order).split(options.batch_size))[::-1]
        ids = batches.pop()
        w = weights[ids]
        loss = (row_losses(strategy(ids.to(device)), target[ids], options.loss) * w).sum() / w.sum()
        term = strategy.auxiliary_loss()  # the strategy's own (DPQ-VQ's centroids learn from it)
        loss = loss if term is None else loss + term
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        steps += 1
        if not math.isfinite(float(loss.detach())):
            raise ConfigError(f"fitting {type(strategy).__name__} diverged at step {steps} (loss {float(loss.detach())}): lower --lr")
        if options.max_seconds is not None and time.perf_counter() - started >= options.max_seconds:
            stopped = f"max_seconds ({options.max_seconds:g})"
            break
        if steps % options.eval_every == 0 and steps < options.max_steps:
            now = weighted_loss(strategy, target, weights, options.loss)
            if best - now < options.tolerance * best:
                stopped = f"tolerance (whole-table loss {now:.4g} against the best {best:.4g})"
                break
            best = now
    last = weighted_loss(strategy, target, weights, options.loss)
    strategy.eval().cpu()
    return {"steps": steps, "stopped by": stopped, "loss before": round(first, 6), "loss after": round(last, 6),
            "seconds": round(time.perf_counter() - started, 2)}


def closed_form_of(strategy: EmbeddingStrategy, options: FitOptions) -> tuple[list[closed_form.Step], str] | None:
    """The exact steps that fit ``strategy`` and how they solve it, where ``options`` ask for them and it has them;
    ``None``: gradient descent fits it. ``solver: closed_form`` for a strategy without one is refused."""
    if options.solver == "gradient" or options.loss != "mse":
        return None
    found = closed_form.steps_of(strategy)
    if found is None and options.solver == "closed_form":
        raise ConfigError(f"{type(strategy).__name__} has no closed-form fit (its rows are not linear in its parameters): "
                          f"use solver 'gradient' or 'auto'")
    return found


def weighted_loss(strategy: EmbeddingStrategy, target: Tensor, weights: Tensor, loss: str) -> float:
    """The loss ``L`` over the whole table."""
    with torch.no_grad():
        total = sum(float((row_losses(strategy(ids.to(target.device)), target[ids], loss) * weights[ids]).sum())
                    for ids in torch.arange(len(target)).split(EVAL_ROWS))
    return total / float(weights.sum())


class StrategyFit(CompressionMethod):
    """Any vocabulary strategy (``--strategy YAML``) fitted to the table by gradient descent
    (:class:`FitOptions`: the loss and the stopping rule)."""

    name = "fit"
    Options = FitOptions
    options: FitOptions

    def check(self, job: Job) -> None:
        self.options.check()
        # a bad strategy file or class, a budget it cannot meet, or a closed form it has not, fails before any work
        closed_form_of(self.strategy(job), self.options)

    def strategy(self, job: Job) -> EmbeddingStrategy:
        """The strategy to fit, built for the job's table (sized to the budget where given)."""
        options = self.options
        assert isinstance(options, FitOptions) and options.strategy is not None  # check() refuses a missing one
        vocab, hidden = job.weight.shape
        return strategy_from(options.strategy, vocab, hidden, options.budget, job.counts)

    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(job.seed)
            strategy = self.strategy(job)
        exact = closed_form_of(strategy, self.options)
        self.details.update({"strategy": type(strategy).__name__, **self.options.describe(exact and exact[1])})
        if strategy.sizing is not None:
            self.details["budget"] = strategy.sizing.describe()
        self.details.update(fit_strategy(strategy, job.weight, job.counts, self.options, job.seed, job.device))
        return {None: strategy}
