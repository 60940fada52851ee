"""The strategy contract: what every embedding strategy must do, checked on a small instance; and the
compression-method contract (:func:`check_compression_method`), which checks what a method fits by the first.

A plugin author runs it on their strategy as the test suite runs it on every built-in one::

    from lit_embed.testing import check_strategy
    check_strategy(LowRankEmbedding, vocab_size=30522)

It needs no pytest: a broken property raises ``AssertionError`` whose message names the strategy and
the property (any other error the strategy raises while checked is reported the same way, chained).
The properties, in the order checked:

1. **builds**: ``factory(vocab_size, hidden_size)`` is an :class:`EmbeddingStrategy` of those sizes;
   ``prepare()`` then computes its expensive state.
2. **codes and forward**: the ``code_sampler()``'s codes are integers shaped ``(*batch, *code_shape)``
   (vocabulary ids below ``vocab_size``); ``forward`` maps them to finite ``(*batch, hidden_size)``
   vectors, the same for a token whatever the batch shape.
3. **text encoder**: ``text_encoder(tokenizer)`` (fitted on ``texts`` where it is a
   :class:`FittableTextEncoder`) encodes every text into codes shaped ``(tokens, *code_shape)``, and
   every special token into one token's code, which ``forward`` accepts.
4. **tied decoder**: where ``full_weight()`` gives a matrix, it is ``vocab_size x hidden_size``, its rows
   are ``forward`` of every id, and ``decoder_logits(h)`` equals ``h @ full_weight().T``; where it gives
   none (no vocabulary to enumerate), ``decoder_logits`` refuses with a user error naming the strategy.
   ``component_codes()``, where given, has one row per vocabulary id.
5. **gradients**: a loss on ``forward``'s output of sampled and encoded codes gives every trainable
   parameter a finite gradient that is not zero everywhere.
6. **parameter count**: ``num_embedding_parameters()`` is an ``int`` between 1 and the number of values
   the module stores, its parameters plus its persistent buffers (sparse coding and additive
   quantization count their stored indices and weights, as their papers do).
7. **picklable code sampler**: the sampler survives pickling (DataLoader workers get a copy), holds no
   module or parameter, and the copy draws the same kind of codes on the CPU.
8. **checkpoint round trip**: ``config(with_sizes=True)`` is plain data that
   :func:`lit_embed.checkpoints.build_from_config` builds into a fresh strategy, into which the
   original's state dict loads strictly; then its persistent buffers, its outputs and its text
   encoder's codes equal the original's exactly.
"""

from __future__ import annotations

import dataclasses
import io
import json
import pickle
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from lit_embed.checkpoints import build_from_config
from lit_embed.compress.methods import CompressionMethod, Job, method_class, method_named
from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.embeddings.text import FittableTextEncoder, TextEncoder
from lit_embed.errors import UserError

#: A few texts with words, punctuation, digits and accents, for the text encoder (and LSH's fitting).
TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Sub-embeddings share 3 small tables; hashing needs no vocabulary!",
    "Naïve café owners résumé: 42 croissants, 7 éclairs.",
)
SPECIALS = ("cls", "sep", "pad", "mask", "unk")


def check_strategy(
    factory: Callable[[int | None, int], EmbeddingStrategy],
    *,
    vocab_size: int | None,
    hidden_size: int = 16,
    tokenizer: str = "all-MiniLM-L6-v2",
    texts: Sequence[str] = TEXTS,
    seed: int = 0,
) -> EmbeddingStrategy:
    """Check the strategy ``factory`` builds against the contract (see this module); returns the instance.

    Args:
        factory: a strategy class, or a callable taking ``(vocab_size, hidden_size)`` as the model calls it
            (``functools.partial(MyStrategy, rank=8)``).
        vocab_size: the vocabulary size; ``None`` for strategies with an unlimited vocabulary. A vocabulary
            strategy encodes text with ``tokenizer``, whose ids must fit (30522 for the default).
        hidden_size: the vectors' width (small keeps the check fast).
        tokenizer: the tokenizer (hub name or folder) handed to ``text_encoder``.
        texts: what the text encoder encodes (and, where it is fittable, is fitted on).
        seed: seeds the initialisation and the sampled codes.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        strategy = _build(factory, vocab_size, hidden_size)
        contract = Contract(strategy)
        codes = contract.codes_and_forward()
        encoder, encoded = contract.text_encoder(tokenizer, list(texts))
        contract.tied_decoder()
        contract.gradients([codes.flatten(0, 1), encoded])
        contract.parameter_count()
        contract.picklable_sampler()
        contract.round_trip(codes, encoder, tokenizer, list(texts))
    return strategy


def _build(factory: Callable, vocab_size: int | None, hidden_size: int) -> EmbeddingStrategy:
    name = getattr(factory, "__name__", None) or getattr(getattr(factory, "func", None), "__name__", repr(factory))
    with checking(name, "builds"):
        strategy = factory(vocab_size, hidden_size)
        require(isinstance(strategy, EmbeddingStrategy), name, "builds",
                f"factory(vocab_size, hidden_size) gave a {type(strategy).__name__}, not an EmbeddingStrategy")
        sizes = (strategy.vocab_size, strategy.hidden_size)
        require(sizes == (vocab_size, hidden_size), name, "builds",
                f"(vocab_size, hidden_size) are {sizes}, built with {(vocab_size, hidden_size)}")
        strategy.prepare()
    return strategy.eval()  # the checks compare outputs: no dropout


# -- reporting ---------------------------------------------------------------------------------------


def require(condition: bool, name: str, prop: str, detail: str, contract: str = "strategy") -> None:
    """Raise the contract's ``AssertionError`` (``assert`` statements vanish under ``python -O``)."""
    if not condition:
        raise AssertionError(f"{name} breaks the {contract} contract ({prop}): {detail}")


