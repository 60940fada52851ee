"""Every built-in compression method keeps the contract plugin authors run (lit_embed.testing.check_compression_method),
and a broken one fails it, naming the property."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from lit_embed.compress.methods import CompressionMethod, with_common_rows
from lit_embed.embeddings import UnkEmbedding
from lit_embed.testing import check_compression_method

#: Each built-in method's options for the check: small, so that it runs in seconds.
CONTRACT_OPTIONS = {
    "sparse_coding": {"k": [2, 3]},
    "pca": {"k": 4},
    "unk": {},
    "aq": {"codebooks": 4, "codewords": 8, "max_steps": 3},
}


@pytest.mark.parametrize("method", sorted(CONTRACT_OPTIONS))
def test_every_built_in_method_keeps_the_contract(method):
    candidates = check_compression_method(method, options=CONTRACT_OPTIONS[method])
    assert all(strategy.vocab_size == 30522 for strategy in candidates.values())


def test_the_cases_cover_every_built_in_method():
    built_in = {name for name, cls in CompressionMethod.registry.items() if cls.__module__.startswith("lit_embed.")}
    assert built_in == set(CONTRACT_OPTIONS)


# -- a broken method fails, naming the property ----------------------------------------------------------


class Broken(CompressionMethod):
    """Rare tokens take a common row; each subclass below breaks one property of the contract."""

    def fit(self, job):
        strategy = with_common_rows(UnkEmbedding, job.weight, job.common_ids)
        strategy.unk_row.fill_(self.pick(job))
        return {None: strategy}

    def pick(self, job) -> int:
        return 0


@dataclass
class NoDefault:
    """Args:
        row: a row, with no default.
    """

    row: int


class Undefaulted(Broken):
    name = "contract_undefaulted"
    Options = NoDefault


class Undeterministic(Broken):
    name = "contract_undeterministic"

    fits = itertools.count(1)

    def pick(self, job) -> int:
        return next(self.fits)  # state kept between fits, not drawn from the job's seed


class Sized(Broken):
    name = "contract_sized"

    def fit(self, job):
        return {None: with_common_rows(UnkEmbedding, job.weight[:, :8], job.common_ids)}


class Miscounted(Broken):
    name = "contract_miscounted"

    def fit(self, job):
        strategy = super().fit(job)[None]
        strategy.num_embedding_parameters = lambda: 7  # says one count, its formula another
        return {None: strategy}


@pytest.mark.parametrize(("broken", "message"), [
    (Undefaulted, "Undefaulted breaks the compression method contract (options): options ['row'] have no default"),
    (Sized, "Sized breaks the compression method contract (fits): fit()[None] is 30522 x 8, the table 30522 x 16"),
    (Miscounted, "Miscounted breaks the compression method contract (parameter count): fit()[None] reports 7 parameters"),
    (Undeterministic, "Undeterministic breaks the compression method contract (deterministic): fitted twice with seed 0"),
])
def test_a_broken_method_fails_the_contract_naming_the_property(broken, message):
    with pytest.raises(AssertionError) as failed:
        check_compression_method(broken)
    assert message in str(failed.value)
