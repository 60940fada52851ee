"""Differentiable product quantisation (Chen, Li & Sun, "Differentiable Product Quantization for End-to-End Embedding
Compression", ICML 2020): each token's vector is D codewords, one per group, chosen end to end."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.errors import ConfigError

#: Ids whose codes are computed at once when every token's are needed (the tied decoder's weight).
CHUNK = 512
#: The score normalisation's running-average rate and epsilon: TensorFlow's batch normalisation defaults (momentum
#: 0.99 there is the share kept; PyTorch's momentum is the share replaced), as the authors' code ran it.
SCORE_MOMENTUM, SCORE_EPS = 0.01, 1e-3


class DPQEmbedding(EmbeddingStrategy):
    """DPQ-SX (``variant: sx``): token x's query ``q_x`` (a row of a ``V x d`` table) is cut into D groups; in group j it
    takes the codeword k maximising ``<q_x^j, K_j[k]>`` and contributes ``V_j[k]``, the vector being the D values side by
    side. Training passes the gradient through the softmax of the scores (temperature ``temperature``; the
    straight-through estimator of the paper's §3.2), while the vector is always the hard choice's.

    DPQ-VQ (``variant: vq``): the keys are the values (one set of centroids ``C_j``), group j takes the nearest centroid,
    ``argmin_k ||q_x^j - C_j[k]||^2`` (the score is minus the squared distance), and its vector is ``C_j[k]`` passed
    straight through to the query (``q + sg(C_j[k] - q)``: the gradient reaches the query as if it were the output).
    The centroids learn from the strategy's own loss term (:meth:`auxiliary_loss`, which the objectives add to theirs
    in training), as the authors' code has it: ``mean((C[k] - sg(q))^2) + commitment * mean((sg(C[k]) - q)^2)``, its
    commitment coefficient 0 by default there.

    Counted as the paper counts what inference keeps (its §4, compression ratio): the ``K x d`` value codebooks and
    ``V x D`` codes (each a log2(K)-bit index counted as one parameter, as additive quantisation counts its codes);
    the query table and keys exist for training only. The tied decoder reads the values at every token's current
    code (no gradient reaches the queries through it). :meth:`for_inference` is the same embedding with the codes
    stored (``codes_only``: the smallest integer type that holds K) and no queries or keys: what ``lit-embed
    compress`` saves and :meth:`inference_bytes` counts.

    Args:
        codewords: K, codewords per group.
        groups: D, groups per vector (a divisor of ``hidden_size``).
        temperature: of the training softmax.
        init_std: standard deviation of the normal initialisation.
        codes_only: the inference form: each token's codes stored (``code_table``), no queries or keys to choose them.
        batch_norm_scores: batch-normalise the scores before the softmax and the choice, as the authors' code does by
            default (``softmax_BN``: per codeword over the batch's tokens and groups, no scale or shift, TensorFlow's
            momentum 0.99 and epsilon 1e-3); at inference, and for the stored codes, with the running statistics.
        variant: ``sx`` (softmax) or ``vq`` (nearest centroid).
        commitment: DPQ-VQ's coefficient of the term that pulls the queries to their centroids (the authors' beta).
        budget: size K to this many bytes at inference, or this fraction of the dense table's bytes.
    """

    size_parameter = "codewords"
    vocab_size: int  # a vocabulary strategy: never None
    code_table: Tensor  # the inference form's codes (codes_only)
    score_mean: Tensor  # the scores' running statistics (batch_norm_scores)
    score_var: Tensor

    def __init__(self, vocab_size: int, hidden_size: int, codewords: int = 32, groups: int = 8, temperature: float = 1.0,
                 init_std: float = 0.02, codes_only: bool = False, batch_norm_scores: bool = False,
                 variant: Literal["sx", "vq"] = "sx", commitment: float = 0.0, budget: int | float | None = None) -> None:
        super().__init__(vocab_size, hidden_size)
        if groups < 1 or hidden_size % groups:
            raise ConfigError(f"groups={groups} must divide hidden_size={hidden_size}: pick a divisor")
        if codewords < 2:
            raise ConfigError(f"codewords={codewords} must be at least 2")
        if temperature <= 0:
            raise ConfigError(f"temperature={temperature} must be positive")
        if variant not in ("sx", "vq") or commitment < 0:
            raise ConfigError(f"variant={variant!r} must be 'sx' (softmax) or 'vq' (nearest centroid), and commitment="
                              f"{commitment} at least 0")
        self.codewords, self.groups, self.temperature, self.init_std = codewords, groups, temperature, init_std
        self.codes_only, self.batch_norm_scores, self.variant, self.commitment = codes_only, batch_norm_scores, variant, commitment
        self._auxiliary: Tensor | None = None
        width = hidden_size // groups
        if codes_only:
            self.register_buffer("code_table", torch.zeros(vocab_size, groups, dtype=code_dtype(codewords)))
        else:
            self.queries = nn.Parameter(torch.empty(vocab_size, groups, width).normal_(0.0, init_std))
            if variant == "sx":  # DPQ-VQ's keys are its values
                self.keys = nn.Parameter(torch.empty(groups, codewords, width).normal_(0.0, init_std))
            if batch_norm_scores:  # the scores' running statistics, per codeword
                self.register_buffer("score_mean", torch.zeros(codewords))
                self.register_buffer("score_var", torch.ones(codewords))
        self.values = nn.Parameter(torch.empty(groups, codewords, width).normal_(0.0, init_std))

    @classmethod
    def count_parameters(cls, vocab_size: int, hidden_size: int, codewords: int = 32, groups: int = 8, **_) -> int:
        return codewords * hidden_size + vocab_size * groups

    @classmethod
    def size_range(cls, vocab_size: int, hidden_size: int, **_) -> tuple[int, int]:
        return 2, 2**16

    def num_embedding_parameters(self) -> int:
        return self.count_parameters(self.vocab_size, self.hidden_size, self.codewords, self.groups)

    def counting_rule(self) -> str:
        return (f"DPQ counts what inference keeps: {self.codewords} x {self.hidden_size} values and {self.groups} codes per "
                f"token; the {self.vocab_size} x {self.hidden_size} queries and the keys train only")

    def scores(self, codes: Tensor, batch_statistics: bool = False) -> Tensor:
        """``(..., D, K)`` scores of each group's codewords, batch-normalised where asked (``batch_norm_scores``): by the
        batch's own statistics, which updates the running ones, with ``batch_statistics``, else by the running ones.

        Computed group by group into a ``D x N x K`` block (returned as its ``N x D x K`` view: no copy of it), the
        running statistics' per-codeword affine map folded into the keys and a shift: for the tied decoder's codes of
        every token each step, the einsum's copy and a separate normalising pass of the block were 90% of DPQ's time."""
        queries = self.queries[codes]
        if self.variant == "vq":  # minus the squared distance to each centroid
            return -(queries.unsqueeze(-2) - self.values).pow(2).sum(-1)
        keys: Tensor = self.keys
        shift: Tensor | None = None
        if self.batch_norm_scores and not batch_statistics:  # (s - mean) / sqrt(var + eps) = <q, k / sqrt(...)> - shift
            scale = (self.score_var + SCORE_EPS).rsqrt()
            keys, shift = keys * scale[:, None], self.score_mean * scale
        scores = torch.bmm(queries.reshape(-1, self.groups, queries.shape[-1]).transpose(0, 1), keys.transpose(1, 2))
        if shift is not None:
            scores = scores - shift
        elif self.batch_norm_scores:
            scores = nn.functional.batch_norm(scores.reshape(-1, self.codewords), self.score_mean, self.score_var,
                                              training=True, momentum=SCORE_MOMENTUM, eps=SCORE_EPS).reshape(scores.shape)
        return scores.transpose(0, 1).unflatten(0, codes.shape)

    def forward(self, codes: Tensor) -> Tensor:
        if self.codes_only:
            return self._values_at(self.code_table[codes].long())
        scores = self.scores(codes, batch_statistics=self.training and torch.is_grad_enabled())
        if not torch.is_grad_enabled():  # the hard choice's vector read at the codes: no N x D x K one-hot, softmax
            return self._values_at(scores.argmax(-1))
        if self.variant == "vq":
            queries = self.queries[codes]
            chosen = self.values[torch.arange(self.groups, device=self.values.device), scores.argmax(-1)]
            if self.training:
                self._auxiliary = ((chosen - queries.detach()).pow(2).mean()
                                   + self.commitment * (chosen.detach() - queries).pow(2).mean())
            return (queries + (chosen - queries).detach()).flatten(-2)
        # the hard choice's vector (the values' gradient reaches the chosen rows), the softmax's gradient (through the
        # soft choice's vector, whose value cancels): the straight-through hard + soft - sg(soft), without its N x D x K
        # one-hot, the softmax taken in the D x N x K block scores() computed (a view of it: no copy)
        block = scores.reshape(-1, self.groups, self.codewords).transpose(0, 1)
        soft = (block if self.temperature == 1 else block / self.temperature).softmax(-1)
        smooth = torch.bmm(soft, self.values.detach()).transpose(0, 1).reshape(*codes.shape, self.hidden_size)
        return self._values_at(scores.argmax(-1)) + smooth - smooth.detach()

    def auxiliary_loss(self) -> Tensor | None:
        """DPQ-VQ's codebook and commitment term of the last training forward (once: it is cleared)."""
        term, self._auxiliary = self._auxiliary, None
        return term

    def _values_at(self, picked: Tensor) -> Tensor:
        """``(..., d)`` the values of codewords ``picked`` (``(..., D)``), side by side."""
        return self.values[torch.arange(self.groups, device=self.values.device), picked].flatten(-2)

    def codes(self) -> Tensor:
        """``(V, D)`` each token's codeword in each group (what inference keeps)."""
        if self.codes_only:
            return self.code_table.long()
        with torch.no_grad():
            ids = torch.arange(self.vocab_size, device=self.queries.device)
            return torch.cat([self.scores(chunk).argmax(-1) for chunk in ids.split(CHUNK)])

    def full_weight(self) -> Tensor:
        return self._values_at(self.codes())

    def for_inference(self) -> DPQEmbedding:
        """The values and each token's codes, without the queries and keys that chose them."""
        if self.codes_only:
            return self
        kept = DPQEmbedding(self.vocab_size, self.hidden_size, self.codewords, self.groups, self.temperature,
                            self.init_std, codes_only=True, variant=self.variant,
                            commitment=self.commitment).to(self.values.device)
        with torch.no_grad():
            kept.values.copy_(self.values)
            kept.code_table.copy_(self.codes())
        return kept

    def inference_bytes(self) -> int:
        """The values at their dtype and ``V x D`` codes in :func:`code_dtype` (computed, not built)."""
        codes = self.vocab_size * self.groups * code_dtype(self.codewords).itemsize
        return self.values.numel() * self.values.element_size() + codes


def code_dtype(codewords: int) -> torch.dtype:
    """The smallest integer type that holds an index below ``codewords``."""
    return torch.uint8 if codewords <= 256 else torch.int16 if codewords <= 2**15 else torch.int32


__all__ = ["DPQEmbedding"]
