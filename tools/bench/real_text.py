"""Real English prose, read from this machine at benchmark time, and the token ids of it.

The benchmarks feed models the ids of real text, not uniformly random ids: text is Zipf-distributed,
so a batch touches far fewer distinct rows of a table than it has tokens, which decides what a sparse
or touched-row update costs. Nothing here ships text: the prose is what the machine already holds,
read in a fixed order until enough is found: Python's reference documentation (``pydoc_data``, part of
the standard library), the English manual pages (``/usr/share/man/man1``-``man9``, roff requests and
escapes stripped) and the package documentation under ``/usr/share/doc`` (READMEs, NEWS, changelogs,
plain text and Markdown, gzipped or not). Files whose text was already read (a licence copied into
many packages) are read once.

Token ids are the packaged all-MiniLM-L6-v2 WordPiece tokenizer's (a 30522-id vocabulary, the only
one available offline): a batch is ``cls``, a window of consecutive tokens from a random place in the
token stream, ``sep``. For a model vocabulary of V ids they are used as they are where V exceeds the
tokenizer's, else folded into ``4 .. V-2`` (``4 + id % (V - 5)``), which keeps the Zipf profile and
avoids the benchmarks' special ids. Where no prose is found the ids are drawn from a Zipf law over
the vocabulary with ``ZIPF_EXPONENT``, the exponent fitted to the development machine's corpus, and a hash
strategy hashes words drawn from the same law (what was used is stated in every result: :func:`describe`).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import re
from collections.abc import Iterator
from itertools import zip_longest
from pathlib import Path

import numpy as np

#: The rank-frequency exponent of the MiniLM tokens of the prose this module read on the development
#: machine (1M characters, 272540 tokens, 8261 distinct ids; a least-squares fit of log count on log rank
#: over the 5000 most frequent ids): the fallback's.
ZIPF_EXPONENT = 1.26
#: Characters read by default (about 250K tokens; 32 windows of 510 tokens rarely overlap).
DEFAULT_CHARS = 1_000_000
#: The most characters taken from one file.
PER_FILE = 20_000
MAN = Path("/usr/share/man")
DOC = Path("/usr/share/doc")
DOC_NAMES = re.compile(r"(readme|news|changelog|changes|history|authors|faq)|\.(txt|md|rst)$", re.IGNORECASE)
ROFF_ESCAPE = re.compile(r"\\(f[A-Z0-9]|f\(..|f\[[^]]*\]|\(..|\*\(..|\*.|\[[^]]*\]|s[+-]?\d|[&e|^~0:%-])")
PUNCTUATION = ".,;:!?()[]'\"`*"
SPECIAL_IDS = 4  # ids 0-3 and V - 1 are the benchmarks' specials (builders.Specials)


def man_page_text(raw: str) -> str:
    """The prose of a roff manual page: requests (lines starting with ``.`` or ``'``, which start sections and
    paragraphs) become paragraph breaks, escapes are removed."""
    lines = ["" if line.startswith((".", "'")) else line for line in raw.splitlines()]
    return ROFF_ESCAPE.sub(lambda m: "-" if m.group(1) == "-" else " ", "\n".join(lines))


def is_prose(paragraph: str) -> bool:
    """Sentences rather than headings, option lists, code or commit records: eight words or more, at least
    70% of them made of letters alone."""
    words = paragraph.split()
    return len(words) >= 8 and sum(word.strip(PUNCTUATION).isalpha() for word in words) >= 0.7 * len(words)


def _read(path: Path) -> str:
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile):
        return ""
    if b"\0" in data[:4096]:  # binary
        return ""
    return data.decode("utf-8", errors="replace")


def _files(root: Path, pattern: str, keep) -> list[Path]:
    """The matching files, in an order that mixes the alphabet (by a digest of the name, the same on every
    machine) so that one family of pages (``gcloud-*``) does not fill the sample."""
    if not root.is_dir():
        return []
    found = [p for p in root.glob(pattern) if p.is_file() and not p.is_symlink() and keep(p)]
    return sorted(found, key=lambda p: hashlib.blake2b(str(p.relative_to(root)).encode(), digest_size=8).digest())


def sources() -> Iterator[tuple[str, str]]:
    """``(source, text)`` in the fixed reading order: Python's docs, then manual pages and package docs in turn."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        topics = {}
    for name in sorted(topics):
        yield "Python's reference documentation (pydoc_data)", topics[name]
    pages = _files(MAN, "man[1-9]/*", lambda p: True)
    docs = _files(DOC, "*/*", lambda p: DOC_NAMES.search(p.name.removesuffix(".gz")) is not None)
    for page, doc in zip_longest(pages, docs):
        if page is not None:
            yield "manual pages (/usr/share/man)", man_page_text(_read(page))
        if doc is not None:
            yield "package documentation (/usr/share/doc)", _read(doc)


