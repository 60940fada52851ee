"""What lit-embed's docstrings take from Sphinx, on the API pages: its roles and its ``#:`` comments.

The docstrings are Google style with Sphinx's cross-reference roles (:class:`~lit_embed.x.Y`, :meth:`rebuild`),
which Markdown would show as ``:class:`` beside the name, and module constants are documented by ``#:`` comments
above them, which griffe does not read. This griffe extension (mkdocs.yml loads it) makes each ``#:`` comment its
constant's docstring, and rewrites each role into an optional autorefs reference: a link where the name it
resolves to has an entry on the API pages, the name as code where it has none (a private helper, a torch class),
and no warning either way, so ``mkdocs build --strict`` stays about broken page links and anchors. A name
resolves as Python would from the docstring's object (its module's imports, the class's members); ``~`` shows
the last part only, as in Sphinx.
"""

from __future__ import annotations

import html
import re

import griffe

ROLE = re.compile(r":(?:class|meth|func|attr|data|mod|exc|obj):`(?P<short>~?)(?P<name>[\w.]+)(?P<call>\(\))?`")
CODE = re.compile(r"(``.+?``)", flags=re.S)  # a role inside inline code stays as written


def resolve(obj: griffe.Object, name: str) -> str:
    """``name``'s full path from ``obj``'s scope (its first part resolved, the rest appended), or ``name``."""
    head, _, rest = name.partition(".")
    try:
        path = obj.resolve(head)
    except (griffe.NameResolutionError, KeyError, AttributeError):
        return name
    return f"{path}.{rest}" if rest else path


def comment_docstring(attr: griffe.Attribute, lines: list[str]) -> str | None:
    """The ``#:`` comment lines right above ``attr``'s assignment, as text (``None`` where there are none)."""
    above = []
    for line in reversed(lines[: attr.lineno - 1]):
        if not line.strip().startswith("#:"):
            break
        above.append(line.strip()[2:].removeprefix(" "))
    return "\n".join(reversed(above)) or None


def linked(obj: griffe.Object, match: re.Match) -> str:
    name = match["name"]
    shown = (name.rsplit(".", 1)[-1] if match["short"] else name) + (match["call"] or "")
    identifier = html.escape(resolve(obj, name), quote=True)
    return f'<autoref identifier="{identifier}" optional><code>{html.escape(shown)}</code></autoref>'


class SphinxRoles(griffe.Extension):
    """Rewrites the roles once the package is loaded whole, so that names resolve across its modules."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        pending = [pkg]
        while pending:
            obj = pending.pop()
            if obj.is_attribute and obj.docstring is None and obj.lineno and (text := comment_docstring(
                    obj, obj.lines_collection[obj.filepath])):
                obj.docstring = griffe.Docstring(text, lineno=obj.lineno, parent=obj, parser=loader.docstring_parser,
                                                 parser_options=loader.docstring_options)
            if obj.docstring is not None:
                parts = CODE.split(obj.docstring.value)
                parts[::2] = [ROLE.sub(lambda match, obj=obj: linked(obj, match), part) for part in parts[::2]]
                obj.docstring.value = "".join(parts)
            pending.extend(member for member in obj.members.values() if not member.is_alias)
