"""The docstrings' Sphinx roles (:class:`~lit_embed.x.Y`, :meth:`rebuild`) as links on the API pages.

lit-embed's docstrings are Google style with Sphinx's cross-reference roles, which Markdown would show as
``:class:`` beside the name. This griffe extension (mkdocs.yml loads it) rewrites each role into an optional
autorefs reference: a link where the name it resolves to has an entry on the API pages, the name as code where
it has none (a private helper, a torch class), and no warning either way, so ``mkdocs build --strict`` stays
about broken page links and anchors. A name resolves as Python would from the docstring's object (its module's
imports, the class's members); ``~`` shows the last part only, as in Sphinx.
"""

from __future__ import annotations

import html
import re

import griffe

ROLE = re.compile(r":(?:class|meth|func|attr|data|mod|exc|obj):`(?P<short>~?)(?P<name>[\w.]+)(?P<call>\(\))?`")


def resolve(obj: griffe.Object, name: str) -> str:
    """``name``'s full path from ``obj``'s scope (its first part resolved, the rest appended), or ``name``."""
    head, _, rest = name.partition(".")
    try:
        path = obj.resolve(head)
    except (griffe.NameResolutionError, KeyError, AttributeError):
        return name
    return f"{path}.{rest}" if rest else path


def linked(obj: griffe.Object, match: re.Match) -> str:
    name = match["name"]
    shown = (name.rsplit(".", 1)[-1] if match["short"] else name) + (match["call"] or "")
    identifier = html.escape(resolve(obj, name), quote=True)
    return f'<autoref identifier="{identifier}" optional><code>{html.escape(shown)}</code></autoref>'


class SphinxRoles(griffe.Extension):
    """Rewrites the roles once the package is loaded whole, so that names resolve across its modules."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        pending = [pkg]
        while pending:
            obj = pending.pop()
            if obj.docstring is not None:
                obj.docstring.value = ROLE.sub(lambda match, obj=obj: linked(obj, match), obj.docstring.value)
            pending.extend(member for member in obj.members.values() if not member.is_alias)
