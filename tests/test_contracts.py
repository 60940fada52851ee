"""The task and command contracts (lit_embed.testing.check_task, check_command): lit-embed's own keep them, and a task
or command that breaks one fails naming the property. (The strategy contract: tests/test_strategy_contract.py.)"""

from __future__ import annotations

import dataclasses
import re

import pytest

from lit_embed.commands import COMMANDS
from lit_embed.data.tasks import TASKS, register_task
from lit_embed.testing import check_command, check_task


def test_the_shipped_task_keeps_the_contract():
    assert check_task("topics") is TASKS["topics"]  # the one task whose data ships (the others are on the hub)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_built_in_command_keeps_the_contract(name):
    check_command(name)


def _topics(**changes):
    return dataclasses.replace(TASKS["topics"], name="broken_topics", **changes)


BROKEN = {
    "not registered": (lambda: _topics(), "registered", "unknown task 'broken_topics'"),
    "a label twice": (lambda: register_task(_topics(labels=("a", "a", "b", "c", "d", "e"))), "labels",
                      "are not two or more distinct names"),
    "one label": (lambda: register_task(_topics(labels=("only",))), "labels", "are not two or more distinct names"),
    "hub order of other labels": (lambda: register_task(_topics(source_labels=("x", "y"))), "labels",
                                  "source_labels ('x', 'y') are not the labels"),
    "a regression metric": (lambda: register_task(_topics(metrics=("spearman",))), "metrics",
                            "metric 'spearman' does not fit a classification task"),
    "labels the data does not have": (lambda: register_task(_topics(labels=("sports", "science"))), "data", ""),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_task_fails_naming_the_property(case):
    make, prop, detail = BROKEN[case]
    with pytest.raises(AssertionError, match=rf"^broken_topics breaks the task contract \({prop}\): .*{re.escape(detail)}"):
        check_task(make())


def test_a_batch_not_fitted_within_the_steps_fails_naming_it():
    with pytest.raises(AssertionError, match=r"^topics breaks the task contract \(fits one batch\): a tiny classifier's "
                                             r"loss on one batch went from .* in 1 steps"):
        check_task("topics", steps=1)


def test_an_unknown_command_fails_the_contract():
    with pytest.raises(AssertionError, match=r"^nosuch breaks the command contract \(declared\): no lit_embed.commands "
                                             r"entry point names it \(found: analyze, compress"):
        check_command("nosuch")