@contextmanager
def checking(name: str, prop: str, contract: str = "strategy") -> Iterator[None]:
    """Report any error the strategy (or method) raises while ``prop`` is checked as that property's failure."""
    try:
        yield
    except AssertionError:
        raise
    except Exception as error:
        raise AssertionError(f"{name} breaks the {contract} contract ({prop}): {type(error).__name__}: {error}") from error


class Contract:
    """The checks on one strategy instance; each method is one property of the module docstring."""

    def __init__(self, strategy: EmbeddingStrategy) -> None:
        self.strategy = strategy
        self.name = type(strategy).__name__
        self.trailing = tuple(strategy.code_shape)

    def require(self, condition: bool, prop: str, detail: str) -> None:
        require(condition, self.name, prop, detail)

    def check_codes(self, codes: object, batch: tuple[int, ...], prop: str, what: str) -> None:
        """``codes`` are integers shaped ``(*batch, *code_shape)``, vocabulary ids within the vocabulary."""
        self.require(isinstance(codes, Tensor), prop, f"{what} is a {type(codes).__name__}, not a tensor")
        self.require(not codes.is_floating_point() and not codes.is_complex() and codes.dtype != torch.bool, prop,
                     f"{what} has dtype {codes.dtype}, not an integer dtype")
        shape = (*batch, *self.trailing)
        self.require(tuple(codes.shape) == shape, prop, f"{what} has shape {tuple(codes.shape)}, expected {shape} "
                     f"(batch {batch} then code_shape {self.trailing})")
        vocab = self.strategy.vocab_size
        if vocab is not None and codes.numel():
            low, high = int(codes.min()), int(codes.max())
            self.require(0 <= low and high < vocab, prop, f"{what} holds ids in [{low}, {high}], outside [0, {vocab})")

    def vectors(self, codes: Tensor, prop: str, what: str) -> Tensor:
        """``forward(codes)``, checked to be finite ``(*batch, hidden_size)`` vectors."""
        out = self.strategy(codes)
        shape = (*codes.shape[: codes.dim() - len(self.trailing)], self.strategy.hidden_size)
        self.require(isinstance(out, Tensor) and tuple(out.shape) == shape, prop,
                     f"forward({what}) gave {tuple(getattr(out, 'shape', ()))}, expected {shape}")
        self.require(out.is_floating_point() and bool(torch.isfinite(out).all()), prop,
                     f"forward({what}) gave non-finite or non-float values ({out.dtype})")
        return out

    # -- the properties --------------------------------------------------------------------------------
    def codes_and_forward(self) -> Tensor:
        prop = "codes and forward"
        with checking(self.name, prop):
            codes = self.strategy.code_sampler()((4, 6))
            self.check_codes(codes, (4, 6), prop, "code_sampler()((4, 6))")
            out = self.vectors(codes, prop, "sampled codes")
            again = self.vectors(codes[1], prop, "one row of them")
            self.require(torch.allclose(again, out[1], rtol=1e-5, atol=1e-6), prop,
                         "a token's vector depends on the batch shape: forward(codes[1]) differs from forward(codes)[1]")
        return codes

    def text_encoder(self, tokenizer: str, texts: list[str]) -> tuple[TextEncoder, Tensor]:
        """The encoder and every code it gave (texts, then specials) as one ``(tokens, *code_shape)`` tensor."""
        prop = "text encoder"
        with checking(self.name, prop):
            encoder = self.strategy.text_encoder(tokenizer)
            self.require(isinstance(encoder, TextEncoder), prop,
                         f"text_encoder() gave a {type(encoder).__name__}, which lacks encode/special_code/fingerprint")
            if isinstance(encoder, FittableTextEncoder) and not encoder.fitted:
                encoder.fit(texts)
                self.require(encoder.fitted, prop, "the text encoder is not fitted after fit(texts)")
            encoded = encoder.encode(texts)
            self.require(len(encoded) == len(texts), prop, f"encode() gave {len(encoded)} arrays for {len(texts)} texts")
            parts = []
            for text, codes in zip(texts, encoded):
                codes = torch.as_tensor(np.asarray(codes))
                self.require(codes.dim() >= 1 and len(codes) > 0, prop, f"encode() gave no tokens for {text!r}")
                self.check_codes(codes, (len(codes),), prop, f"the codes of {text!r}")
                parts.append(codes)
            for special in SPECIALS:
                code = torch.as_tensor(np.asarray(encoder.special_code(special)))
                self.check_codes(code, (), prop, f"special_code({special!r})")
                parts.append(code[None])
            fingerprint = encoder.fingerprint()
            self.require(isinstance(fingerprint, str) and bool(fingerprint), prop, "fingerprint() is not a non-empty string")
            every = torch.cat(parts).long()
            self.vectors(every, prop, "the encoded codes")
        return encoder, every

    def tied_decoder(self) -> None:
        prop = "tied decoder"
        strategy = self.strategy
        hidden = torch.randn(5, strategy.hidden_size)
        with checking(self.name, prop):
            weight = strategy.full_weight()
            if weight is None:
                try:
                    strategy.decoder_logits(hidden)
                except UserError as error:
                    self.require(self.name in str(error), prop, f"decoder_logits refuses without naming the strategy: {error}")
                else:
                    self.require(False, prop, "full_weight() is None, yet decoder_logits() gave scores instead of refusing")
                return
            vocab = strategy.vocab_size
            shape = (vocab, strategy.hidden_size)
            self.require(tuple(weight.shape) == shape, prop, f"full_weight() is {tuple(weight.shape)}, expected {shape}")
            rows = strategy(torch.arange(vocab))
            self.require(torch.allclose(weight, rows, rtol=1e-5, atol=1e-6), prop,
                         "full_weight()'s rows differ from forward() of every vocabulary id")
            logits = strategy.decoder_logits(hidden)
            self.require(tuple(logits.shape) == (5, vocab), prop, f"decoder_logits gave {tuple(logits.shape)}, expected {(5, vocab)}")
            self.require(torch.allclose(logits, hidden @ weight.T, rtol=1e-4, atol=1e-5), prop,
                         "decoder_logits(h) differs from h @ full_weight().T")
            components = strategy.component_codes()
            if components is not None:
                self.require(components.dim() == 2 and len(components) == vocab, prop,
                             f"component_codes() is {tuple(components.shape)}, expected ({vocab}, k)")

    def gradients(self, batches: list[Tensor]) -> None:
        prop = "gradients"
        strategy = self.strategy
        with checking(self.name, prop):
            strategy.zero_grad(set_to_none=True)
            loss = sum((strategy(codes) * torch.randn(*codes.shape[:1], strategy.hidden_size)).sum() for codes in batches)
            trainable = [(name, p) for name, p in strategy.named_parameters() if p.requires_grad]
            self.require(bool(trainable), prop, "the strategy has no trainable parameter")
            if loss.requires_grad:  # else nothing is connected, and every parameter is missing below
                loss.backward()
            missing = [name for name, p in trainable if p.grad is None]
            self.require(not missing, prop, f"no gradient reaches {missing} from a loss on forward()'s output")
            broken = [name for name, p in trainable if not torch.isfinite(p.grad).all()]
            self.require(not broken, prop, f"non-finite gradients in {broken}")
            zero = [name for name, p in trainable if not p.grad.any()]
            self.require(not zero, prop, f"the gradients of {zero} are zero everywhere on sampled and encoded codes")
            strategy.zero_grad(set_to_none=True)

    def parameter_count(self) -> None:
        prop = "parameter count"
        strategy = self.strategy
        with checking(self.name, prop):
            count = strategy.num_embedding_parameters()
            self.require(isinstance(count, int) and not isinstance(count, bool), prop,
                         f"num_embedding_parameters() is a {type(count).__name__}, not an int")
            buffers = {name for name, _ in strategy.named_buffers()}
            stored = sum(p.numel() for p in strategy.parameters())
            stored += sum(v.numel() for name, v in strategy.state_dict().items() if name in buffers)
            self.require(1 <= count <= stored, prop, f"num_embedding_parameters()={count} is outside [1, {stored}] (the "
                         f"values the module stores: parameters and persistent buffers)")

    def picklable_sampler(self) -> None:
        prop = "picklable code sampler"
        with checking(self.name, prop):
            sampler = self.strategy.code_sampler()
            held = modules_inside(sampler)
            self.require(not held, prop, f"the sampler holds {held}, which every DataLoader worker would copy: "
                         f"draw codes from plain numbers (functools.partial(torch.randint, vocab_size) is the default)")
            copy = pickle.loads(pickle.dumps(sampler))
            codes = copy((2, 3))
            self.check_codes(codes, (2, 3), prop, "the unpickled sampler's codes")
            self.require(codes.device.type == "cpu", prop, f"the sampler draws on {codes.device}, not the CPU")

    def round_trip(self, codes: Tensor, encoder: TextEncoder, tokenizer: str, texts: list[str]) -> None:
        prop = "checkpoint round trip"
        strategy = self.strategy
        with checking(self.name, prop):
            config = strategy.config(with_sizes=True)
            self.require(json.loads(json.dumps(config)) == config, prop, f"config() is not plain data: {config!r}")
            self.require("<locals>" not in config["class_path"], prop, f"{config['class_path']} is defined inside a "
                         f"function, where no config can name it: define the class at a module's top level")

            fresh = build_from_config(EmbeddingStrategy, config, "embedding").eval()
            self.require(type(fresh) is type(strategy), prop, f"config() builds a {type(fresh).__name__}")
            fresh.load_state_dict(strategy.state_dict())  # strict: same keys, and shapes the module accepts
            mine, theirs = persistent_buffers(strategy), persistent_buffers(fresh)
            differ = [name for name, value in mine.items() if not torch.equal(value, theirs[name])]
            self.require(not differ, prop, f"buffers {differ} differ after loading the state dict")
            self.require((fresh.vocab_size, fresh.hidden_size) == (strategy.vocab_size, strategy.hidden_size), prop,
                         "the sizes differ after loading the state dict")
            self.require(torch.equal(fresh(codes), strategy(codes)), prop,
                         f"a strategy rebuilt from config() {config} and loaded with the state dict computes other vectors")
            again = fresh.text_encoder(tokenizer)
            same = all(np.array_equal(a, b) for a, b in zip(again.encode(texts), encoder.encode(texts)))
            self.require(same, prop, "the rebuilt strategy's text encoder gives other codes for the same texts")


