"""``lit-embed plugins``: the installed plugins and the names each adds; exit 2 where one fails to load."""

from __future__ import annotations

import os

from lit_embed.commands.helptext import summary
from lit_embed.commands.parsing import ArgumentParser
from lit_embed.plugins import COMMANDS, KIND, SWITCH, enabled, installed, list_plugins, provided, unloaded


def main(argv: list[str]) -> int:
    """The installed plugins and the names each adds."""
    groups = ", ".join(repr(group) for group in KIND)
    ArgumentParser(prog="lit-embed plugins", allow_abbrev=False, description=(
        f"The installed plugins (entry points of the groups {groups}) and the names each adds.")).parse_args(argv)
    points = installed()
    if not points:
        print(f"no plugins installed (no distribution but lit-embed declares an entry point of {groups})")
        return 0
    if not enabled():
        print(f"plugins are off ({SWITCH}={os.environ[SWITCH]}): {len(points)} installed, none loaded")
        for point in points:
            print(f"  {unloaded(point)}")
        return 0
    for plugin in list_plugins():
        print(f"{plugin}: {summary(plugin.value)}" if plugin.group == COMMANDS else plugin)
        for heading, names in provided(plugin).items():
            print(f"  {heading}: {', '.join(names)}")
    return 0
