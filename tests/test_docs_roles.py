"""The API pages' griffe extension (tools/docs/sphinx_roles.py) on a package of every kind of role and comment."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

from tests.helpers import REPO

griffe = pytest.importorskip("griffe")  # the docs extra

PACKAGE = {
    "__init__.py": '''
        """See :class:`~pkg.core.Thing`, :func:`pkg.core.make`, :class:`torch.nn.Module` and :mod:`pkg.core`."""
        ''',
    "core.py": '''
        """Core: :data:`LIMIT`, :meth:`Thing.run()` and :class:`Path`; in code ``:class:`Thing``` stays."""

        from pathlib import Path

        #: How many, at most.
        #: Two lines.
        LIMIT = 3
        # a plain comment
        OTHER = 4
        #: not this one: it has a docstring of its own
        DOCUMENTED = 5
        """Its own docstring."""


        class Thing:
            """A thing; :meth:`run` runs it."""

            #: The class's size.
            size = 2

            def run(self):
                """Runs."""


        def make():
            """Makes a :class:`Thing`, not a :class:`~pkg.nowhere.Ghost`."""
        ''',
}


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    root = tmp_path_factory.mktemp("roles")
    (root / "pkg").mkdir()
    for name, text in PACKAGE.items():
        (root / "pkg" / name).write_text(textwrap.dedent(text).lstrip())
    spec = importlib.util.spec_from_file_location("sphinx_roles", REPO / "tools" / "docs" / "sphinx_roles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    extensions = griffe.load_extensions(module.SphinxRoles)
    return griffe.load("pkg", search_paths=[str(root)], extensions=extensions, docstring_parser="google")


def ref(identifier: str, shown: str) -> str:
    return f'<autoref identifier="{identifier}" optional><code>{shown}</code></autoref>'


def test_each_role_is_an_optional_reference_to_the_name_it_resolves_to(package):
    assert package.docstring.value == (
        f"See {ref('pkg.core.Thing', 'Thing')}, {ref('pkg.core.make', 'pkg.core.make')}, "
        f"{ref('torch.nn.Module', 'torch.nn.Module')} and {ref('pkg.core', 'pkg.core')}.")
    assert package["core"].docstring.value == (  # module scope, a class's member, an import; inline code untouched
        f"Core: {ref('pkg.core.LIMIT', 'LIMIT')}, {ref('pkg.core.Thing.run', 'Thing.run()')} and "
        f"{ref('pathlib.Path', 'Path')}; in code ``:class:`Thing``` stays.")
    assert package["core.Thing"].docstring.value == f"A thing; {ref('pkg.core.Thing.run', 'run')} runs it."
    # a name that resolves nowhere stays the name: autorefs shows an optional reference it cannot place as code
    assert package["core.make"].docstring.value == (
        f"Makes a {ref('pkg.core.Thing', 'Thing')}, not a {ref('pkg.nowhere.Ghost', 'Ghost')}.")


def test_doc_comments_become_the_docstrings_of_constants_that_have_none(package):
    assert package["core.LIMIT"].docstring.value == "How many, at most.\nTwo lines."
    assert package["core.Thing.size"].docstring.value == "The class's size."
    assert package["core.OTHER"].docstring is None  # a plain comment is no documentation
    assert package["core.DOCUMENTED"].docstring.value == "Its own docstring."
