"""The exact factorised softmax of subspace codes on a grid: the loss and gradients of the full softmax, no logits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_embed.embeddings import SubspaceEmbedding
from lit_embed.embeddings.grid_softmax import fits_grid, grid_log_partition
from lit_embed.models import MaskedLM
from tests.helpers import tiny_encoder


def _strategy(vocab: int, hidden: int, f: int, scale: float, seed: int, padding_idx: int | None = None,
              shuffled: bool = False) -> SubspaceEmbedding:
    """A subspace strategy whose scores span several nats; ``shuffled`` puts the tokens at random cells of its grid
    (as a cluster assignment does), leaving the missing cells anywhere instead of at the end."""
    torch.manual_seed(seed)
    strategy = SubspaceEmbedding(vocab, hidden, num_tables=f, padding_idx=padding_idx)
    with torch.no_grad():
        for table in strategy.tables:
            table.mul_(scale)
    if shuffled:
        q = strategy.table_size
        cells = torch.randperm(q**f)[:vocab]
        strategy._set_codes(torch.stack([(cells // q**k) % q for k in range(f)], 1))
    return strategy


def _both(strategy: SubspaceEmbedding, positions: int, dtype: torch.dtype, seed: int):
    """The factorised and the full softmax's per-position losses, and their gradients as pairs (hidden, bias, tables)."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(positions, strategy.hidden_size, generator=generator).requires_grad_()
    bias = (torch.randn(strategy.vocab_size, generator=generator) * 2).requires_grad_()
    targets = torch.randint(0, strategy.vocab_size, (positions,), generator=generator)
    inputs = [hidden, bias, *strategy.tables]
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        factorised = strategy.decoder_nll(hidden, bias, targets)
        logits = strategy.decoder_logits(hidden)
        full = nn.functional.cross_entropy((logits + bias.to(logits.dtype)).float(), targets, reduction="none")
    assert factorised is not None and factorised.dtype == torch.float32
    gradients = zip(torch.autograd.grad(factorised.mean(), inputs), torch.autograd.grad(full.mean(), inputs))
    return factorised, full, list(gradients)


def _close(gradients, tolerance: float) -> None:
    for mine, theirs in gradients:
        assert (mine - theirs).abs().max() <= tolerance * theirs.abs().max(), (mine - theirs).abs().max()


@pytest.mark.parametrize(("vocab", "hidden", "f"), [(50265, 512, 3), (250002, 512, 3)], ids=["RoBERTa_S", "XLM-R_S"])
def test_loss_and_gradients_equal_the_full_softmax_on_the_papers_grids(vocab, hidden, f):
    """37^3 = 50,653 cells for 50,265 tokens, 63^3 = 250,047 for 250,002: the missing cells are the grid's last."""
    strategy = _strategy(vocab, hidden, f, scale=10.0, seed=0)
    factorised, full, gradients = _both(strategy, positions=64, dtype=torch.float32, seed=1)
    assert full.std() > 0.5  # the scores span several nats: a wrong partition function would show
    torch.testing.assert_close(factorised, full, rtol=1e-5, atol=1e-5)
    _close(gradients, 1e-4)


@pytest.mark.parametrize("f", [2, 3, 4])
@pytest.mark.parametrize("padding_idx", [None, 1])
def test_any_grid_with_missing_cells_anywhere_and_a_padding_row(f, padding_idx):
    strategy = _strategy(4000, 48, f, scale=20.0, seed=f, padding_idx=padding_idx, shuffled=True)
    factorised, full, gradients = _both(strategy, positions=40, dtype=torch.float32, seed=2)
    torch.testing.assert_close(factorised, full, rtol=1e-5, atol=1e-5)
    _close(gradients, 1e-4)


