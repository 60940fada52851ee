"""Subspace / k-sub-embedding: each token's vector is the concatenation of f shared sub-vectors."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from lit_embed.embeddings.assignment import Assignment, RadixAssignment, smallest_table_size
from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.embeddings.grid_softmax import cell_index, fits_grid, grid_nll
from lit_embed.errors import ConfigError


class SubspaceEmbedding(EmbeddingStrategy):
    """f tables of Q rows; token n is ``concat_k table_k[c_k(n)]`` (the papers' k-sub-embedding).

    Table k has ``hidden_size // f`` columns and the last takes the remainder, so Q-row tables hold
    ``Q * hidden_size`` parameters in all. The codes ``c(n)`` come from the ``assignment`` and live in
    the persistent buffer ``codes``, so a checkpoint restores them exactly on every rank. Where the
    assignment sizes the tables from its codes (naive k-means), each table gets as many rows as its
    largest code needs when the codes are computed or loaded, and ``table_rows`` records them.

    Args:
        vocab_size: number of vocabulary ids N.
        hidden_size: width d of the concatenated vector.
        num_tables: f, the number of sub-embedding tables.
        table_size: Q, rows per table; default the smallest Q with ``Q**f >= N`` (the papers'
            ``ceil(N^(1/f))``, which the released code writes ``floor(N^(1/f)) + 1``).
        assignment: :class:`RadixAssignment` (Algorithm 1, default) or :class:`ClusterAssignment`
            (Algorithm 2).
        padding_idx: if given, that id gets a dedicated all-zero row (one more row per table).
        init_range: tables start uniform in ``[-init_range, init_range]`` as in the released code.
        table_rows: the rows of each table (padding row excluded) where the assignment sizes them from
            its codes; left unset, the codes set it (and the strategy's config records it, so that a
            checkpoint's model is rebuilt with its shapes).
        budget: size Q to this many bytes at inference (or fraction of the dense table's): ``Q * hidden_size``, Q at least the
            smallest with ``Q**f >= N``.
    """

    sized_by_checkpoint = ("codes",)  # a grown vocabulary has more rows
    size_parameter = "table_size"

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        num_tables: int = 3,
        table_size: int | None = None,
        assignment: Assignment | None = None,
        padding_idx: int | None = None,
        init_range: float = 0.1,
        table_rows: list[int] | None = None,
        budget: int | float | None = None,
    ) -> None:
        super().__init__(vocab_size, hidden_size)
        if num_tables < 1:
            raise ConfigError(f"num_tables={num_tables} must be at least 1")
        if num_tables > hidden_size:
            raise ConfigError(
                f"num_tables={num_tables} exceeds hidden_size={hidden_size}: every table needs at least one "
                f"column; use at most {hidden_size} tables"
            )
        if padding_idx is not None and not 0 <= padding_idx < vocab_size:
            raise ConfigError(f"padding_idx={padding_idx} is outside the vocabulary [0, {vocab_size})")
        if table_size is not None and table_size < 2:
            raise ConfigError(
                f"table_size={table_size}: a table needs at least 2 rows; leave it unset for the smallest Q with "
                f"Q^{num_tables} >= {vocab_size} ({smallest_table_size(vocab_size, num_tables)})"
            )
        self.num_tables = num_tables
        self.table_size = smallest_table_size(vocab_size, num_tables) if table_size is None else table_size
        self.assignment = assignment or RadixAssignment()
        self.padding_idx = padding_idx
        self.init_range = init_range
        if table_rows is not None:
            if not self.assignment.tables_fit_codes:
                raise ConfigError(
                    f"table_rows={table_rows}: {self.assignment!r} gives every table Q={self.table_size} rows; "
                    f"table_rows is for assignments that size the tables by their codes (ClusterAssignment, method kmeans)"
                )
            if len(table_rows) != num_tables or min(table_rows) < 1:
                raise ConfigError(f"table_rows={table_rows} must give {num_tables} positive row counts, one per table")
        self.table_rows = None if table_rows is None else [int(r) for r in table_rows]
        widths = [hidden_size // num_tables] * num_tables
        widths[-1] += hidden_size - sum(widths)
        self.widths = widths
        self.tables = nn.ParameterList(self._new_table(rows, w) for rows, w in zip(self.rows, widths))
        codes = torch.full((vocab_size, num_tables), -1, dtype=torch.int32)  # held at inference: 4 bytes a code
        self.register_buffer("codes", codes, persistent=True)
        self._codes_ready = False
        if self.assignment.eager:
            self.assign()

    @classmethod
    def count_parameters(cls, vocab_size: int, hidden_size: int, num_tables: int = 3, table_size: int | None = None,
                         padding_idx: int | None = None, table_rows: list[int] | None = None, **_) -> int:
        """The papers' ``Q * d`` (each table's rows times its width; a padding row adds one row to each table)."""
        widths = [hidden_size // num_tables] * num_tables
        widths[-1] += hidden_size - sum(widths)
        q = smallest_table_size(vocab_size, num_tables) if table_size is None else table_size
        rows = table_rows or [q] * num_tables
        return sum((r + (padding_idx is not None)) * w for r, w in zip(rows, widths))

    @classmethod
    def size_range(cls, vocab_size: int, hidden_size: int, num_tables: int = 3, **_) -> tuple[int, int]:
        """Q from the smallest whose ``Q**f`` codes cover the vocabulary to one row per token."""
        return max(2, smallest_table_size(vocab_size, num_tables)), max(2, vocab_size)

    # -- tables ----------------------------------------------------------------------------------
    @property
    def rows(self) -> list[int]:
        """Rows of each table, the padding row excluded: Q, or what the codes need (``table_rows``)."""
        return self.table_rows or [self.table_size] * self.num_tables

    @property
    def shaped_by_prepare(self) -> bool:
        return self.assignment.tables_fit_codes and not self._codes_ready

    def _new_table(self, rows: int, width: int, generator: torch.Generator | None = None) -> nn.Parameter:
        table = torch.empty(rows + (self.padding_idx is not None), width)
        table.uniform_(-self.init_range, self.init_range, generator=generator)
        if self.padding_idx is not None:
            table[rows].zero_()
        return nn.Parameter(table)

    def _fit_tables(self, codes: Tensor) -> None:
        """Size each table by the largest of ``codes`` it holds (assignments with ``tables_fit_codes``).

        A table whose size changes starts afresh (before training: the codes are computed or loaded first),
        drawn from the run's seed (``torch.initial_seed()``, which ``seed_everything`` sets), not from the
        global generator's position: one process and every DDP rank draw the same tables.
        """
        real = codes if self.padding_idx is None else codes[torch.arange(len(codes)) != self.padding_idx]
        needed = (real.amax(0) + 1).tolist()
        if self.table_rows is not None and needed != self.table_rows:
            raise ConfigError(
                f"the assignment's codes need tables of {needed} rows but table_rows={self.table_rows}: leave "
                f"table_rows unset to size the tables by the codes"
            )
        self.table_rows = needed
        generator = torch.Generator().manual_seed(torch.initial_seed())
        for k, (rows, width) in enumerate(zip(needed, self.widths)):
            if self.tables[k].shape[0] != rows + (self.padding_idx is not None):
                self.tables[k] = self._new_table(rows, width, generator).to(self.tables[k].device)

    # -- codes -----------------------------------------------------------------------------------
    def assign(self) -> None:
        """Compute the codes from the assignment (done at build time for radix, in ``prepare`` else)."""
        codes = torch.as_tensor(np.asarray(self.assignment.codes(self.vocab_size, self.num_tables, self.table_size)))
        if self.assignment.tables_fit_codes:
            self._fit_tables(codes)
        self._set_codes(codes.long())

    def prepare(self) -> None:
        if not self._codes_ready:
            self.assign()

    def mark_prepared(self) -> None:
        self._codes_ready = True

    def _set_codes(self, codes: Tensor) -> None:
        if self.padding_idx is not None:
            codes = codes.clone()
            codes[self.padding_idx] = torch.as_tensor(self.rows)  # each table's dedicated zero row
        self.codes.copy_(codes.to(self.codes.device))
        self._codes_ready = True

    def on_sized_load(self, names: list[str]) -> None:
        """Codes from a checkpoint (or rank 0) are ready, and give the vocabulary size (a grown vocabulary's is
        larger) and, where the assignment sizes the tables, each table's rows (before the tables load)."""
        self.vocab_size = self.codes.shape[0]
        if self.assignment.tables_fit_codes:
            self.table_rows = None  # the loaded codes decide
            self._fit_tables(self.codes)
        self._codes_ready = True

    def shaped_by_checkpoint(self) -> set[str]:
        """The codes, and the tables where the codes size them (naive k-means): ``on_sized_load`` refits them."""
        tables = {f"tables.{k}" for k in range(self.num_tables)} if self.assignment.tables_fit_codes else set()
        return super().shaped_by_checkpoint() | tables

    def grow_vocab(self, new_vocab_size: int) -> None:
        """Give tokens added to the tokenizer after training unused codes: no new parameters.

        Codes already in use keep their meaning; new ids take the smallest unused code tuples
        (in radix order, each digit below its table's rows). This is the papers' claim that
        sub-embeddings avoid the OOV problem.
        """
        self.prepare()
        extra = new_vocab_size - self.vocab_size
        if extra < 0:
            raise ConfigError(f"new_vocab_size={new_vocab_size} is below the current {self.vocab_size}")
        rows = np.asarray(self.rows, dtype=np.int64)
        space = int(np.prod(rows))
        real = self.codes.cpu().numpy()
        real = real[(real < rows).all(1)]  # the pad token's code is each table's extra row
        place = np.concatenate([[1], np.cumprod(rows)[:-1]])  # mixed radix: digit k counts place[k]
        used = set((real @ place).tolist())  # each tuple as its radix integer
        if extra > space - len(used):
            raise ConfigError(
                f"{extra} new tokens but only {space - len(used)} unused codes with tables of {self.rows} rows, "
                f"f={self.num_tables}: raise Q"
            )
        fresh: list[int] = []
        start = 0
        while len(fresh) < extra:
            fresh.extend(v for v in range(start, min(space, start + 4 * extra + 64)) if v not in used)
            start += 4 * extra + 64
        new = torch.as_tensor((np.array(fresh[:extra])[:, None] // place) % rows, device=self.codes.device, dtype=self.codes.dtype)
        self.codes = torch.cat([self.codes, new])
        self.vocab_size = new_vocab_size

    def component_codes(self) -> Tensor:
        """Each token's row in each table (the pad token's is the extra row ``Q``)."""
        self._check_ready()
        return self.codes

    # -- vectors ---------------------------------------------------------------------------------
    def _check_ready(self) -> None:
        if not self._codes_ready:
            raise RuntimeError(
                "subspace codes are not computed yet: call prepare() (the Lightning modules do) or load a checkpoint"
            )

    def forward(self, codes: Tensor) -> Tensor:
        self._check_ready()
        rows = self.codes.index_select(0, codes.reshape(-1)).T  # (f, tokens): each table's rows
        padding = tuple(self.rows) if self.padding_idx is not None else (-1,) * self.num_tables
        vectors = _Concatenated.apply(rows, padding, *self.tables)
        return vectors.view(*codes.shape, self.hidden_size)

    def decoder_logits(self, hidden: Tensor) -> Tensor:
        """Tied-decoder scores without building the ``N x d`` matrix.

        ``hidden . e(n) = sum_k hidden_k . table_k[c_k(n)]``: score every row of every table
        (``M x fQ``, small), then sum each token's f scores in one ``embedding_bag`` pass over the
        ``M x N`` output. At RoBERTa_S size that is 3x faster than the dense decoder's product, for
        any f (``tools/bench``: a loop of f gathers grows with f; the gathered matrix costs as dense).
        """
        self._check_ready()
        rows, _ = self._decoder_constants()
        scores = torch.cat(self._table_scores(hidden), 1)
        return _SummedScores.apply(scores.T.contiguous(), rows, self._scored_by()).T

    def decoder_nll(self, hidden: Tensor, bias: Tensor, targets: Tensor) -> Tensor | None:
        """The exact factorised softmax over the grid of codes (:mod:`lit_embed.embeddings.grid_softmax`), where
        the grid has at most ``MAX_CELLS_PER_TOKEN`` cells per token (radix and equal-size cluster codes)."""
        self._check_ready()
        _, cells = self._decoder_constants()
        if cells is None:
            return None
        rows = [table.shape[0] for table in self.tables]
        return grid_nll(self._table_scores(hidden), bias, cells, rows, self.codes, targets)

    def _table_scores(self, hidden: Tensor) -> list[Tensor]:
        """``(M, R_k)`` scores of every row of each table: the k-th slice of ``hidden`` against table k."""
        return [part @ table.T for part, table in zip(hidden.split(self.widths, dim=-1), self.tables)]

    def _decoder_constants(self) -> tuple[Tensor, Tensor | None]:
        """Each token's rows among the tables' stacked scores, and its grid cell where the grid fits (``None``
        else): derived from the codes once, and again only when they change (loaded, grown, moved)."""
        rows = [table.shape[0] for table in self.tables]
        key = (self.codes.data_ptr(), self.codes._version, self.codes.device, tuple(rows))
        if self.__dict__.get("_constants_key") != key:
            offsets = torch.tensor([sum(rows[:k]) for k in range(len(rows))], device=self.codes.device)
            cells = cell_index(self.codes, rows) if fits_grid(self.codes.shape[0], rows) else None
            self._constants = (self.codes + offsets, cells)
            self._constants_key = key
        return self._constants

    def _scored_by(self) -> tuple[Tensor, Tensor]:
        """The tokens that read each row of the stacked scores, in row order, and where each row's tokens start: the
        backward of :meth:`decoder_logits` sums their gradients in one ``embedding_bag`` pass, with no sort of the
        ``V x f`` rows at every step (``embedding_bag``'s own backward sorts them). Derived once, as the constants."""
        rows, _ = self._decoder_constants()
        if self.__dict__.get("_scored_by_key") is not self._constants:
            flat = rows.reshape(-1)
            tokens = torch.div(torch.sort(flat, stable=True).indices, rows.shape[1], rounding_mode="floor")
            counts = torch.bincount(flat, minlength=sum(table.shape[0] for table in self.tables))
            self._scored_by_cache = (tokens, torch.cumsum(counts, 0) - counts)
            self._scored_by_key = self._constants
        return self._scored_by_cache

    def extra_repr(self) -> str:
        rows = f", rows={self.table_rows}" if self.table_rows is not None else ""
        return f"vocab_size={self.vocab_size}, hidden_size={self.hidden_size}, f={self.num_tables}, Q={self.table_size}{rows}"


class _Concatenated(torch.autograd.Function):
    """``concat_k tables[k][rows[k]]``, each table's rows gathered straight into its columns of one buffer (no parts
    and no concatenation: a step of 4,096 tokens at d = 512 writes 8 MB, not 16), and each table's gradient
    summed from its columns of the output's gradient, never its padding row's.

    With up to :data:`FULL_WIDTH_TABLES` tables the backward sums whole rows of the output's gradient into a
    ``rows x d`` buffer per table and keeps the table's columns: no copy of a gradient slice (a column slice must be
    copied to be summed fast: ``index_add_`` from strided columns is 3x slower). It reads the gradient f times, so
    more tables copy their columns first and sum those (``embedding_dense_backward``), reading it about three times."""

    @staticmethod
    def forward(ctx, rows: Tensor, padding: tuple[int, ...], *tables: Tensor) -> Tensor:
        out = tables[0].new_empty(rows.shape[1], sum(table.shape[1] for table in tables))
        start = 0
        for k, table in enumerate(tables):
            torch.index_select(table, 0, rows[k], out=out[:, start:start + table.shape[1]])
            start += table.shape[1]
        ctx.save_for_backward(rows)
        ctx.padding, ctx.shapes = padding, [table.shape for table in tables]
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        (rows,) = ctx.saved_tensors
        full_width = len(ctx.shapes) <= FULL_WIDTH_TABLES
        grads: list[Tensor | None] = []
        start = 0
        for k, ((num_rows, width), pad) in enumerate(zip(ctx.shapes, ctx.padding)):
            if not ctx.needs_input_grad[2 + k]:
                grads.append(None)
            elif full_width:
                summed = grad.new_zeros(num_rows, grad.shape[1]).index_add_(0, rows[k], grad)
                if pad >= 0:
                    summed[pad] = 0.0
                grads.append(summed[:, start:start + width])
            else:
                columns = grad[:, start:start + width].contiguous()
                grads.append(torch.ops.aten.embedding_dense_backward(columns, rows[k], num_rows, pad, False))
            start += width
        return (None, None, *grads)


#: The most tables whose gradients :class:`_Concatenated` sums from whole rows of the output's gradient. Backward,
#: 4,032 tokens at d = 512 on one CPU thread (shared machine, thread time): whole rows 1.9 ms against 2.6 ms copying
#: the columns first at f = 3 (Q = 63), 1.8 against 5.7 ms at f = 2 (Q = 500); the same at f = 4 and 8; slower at 16.
FULL_WIDTH_TABLES = 3


class _SummedScores(torch.autograd.Function):
    """Each token's f scores summed, ``(R, M)`` stacked row scores to ``(V, M)``: ``embedding_bag`` over each token's
    rows forward, and over each row's tokens (given, sorted once) backward."""

    @staticmethod
    def forward(ctx, scores: Tensor, rows: Tensor, scored_by: tuple[Tensor, Tensor]) -> Tensor:
        ctx.scored_by = scored_by
        return nn.functional.embedding_bag(rows, scores, mode="sum")

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        tokens, starts = ctx.scored_by
        return nn.functional.embedding_bag(tokens, grad.contiguous(), starts, mode="sum"), None, None
