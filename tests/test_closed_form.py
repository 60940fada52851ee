"""The fit's closed forms (lit_embed.compress.closed_form) reach the least-squares optimum: each exact step against a
dense torch.linalg.lstsq over the strategy's own forward, probed one parameter at a time (no design matrix of the
code's is reused), and no worse than the gradient fit they replace."""

from __future__ import annotations

import pytest
import torch

from lit_embed.compress import closed_form
from lit_embed.compress.methods import Job, method_named
from lit_embed.compress.strategy_fit import FitOptions, strategy_from
from lit_embed.errors import ConfigError

VOCAB, HIDDEN = 60, 4


def spec(name: str, **init) -> dict:
    return {"class_path": f"lit_embed.embeddings.{name}", "init_args": init}


#: (strategy, the parameter each exact step solves, in order)
CASES = {
    "hashing trick": (spec("HashingTrickEmbedding", num_buckets=10), ["weight"]),
    "hashing trick unsigned": (spec("HashingTrickEmbedding", num_buckets=10, signed=False), ["weight"]),
    "ROBE": (spec("ROBEEmbedding", memory=30, block_size=3), ["array"]),
    "QR add": (spec("QREmbedding", remainder_rows=8, operation="add"), ["quotient"]),  # one solve: both tables
    "QR concat": (spec("QREmbedding", remainder_rows=8, operation="concat"), ["quotient"]),
    "QR mult": (spec("QREmbedding", remainder_rows=8, operation="mult"), ["quotient", "remainder"]),
    "sub-embeddings": (spec("SubspaceEmbedding", num_tables=2, table_size=8), ["tables.0"]),  # one solve: every table
    "hash embeddings": (spec("WeightedHashEmbedding", num_buckets=9, importance_rows=7), ["pool", "importance"]),
    "hash embeddings appended": (spec("WeightedHashEmbedding", num_buckets=9, append_weights=True), ["pool", "importance"]),
}


def problem() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    table = torch.randn(VOCAB, HIDDEN, generator=generator, dtype=torch.float64)
    weights = torch.log(2.0 + torch.randint(0, 500, (VOCAB,), generator=generator).double())
    return table, weights


def rows_of(strategy) -> torch.Tensor:
    with torch.no_grad():
        return strategy(torch.arange(VOCAB)).double()


def loss(strategy, table, weights) -> float:
    return float(((rows_of(strategy) - table).pow(2).sum(-1) * weights).sum())


def optimum(strategy, name: str, table, weights) -> float:
    """The weighted least-squares loss over parameter ``name``, the others as they are: the design's columns probed
    through the strategy's forward, one parameter value at a time, and solved by a dense lstsq."""
    parameters = dict(strategy.named_parameters())
    together = {"quotient": ["remainder"] if getattr(strategy, "operation", "") != "mult" else [], "tables.0": ["tables.1"]}
    solved = [parameters[name]] + [parameters[other] for other in together.get(name, [])]
    saved = [p.detach().clone() for p in solved]
    columns = []
    with torch.no_grad():
        for p in solved:
            p.zero_()
        offset = rows_of(strategy)  # what the other parameters give alone (the appended weights)
        for p in solved:
            for i in range(p.numel()):
                p.view(-1)[i] = 1.0
                columns.append((rows_of(strategy) - offset).reshape(-1))
                p.view(-1)[i] = 0.0
        for p, value in zip(solved, saved):
            p.copy_(value)
    root = weights.sqrt().repeat_interleave(HIDDEN).unsqueeze(-1)
    design, target = torch.stack(columns, 1) * root, (table - offset).reshape(-1, 1) * root
    theta = torch.linalg.lstsq(design, target, driver="gelsd").solution
    return float((design @ theta - target).pow(2).sum())


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_exact_step_reaches_the_least_squares_optimum_of_its_parameter(case):
    config, solved = CASES[case]
    table, weights = problem()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        strategy = strategy_from(config, VOCAB, HIDDEN)
    steps, _ = closed_form.steps_of(strategy)
    assert len(steps) == len(solved)
    for step, name in zip(steps, solved):
        best = optimum(strategy, name, table, weights)
        step(strategy, table, weights)
        assert loss(strategy, table, weights) == pytest.approx(best, rel=1e-7, abs=1e-9), name