# -- compression methods -----------------------------------------------------------------------------


def contract_job(vocab_size: int = 30522, hidden_size: int = 16, seed: int = 0) -> Job:
    """A small job as ``lit-embed compress`` hands one to a method: a seeded random table, every 30th id and the default
    tokenizer's specials (0, 100-103) common, ``<unk>`` 100, Zipf-like counts (the common ids the frequent ones)."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab_size, hidden_size, generator=generator)
    common = torch.tensor(sorted(set(range(0, vocab_size, 30)) | {i for i in (0, 100, 101, 102, 103) if i < vocab_size}))
    counts = torch.zeros(vocab_size, dtype=torch.long)
    counts[common] = 1000 // torch.arange(1, len(common) + 1)
    return Job(weight, common, unk_id=100 if vocab_size > 100 else None, counts=counts, seed=seed)


def fitted(method: str | type[CompressionMethod], options: dict | None = None, job: Job | None = None) -> dict:
    """What ``method`` (a registered name or class) with ``options`` fits to ``job`` (default :func:`contract_job`)."""
    name = method if isinstance(method, str) else method.name
    compression = method_named(name, options)
    job = job or contract_job()
    compression.check(job)
    return compression.fit(job)


def check_compression_method(
    method: str | type[CompressionMethod],
    *,
    options: dict | None = None,
    vocab_size: int = 30522,
    hidden_size: int = 16,
    tokenizer: str = "all-MiniLM-L6-v2",
    seed: int = 0,
) -> dict:
    """Check a compression method against its contract; returns what it fitted (by k).

    The method (registered under its ``name``; ``options`` its own, small ones keep the check fast) fits
    :func:`contract_job`'s table; then:

    1. **options**: ``Options`` is a dataclass whose every field has a default (the command offers each as ``--FIELD``).
    2. **fits**: ``fit`` gives at least one candidate, each an :class:`EmbeddingStrategy` of the table's sizes.
    3. **strategy contract**: each candidate passes :func:`check_strategy` (forward, text encoder, gradients for
       fine-tuning, its own checkpoint round trip).
    4. **parameter count**: ``num_embedding_parameters()`` (what compress reports) is what ``count_parameters`` gives
       from the candidate's ``init_args()`` alone, and the same after a checkpoint round trip.
    5. **deterministic**: fitting again with the same seed gives the same state, bit for bit.
    6. **compact file round trip**: the candidate saved as compress saves it beside a HuggingFace export
       (``compressed_embedding.safetensors``) and loaded back computes the same vectors.
    """
    from lit_embed.compress.model_io import load_compact, save_compact  # the command's own writer and reader

    cls = method_class(method) if isinstance(method, str) else method
    name = cls.__name__

    def need(condition: bool, prop: str, detail: str) -> None:
        require(condition, name, prop, detail, contract="compression method")

    with checking(name, "options", "compression method"):
        need(dataclasses.is_dataclass(cls.Options), "options", f"Options ({cls.Options!r}) is not a dataclass")
        missing = [f.name for f in dataclasses.fields(cls.Options)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        need(not missing, "options", f"options {missing} have no default")
    job = contract_job(vocab_size, hidden_size, seed)
    with checking(name, "fits", "compression method"):
        candidates = fitted(cls, options, job)
        need(isinstance(candidates, dict) and bool(candidates), "fits", f"fit() gave {candidates!r}, not a dict of strategies")
    for key, strategy in candidates.items():
        need(isinstance(strategy, EmbeddingStrategy), "fits", f"fit()[{key!r}] is a {type(strategy).__name__}")
        need((strategy.vocab_size, strategy.hidden_size) == (vocab_size, hidden_size), "fits",
             f"fit()[{key!r}] is {strategy.vocab_size} x {strategy.hidden_size}, the table {vocab_size} x {hidden_size}")
        def built(vocab: int | None, hidden: int, strategy: EmbeddingStrategy = strategy) -> EmbeddingStrategy:
            return strategy

        built.__name__ = f"{name}.fit()[{key!r}] ({type(strategy).__name__})"
        check_strategy(built, vocab_size=vocab_size, hidden_size=hidden_size, tokenizer=tokenizer, seed=seed)
        with checking(name, "parameter count", "compression method"):
            count = strategy.num_embedding_parameters()
            formula = type(strategy).count_parameters(vocab_size, hidden_size, **strategy.init_args())
            need(count == formula, "parameter count", f"fit()[{key!r}] reports {count} parameters, its count_parameters "
                 f"{formula} from init_args() {strategy.init_args()}")
            fresh = build_from_config(EmbeddingStrategy, strategy.config(with_sizes=True), "embedding")
            fresh.load_state_dict(strategy.state_dict())
            need(fresh.num_embedding_parameters() == count, "parameter count",
                 f"the strategy rebuilt from its checkpoint reports {fresh.num_embedding_parameters()}, not {count}")
    with checking(name, "deterministic", "compression method"):
        again = fitted(cls, options, contract_job(vocab_size, hidden_size, seed))
        need(list(again) == list(candidates), "deterministic", f"a second fit gave candidates {list(again)}, not {list(candidates)}")
        for key, strategy in candidates.items():
            first, second = strategy.state_dict(), again[key].state_dict()
            differ = [k for k in first if not torch.equal(first[k], second[k])]
            need(not differ, "deterministic", f"fitted twice with seed {seed}, fit()[{key!r}]'s {differ} differ")
    with checking(name, "compact file round trip", "compression method"), tempfile.TemporaryDirectory() as folder:
        codes = torch.randint(0, vocab_size, (3, 5), generator=torch.Generator().manual_seed(seed))
        for key, strategy in candidates.items():
            path = Path(folder) / f"{key}.safetensors"
            save_compact(strategy, path)
            loaded = load_compact(path).eval()
            need(torch.equal(loaded(codes), strategy.eval()(codes)), "compact file round trip",
                 f"fit()[{key!r}] read back from {path.name} computes other vectors")
    return candidates


def persistent_buffers(module: nn.Module) -> dict[str, Tensor]:
    names = {name for name, _ in module.named_buffers()}
    return {name: value for name, value in module.state_dict().items() if name in names}


def modules_inside(obj: object) -> list[str]:
    """The modules and parameters that pickling ``obj`` would copy along."""
    found: list[str] = []

    class Spy(pickle.Pickler):
        def persistent_id(self, item: object) -> None:
            if isinstance(item, (nn.Module, nn.Parameter)):
                found.append(type(item).__name__)

    Spy(io.BytesIO()).dump(obj)
    return found


__all__ = ["TEXTS", "check_compression_method", "check_strategy"]
