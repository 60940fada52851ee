"""tools/typecheck.py holds mypy's report to a baseline that only shrinks: a new error fails, a fixed one fails until
the baseline drops it, and an error that only moves to another line is the same error."""

from __future__ import annotations

import importlib.util
import re
from collections import Counter

import pytest

from tests.helpers import REPO

spec = importlib.util.spec_from_file_location("typecheck", REPO / "tools" / "typecheck.py")
typecheck = importlib.util.module_from_spec(spec)
spec.loader.exec_module(typecheck)

REPORT = """\
lit_embed/a.py:10: error: Incompatible return value type (got "str | None", expected "str")  [return-value]
lit_embed/a.py:12: note: See https://mypy.rtfd.io/en/stable/_refs.html#code-return-value
lit_embed/b.py:96: error: Name "count" already defined on line 87  [no-redef]
lit_embed/b.py:99: error: Item "None" of "Tensor | None" has no attribute "sum"  [union-attr]
lit_embed/b.py:140: error: Item "None" of "Tensor | None" has no attribute "sum"  [union-attr]
Found 4 errors in 2 files (checked 2 source files)
"""


def keys(report: str) -> Counter:
    return Counter(key for key, _ in typecheck.errors(report))


def test_errors_are_keyed_without_line_numbers_and_notes_are_not_errors():
    found = typecheck.errors(REPORT)
    assert [where for _, where in found] == ["lit_embed/a.py:10", "lit_embed/b.py:96", "lit_embed/b.py:99", "lit_embed/b.py:140"]
    assert found[1][0] == 'lit_embed/b.py: [no-redef] Name "count" already defined on line N'
    moved = REPORT.replace(":96:", ":120:").replace("on line 87", "on line 111").replace(":10:", ":3:")
    assert keys(moved) == keys(REPORT)


@pytest.mark.parametrize(("report", "new", "fixed"), [
    (REPORT, [], {}),
    # a third copy of an error the baseline holds twice is new; where it is, is said
    (REPORT + 'lit_embed/b.py:200: error: Item "None" of "Tensor | None" has no attribute "sum"  [union-attr]\n',
     ["lit_embed/b.py:200"], {}),
    (REPORT + 'lit_embed/c.py:1: error: Missing return statement  [empty-body]\n', ["lit_embed/c.py:1"], {}),
    # one of the two copies fixed, and the first error fixed
    ("\n".join(line for line in REPORT.splitlines() if ":140:" not in line and ":10:" not in line), [],
     {'lit_embed/b.py: [union-attr] Item "None" of "Tensor | None" has no attribute "sum"': 1,
      'lit_embed/a.py: [return-value] Incompatible return value type (got "str | None", expected "str")': 1}),
], ids=["unchanged", "one more of a kind", "a new kind", "two fixed"])
def test_a_new_error_and_a_fixed_one_are_both_found(report, new, fixed):
    found_new, found_fixed = typecheck.compare(typecheck.errors(report), keys(REPORT))
    assert [where for _, where in found_new] == new
    assert found_fixed == Counter(fixed)


def test_the_baseline_round_trips_and_shrinking_keeps_the_rest(tmp_path):
    path = tmp_path / "baseline.txt"
    typecheck.write_baseline(path, keys(REPORT))
    assert path.read_text().startswith("#") and typecheck.read_baseline(path) == keys(REPORT)
    _, fixed = typecheck.compare(typecheck.errors(REPORT.split("\n", 2)[2]), typecheck.read_baseline(path))
    typecheck.write_baseline(path, typecheck.read_baseline(path) - fixed)
    assert sum(typecheck.read_baseline(path).values()) == 3


def test_the_shipped_baseline_is_in_the_form_the_check_reads():
    for key in typecheck.read_baseline(typecheck.BASELINE):
        assert re.fullmatch(r"lit_embed/[^:]+\.py: \[[a-z0-9-]+\] .+", key), key  # no line number