@functools.lru_cache(maxsize=4)
def prose(chars: int = DEFAULT_CHARS) -> tuple[tuple[str, ...], dict[str, int]]:
    """At least ``chars`` characters of prose (fewer where the machine has less), as paragraphs, and the
    characters taken from each source. A paragraph met before (a licence, an option list shared by a family
    of commands) is taken once, and at most ``PER_FILE`` characters of one file."""
    paragraphs: list[str] = []
    taken: dict[str, int] = {}
    seen: set[bytes] = set()
    total = 0
    for source, text in sources():
        budget = PER_FILE
        for paragraph in re.split(r"\n\s*\n", text):
            paragraph = " ".join(paragraph.split())
            digest = hashlib.blake2b(paragraph.encode("utf-8", "replace"), digest_size=16).digest()
            if digest in seen or not is_prose(paragraph):
                continue
            seen.add(digest)
            paragraphs.append(paragraph)
            taken[source] = taken.get(source, 0) + len(paragraph)
            total += len(paragraph)
            budget -= len(paragraph)
            if budget <= 0:
                break
        if total >= chars:
            break
    return tuple(paragraphs), taken


@functools.lru_cache(maxsize=1)
def tokenizer():
    from lit_embed.embeddings import VocabTextEncoder

    return VocabTextEncoder("all-MiniLM-L6-v2")


@functools.lru_cache(maxsize=4)
def token_stream(chars: int = DEFAULT_CHARS) -> np.ndarray:
    """The WordPiece ids of :func:`prose`, paragraph after paragraph (empty where no prose was found)."""
    paragraphs, _ = prose(chars)
    if not paragraphs:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(tokenizer().encode(list(paragraphs)))


def describe(chars: int = DEFAULT_CHARS) -> str:
    """What the text-like ids are, for a result row."""
    paragraphs, taken = prose(chars)
    if not paragraphs:
        return f"Zipf ids, s={ZIPF_EXPONENT} (no prose found on this machine)"
    parts = ", ".join(f"{count / 1e6:.2f}M chars of {source}" for source, count in taken.items())
    return f"real text: MiniLM WordPiece ids of {parts}"


def windows(stream: np.ndarray, size: tuple[int, int], seed: int) -> np.ndarray:
    """``size[0]`` windows of ``size[1] - 2`` consecutive entries of ``stream`` (room left for the specials),
    each from a random place."""
    length = size[1] - 2
    starts = np.random.default_rng(seed).integers(0, len(stream) - length, size[0])
    return np.stack([stream[start : start + length] for start in starts])


def text_ids(size: tuple[int, int], vocab_size: int, seed: int = 0, chars: int = DEFAULT_CHARS) -> np.ndarray:
    """Windows (:func:`windows`) of the token ids of real text, as ids of a ``vocab_size`` vocabulary."""
    stream = token_stream(chars)
    if len(stream) <= size[1]:
        return zipf_ids((size[0], size[1] - 2), vocab_size, np.random.default_rng(seed))
    ids = windows(stream, size, seed)
    if vocab_size > len(tokenizer()) + 1:
        return ids
    return SPECIAL_IDS + ids % (vocab_size - SPECIAL_IDS - 1)


def text_codes(encoder, size: tuple[int, int], seed: int = 0, chars: int = DEFAULT_CHARS) -> np.ndarray:
    """Windows of a hash strategy's codes of the words of real text (``encoder``: its text encoder, fitted on the
    prose first where its codes depend on the corpus)."""
    paragraphs, _ = prose(chars)
    if not paragraphs:  # words drawn from the Zipf law instead ("w1" the most frequent)
        ranks = zipf_ids((size[0] * size[1],), 100_000 + SPECIAL_IDS + 1, np.random.default_rng(seed)) - SPECIAL_IDS + 1
        paragraphs = (" ".join(f"w{rank}" for rank in ranks),)
    from lit_embed.embeddings.text import FittableTextEncoder

    if isinstance(encoder, FittableTextEncoder) and not encoder.fitted:
        encoder.fit(paragraphs)
    return windows(np.concatenate(encoder.encode(list(paragraphs))), size, seed)


def zipf_ids(shape: tuple[int, ...], vocab_size: int, rng: np.random.Generator) -> np.ndarray:
    """Ids drawn from a Zipf law of :data:`ZIPF_EXPONENT` over ``4 .. V-2``, the most frequent first."""
    ranks = np.arange(1, vocab_size - SPECIAL_IDS)
    weights = ranks ** -ZIPF_EXPONENT
    return SPECIAL_IDS + rng.choice(len(ranks), size=shape, p=weights / weights.sum())


def uniform_ids(size: tuple[int, int], vocab_size: int, seed: int = 0) -> np.ndarray:
    """Uniformly random ids between the specials, as the benchmarks drew them before (the peers' worst case)."""
    return np.random.default_rng(seed).integers(SPECIAL_IDS, vocab_size - 1, (size[0], size[1] - 2))
