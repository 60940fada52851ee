"""The strategy's own source, as one module an exported folder carries (``modeling_lit_embed.py``).

An export must load where lit-embed is not installed, so it carries the code that defines its strategy:
the strategy's module (lit-embed's, or a plugin's) and the lit-embed modules it imports (transitively, a name
imported through a package taken from the module that defines it), concatenated in dependency order,
with their ``lit_embed`` imports taken out (the names live in the one module). What an export never runs
(the hub, downloading a matrix, writing files: :mod:`lit_embed.storage.files`, :mod:`lit_embed.storage.cache`) is not carried: its
names become functions saying lit-embed is needed. After the code comes :data:`DECLARED`: the classes the export's
``config.json`` may name, the only ones its loader builds.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Iterable
from pathlib import Path

import lit_embed

#: Modules an export carries where the strategy needs them: the strategies and what they import. Nothing that
#: writes files: loading an export runs its code.
CARRIED = ("lit_embed.errors",)
#: The name of the generated module's set of the classes its config may name.
DECLARED = "DECLARED_CLASSES"
CARRIED_PACKAGE = "lit_embed.embeddings."
NEEDS_LIT_EMBED = "raise ImportError('this needs lit-embed installed: pip install lit-embed')"


def module_source(strategy_class: type, tail: str, declared: Iterable[str] = ()) -> str:
    """One module: the modules that define ``strategy_class`` (dependencies first), then ``tail``, then
    :data:`DECLARED`: the class paths ``declared`` (those the strategy's config names)."""
    order = _dependency_order(strategy_class.__module__)
    defined: dict[str, str] = {}
    parts = ["from __future__ import annotations", ""]
    for name in order:
        source, names = _carried_source(name, set(order))
        for defined_name in names:
            if defined_name in defined:
                raise RuntimeError(f"{name} and {defined[defined_name]} both define {defined_name}: the export would mix them")
            defined[defined_name] = name
        parts += [f"# ---- {name} (lit-embed {lit_embed.__version__}) ----", source, ""]
    parts += ["# ---- the transformers model ----", _without_future(tail), "",
              f"{DECLARED} = frozenset({sorted(declared)!r})  # what config.json may name: this export's strategy", ""]
    return "\n".join(parts)


def _is_carried(module: str) -> bool:
    return module in CARRIED or module.startswith(CARRIED_PACKAGE) and module != "lit_embed.embeddings.pretrained"


def _tree(module: str) -> tuple[str, ast.Module]:
    source = Path(inspect.getfile(importlib.import_module(module))).read_text()
    return source, ast.parse(source)


def _defining(module: str, name: str) -> str:
    """The carried module that defines what ``from module import name`` gives (a package re-exports its modules'
    names: ``from lit_embed.embeddings import EmbeddingStrategy`` is ``lit_embed.embeddings.base``'s), else ``module``."""
    if _is_carried(module):
        return module
    defined_in = getattr(getattr(importlib.import_module(module), name, None), "__module__", None)
    return defined_in if isinstance(defined_in, str) and _is_carried(defined_in) else module


def _dependency_order(root: str) -> list[str]:
    """``root`` and the carried modules it imports at module level, each after what it imports."""
    order: list[str] = []

    def visit(module: str) -> None:
        if module in order:
            return
        for node in _tree(module)[1].body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "lit_embed":
                for found in {_defining(node.module, alias.name) for alias in node.names}:
                    if _is_carried(found):
                        visit(found)
        order.append(module)

    visit(root)
    return order


def _carried_source(module: str, carried: set[str]) -> tuple[str, list[str]]:
    """``module``'s source without its lit_embed imports, and the names it defines at top level.

    A top-level import from a module not carried defines its names as functions that say lit-embed is
    needed; an import inside a function becomes that raise (the branch needs lit-embed).
    """
    source, tree = _tree(module)
    lines = source.splitlines()
    replaced: dict[int, tuple[int, list[str]]] = {}  # first line -> (last line, new lines)
    for node in ast.walk(tree):
        lit = isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "lit_embed"
        future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
        modules = isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "lit_embed" for alias in node.names)
        if not (lit or future or modules):
            continue
        indent = " " * node.col_offset
        if future:
            new: list[str] = []
        elif modules:  # ``import lit_embed.x as y``: a module's namespace is not carried, its names need lit-embed
            others = [alias for alias in node.names if alias.name.split(".")[0] != "lit_embed"]
            kept = [indent + ast.unparse(ast.Import(names=others))] if others else []
            new = kept + ([f"def {alias.asname or alias.name.split('.')[0]}(*args, **kwargs):  # import {alias.name}\n"
                           f"    {NEEDS_LIT_EMBED}" for alias in node.names if alias not in others]
                          if node in tree.body else [indent + NEEDS_LIT_EMBED])
        elif node in tree.body:  # a carried name lives in the one module (under its own name); the rest need lit-embed
            new = [f"{alias.asname} = {alias.name}" if alias.asname and alias.asname != alias.name else ""
                   if _defining(node.module, alias.name) in carried else
                   f"def {alias.asname or alias.name}(*args, **kwargs):  # from {node.module}\n    {NEEDS_LIT_EMBED}"
                   for alias in node.names]
            new = [line for line in new if line]
        else:
            new = [indent + NEEDS_LIT_EMBED]
        replaced[node.lineno] = (node.end_lineno, new)
    out, number = [], 1
    while number <= len(lines):
        if number in replaced:
            last, new = replaced[number]
            out += new
            number = last + 1
        else:
            out.append(lines[number - 1])
            number += 1
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name) and t.id not in ("__all__", "log", "logger")]
    return "\n".join(out), names


def _without_future(source: str) -> str:
    return "\n".join(line for line in source.splitlines() if line.strip() != "from __future__ import annotations")
