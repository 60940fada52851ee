"""``lit-embed plugins``: the installed plugins and the names each adds; exit 2 where one fails to load."""

from __future__ import annotations

import os

from lit_embed.commands.parsing import ArgumentParser
from lit_embed.plugins import GROUP, SWITCH, enabled, installed, list_plugins, provided, unloaded


def main(argv: list[str]) -> int:
    ArgumentParser(prog="lit-embed plugins", allow_abbrev=False, description=(
        f"The installed plugins (entry points of the group {GROUP!r}) and the names each adds.")).parse_args(argv)
    points = installed()
    if not points:
        print(f"no plugins installed (no distribution declares a {GROUP!r} entry point)")
        return 0
    if not enabled():
        print(f"plugins are off ({SWITCH}={os.environ[SWITCH]}): {len(points)} installed, none loaded")
        for point in points:
            print(f"  {unloaded(point)}")
        return 0
    for plugin in list_plugins():
        print(plugin)
        for heading, names in provided(plugin).items():
            print(f"  {heading}: {', '.join(names)}")
    return 0