def fitted(config: dict, **options) -> tuple[float, dict]:
    table, weights = problem()
    counts = (weights.exp() - 2).round()
    method, job = method_named("fit", {"strategy": config, **options}), Job(table.float(), torch.arange(0, VOCAB, 3), counts=counts)
    method.check(job)
    method.fit(job)
    return method.details["loss after"], method.details


GRADIENT = {"solver": "gradient", "max_steps": 3000, "eval_every": 100, "tolerance": 1e-4, "lr": 0.02, "batch_size": 16}


@pytest.mark.parametrize("case", sorted(CASES) + ["ALBERT"])
def test_the_closed_form_is_no_worse_than_the_gradient_fit_and_says_how_it_stopped(case):
    config = spec("FactorizedEmbedding", rank=2, bias=True) if case == "ALBERT" else CASES[case][0]
    exact, details = fitted(config, tolerance=1e-6)
    gradient, _ = fitted(config, **GRADIENT)
    assert details["loss after"] < details["loss before"]
    alternating = case.startswith(("QR mult", "hash embeddings"))
    if alternating:  # not convex: each round exact given the other tensor, the whole no worse than Adam's within 1%
        assert exact <= gradient * 1.01 and details["stopped by"].startswith(("tolerance", "max_rounds"))
    else:
        assert exact <= gradient + 1e-6 and (details["rounds"], details["stopped by"]) == (1, "exact (one solve)")
    assert "solved in closed form" in details["loss"]


def test_albert_is_the_weighted_truncated_svd():
    """Unweighted, the closed form is the svd method's rank-r factorisation: the same rebuilt rows."""
    table, _ = problem()
    method = method_named("fit", {"strategy": spec("FactorizedEmbedding", rank=2, bias=True), "weighting": "uniform"})
    (strategy,) = method.fit(Job(table.float(), torch.arange(3))).values()
    (svd,) = method_named("svd", {"rank": 2}).fit(Job(table.float(), torch.arange(3))).values()
    with torch.no_grad():
        assert torch.allclose(strategy(torch.arange(VOCAB)), svd(torch.arange(VOCAB)).float(), atol=1e-5)


def test_the_solver_option_chooses_and_refuses_what_cannot_be_solved():
    no_closed_form = spec("TTEmbedding")
    with pytest.raises(ConfigError, match="TTEmbedding has no closed-form fit"):
        method_named("fit", {"strategy": no_closed_form, "solver": "closed_form"}).check(Job(problem()[0].float(), torch.arange(3)))
    with pytest.raises(ConfigError, match="solver='closed_form' solves the mse loss"):
        FitOptions(strategy=no_closed_form, solver="closed_form", loss="cosine").check()
    _, details = fitted(CASES["hashing trick"][0], loss="cosine")  # auto: the cosine loss has no closed form here
    assert "steps" in details and "rounds" not in details
    _, details = fitted(no_closed_form, max_steps=5)  # auto: TT has none
    assert details["steps"] == 5


@pytest.mark.parametrize("case", ["QR add", "hash embeddings"])
def test_the_sparse_factorisation_solves_what_the_dense_one_does(case, monkeypatch):
    """Above DENSE_SIZE parameter rows the normal equations go to SuperLU: the same optimum."""
    table, weights = problem()
    losses = []
    for dense_size in (closed_form.DENSE_SIZE, 0):
        monkeypatch.setattr(closed_form, "DENSE_SIZE", dense_size)
        with torch.random.fork_rng():
            torch.manual_seed(0)
            strategy = strategy_from(CASES[case][0], VOCAB, HIDDEN)
        closed_form.steps_of(strategy)[0][0](strategy, table, weights)
        losses.append(loss(strategy, table, weights))
    assert losses[1] == pytest.approx(losses[0], rel=1e-7)  # parameters kept in float32
