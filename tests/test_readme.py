"""The README and the docs pages stay true: the test command is CI's, the tables are measured, the plugin example
runs, the README's links lead somewhere (the pages' own links are ``mkdocs build --strict``'s to check)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lit_embed.measures.accounting import human
from tests.helpers import CONFIGS, REPO
from tests.helpers.cli import DOCS, README, code_blocks, page, run_params, section


@pytest.mark.parametrize("text", [README, page("quick-start")], ids=["README", "quick-start"])
def test_quick_start_is_two_commands_and_ci_runs_the_test_one(text):
    quick = code_blocks("bash", text)[0].strip().splitlines()
    assert len(quick) == 2 and "configs/demo.yaml" in quick[0]
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == quick[1]


def experiment_rows(text: str) -> list[tuple[str, list[str]]]:
    """``(paper, cells)`` of every row of the experiment tables in ``text``; a header's "<paper> experiment" names
    the paper."""
    rows, paper = [], None
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0].endswith(" experiment"):
            paper = cells[0].removesuffix(" experiment")
        elif not line.startswith("|"):  # a table ends: the rows of the next are no experiments until a header says
            paper = None
        elif line.startswith("| `") and paper:
            rows.append((paper, cells))
    return rows


EXPERIMENTS = section("experiments", "The experiment files")


def test_every_experiment_has_a_row():
    listed = {(paper, cells[0].strip("`")) for paper, cells in experiment_rows(EXPERIMENTS)}
    assert listed == {(p.parent.name, p.stem) for p in (CONFIGS / "experiments").glob("*/*.yaml")}


def test_the_readmes_rows_are_the_experiments_pages():
    """The front door shows some rows of the experiments page, each as the page has it (which the next test runs)."""
    shown = experiment_rows(README)
    assert shown and all(row in experiment_rows(EXPERIMENTS) for row in shown)


#: Naive k-means sizes its tables by the clustering of roberta-base's matrix, which is on the hub: the README counts
#: these rows with the packaged MiniLM's matrix given (its note says so), which clusters for about a minute.
MATRIX_GIVEN = ("--model.init_args.vocab_size", "30522",
                "--model.init_args.embedding.init_args.assignment.init_args.source", "all-MiniLM-L6-v2")


def experiment_cases():
    for paper, row in experiment_rows(EXPERIMENTS):
        naive = "naive k-means" in row[1]
        yield pytest.param(paper, row, marks=[pytest.mark.slow] if naive else [], id=row[0].strip("`"))


@pytest.mark.parametrize("paper,row", experiment_cases())
def test_experiment_table_is_what_params_prints(paper, row):
    name, strategy, total, embedding, pcr_all, pcr_emb, poep, *published = row
    given = MATRIX_GIVEN if "naive k-means" in strategy else ()
    report = run_params(CONFIGS / "experiments" / paper / f"{name.strip('`')}.yaml", *given)
    assert (total, embedding) == (human(report["total_params"]), human(report["embedding_params"]))
    assert pcr_all == f"{100 * report['pcr_all']:.1f}%"
    assert pcr_emb == f"{100 * report['pcr_emb']:.2f}%"
    assert poep == f"{100 * report['poep']:.3f}%"
    if paper == "hashformers":  # the paper's Table 2 figures, as tests/test_hashformers.py checks them
        from tests.helpers.papers import TABLE_2

        if published != ["—"]:
            total, embedding, *ratios = TABLE_2[name.strip("`")]
            assert published == [" / ".join([total, embedding, *(f"{r:.1f}" for r in ratios)])]


def test_the_plugin_example_counts_trains_and_keeps_the_contract_as_written(tmp_path, monkeypatch, capsys):
    """Write the extending page's two files, run its two commands (fit shortened to one step, through the installed
    console script: the one test of it), then its contract check. Counting and the contract run in this process, as
    ``PYTHONPATH=.`` would have them: the example's folder first on the path, its module imported afresh."""
    from lit_embed.commands import main

    text = page("extending")
    module = next(block for block in code_blocks("python", text) if "class LowRankEmbedding" in block)
    (tmp_path / "my_embeddings.py").write_text(module)
    (tmp_path / "low_rank.yaml").write_text(next(b for b in code_blocks("yaml", text) if "my_embeddings." in b))
    commands = next(block for block in code_blocks("bash", text) if "low_rank.yaml" in block).strip().splitlines()
    assert len(commands) == 2
    params, fit = (command.replace("$LIT_EMBED", str(REPO)).split() for command in commands)
    assert params[:3] == fit[:2] + ["params"] and fit[:3] == ["PYTHONPATH=.", "lit-embed", "fit"]
    cli = str(Path(sys.executable).parent / "lit-embed")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([".", os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([cli, *fit[2:], "--trainer.fast_dev_run", "true"], cwd=tmp_path, env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_embeddings", raising=False)  # another test's module of that name
    try:
        assert main(params[2:]) == 0
        rank = 32
        expected = 30522 * rank + rank * 64  # A: V x r, B: r x d with the demo's tiny backbone (d = 64)
        counted = capsys.readouterr().out
        assert f"{expected:,}" in counted and "LowRankEmbedding" in counted
        contract = next(block for block in code_blocks("python", text) if "check_strategy(" in block)
        exec(compile(contract, "docs/extending.md", "exec"), {})  # raises AssertionError naming a broken property
    finally:
        sys.modules.pop("my_embeddings", None)  # the example's module is this test's alone


def heading_anchors(text: str) -> set[str]:
    """The anchors of a Markdown file's headings, as MkDocs (Python-Markdown's toc) and GitHub make them."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.M)
    return {re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", heading).strip().lower()) for heading in headings}


def test_the_readmes_links_lead_to_files_and_headings_that_exist():
    """Every relative link of the front door (to a docs page, a heading of one, a folder or a file of the repository)."""
    links = re.findall(r"\]\(([^)#:]*)(?:#([^)]*))?\)", README)
    assert any(target.startswith("docs/") for target, _ in links)
    for target, anchor in links:
        path = REPO / (target or "README.md")
        assert path.exists(), target
        if anchor:
            assert anchor in heading_anchors(path.read_text()), f"{target}#{anchor}"
    pages = {p.name for p in DOCS.glob("*.md")} - {"index.md", "benchmarks.md"}  # benchmarks.md is RESULTS.md, linked
    assert pages <= {Path(target).name for target, _ in links}  # a door to every page


def test_every_module_has_its_place_on_the_api_pages():
    """A module added to lit-embed shows on the API pages (mkdocstrings renders what a page names)."""
    named = set(re.findall(r"^::: (lit_embed[\w.]*)$", "".join(p.read_text() for p in (DOCS / "api").glob("*.md")), flags=re.M))
    package = REPO / "lit_embed"
    modules = {".".join(("lit_embed", *p.relative_to(package).with_suffix("").parts)).removesuffix(".__init__")
               for p in package.rglob("*.py") if not any(part.startswith("_") for part in p.relative_to(package).parts[:-1])
               and (p.name == "__init__.py" or not p.name.startswith("_"))}
    assert modules - {"lit_embed"} == named