@pytest.mark.parametrize(("vocab", "hidden"), [(50265, 512), (250002, 512)], ids=["RoBERTa_S", "XLM-R_S"])
def test_bf16_autocast_gives_the_full_softmax_of_its_own_scores(vocab, hidden):
    """Under bf16 autocast the table scores are bf16 and the contraction fp32: the loss and gradients are the full
    softmax's over the logits those bf16 scores make (taken in float64), and the full bf16 path's loss to its rounding."""
    strategy = _strategy(vocab, hidden, 3, scale=10.0, seed=3)
    factorised, full, _ = _both(strategy, positions=48, dtype=torch.bfloat16, seed=4)
    generator = torch.Generator().manual_seed(4)
    hidden_states = torch.randn(48, hidden, generator=generator).requires_grad_()
    bias = (torch.randn(vocab, generator=generator) * 2).requires_grad_()
    targets = torch.randint(0, vocab, (48,), generator=generator)
    inputs = [hidden_states, bias, *strategy.tables]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scores = [part @ table.T for part, table in zip(hidden_states.split(strategy.widths, -1), strategy.tables)]
        mine = strategy.decoder_nll(hidden_states, bias, targets)
    exact = sum(s.double()[:, strategy.codes[:, k]] for k, s in enumerate(scores)) + bias.double()
    reference = nn.functional.cross_entropy(exact, targets, reduction="none")
    torch.testing.assert_close(mine.double(), reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(factorised, full, rtol=0.02, atol=0.0)  # the full path's bf16 logits: 8 bits
    gradients = zip(torch.autograd.grad(mine.mean(), inputs), torch.autograd.grad(reference.mean(), inputs))
    _close([(a, b.to(a.dtype)) for a, b in gradients], 0.01)


def test_log_partition_is_logsumexp_in_float64_too():
    """The contraction itself, on a 7^3 grid with 20 missing cells at random places, in float64."""
    torch.manual_seed(5)
    rows = [7, 7, 7]
    cells = torch.randperm(343)[:323]
    codes = torch.stack([(cells // 7**k) % 7 for k in range(3)], 1)
    scores = [torch.randn(9, 7, dtype=torch.float64) * 3 for _ in rows]
    bias = torch.randn(323, dtype=torch.float64) * 3
    logits = sum(s[:, codes[:, k]] for k, s in enumerate(scores)) + bias
    # the contraction runs in float32: compare at its precision
    got = grid_log_partition([s.float() for s in scores], bias.float(), cells, rows)
    torch.testing.assert_close(got.double(), logits.logsumexp(-1), rtol=1e-6, atol=1e-5)


def test_a_grid_much_larger_than_the_vocabulary_keeps_the_logits():
    """Codes spread over a grid of far more cells than tokens (naive k-means' tables) are not contracted."""
    assert fits_grid(50265, [37, 37, 37]) and fits_grid(250002, [63, 63, 63])
    assert not fits_grid(100, [40, 40])
    strategy = SubspaceEmbedding(100, 16, num_tables=2, table_size=40)
    assert strategy.decoder_nll(torch.randn(3, 16), torch.zeros(100), torch.tensor([0, 5, 99])) is None


def _masked_lm(factorised: bool, tie_decoder: bool = True) -> MaskedLM:
    torch.manual_seed(6)
    factory = lambda vocab, hidden: SubspaceEmbedding(vocab, hidden, num_tables=3)  # noqa: E731
    return MaskedLM(tiny_encoder(), vocab_size=1000, embedding=factory, factorised_softmax=factorised, tie_decoder=tie_decoder)


def _batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    codes = torch.randint(5, 1000, (4, 24), generator=generator)
    labels = torch.where(torch.rand(4, 24, generator=generator) < 0.3, codes, torch.full_like(codes, -100))
    return {"codes": codes, "attention_mask": torch.ones_like(codes), "labels": labels}


def test_masked_lm_trains_on_the_factorised_loss_and_keeps_logits_where_asked():
    model, batch = _masked_lm(True).eval(), _batch()
    loss, logits, targets = model(batch)
    assert logits is None and len(targets) > 10
    full, logits, _ = model(batch, need_logits=True)
    assert logits is not None and logits.shape == (len(targets), 1000)
    torch.testing.assert_close(loss, full, rtol=1e-5, atol=1e-6)
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    mine = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    theirs = torch.autograd.grad(full, [p for _, p in named], allow_unused=True)
    for (name, _), a, b in zip(named, mine, theirs):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize(("factorised", "tie_decoder"), [(False, True), (True, False)])
def test_the_logits_stay_where_asked_or_untied(factorised, tie_decoder):
    _, logits, _ = _masked_lm(factorised, tie_decoder).eval()(_batch())
    assert logits is not None
