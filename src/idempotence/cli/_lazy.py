"""Commands loaded when they run: ``idempotence demo`` is Rocket Rides, a package of
its own (``rocket_rides``) that the library never imports; the CLI looks it up by name
only when the command is asked for (or listed in ``--help``)."""

from __future__ import annotations

import importlib
from typing import Any

import click

LAZY = {"demo": "rocket_rides.cli:demo"}
"""Command name -> "module:attribute" of its click command."""

ANYWHERE = {"--log-json": False, "--log-level": True}
"""The group's own options that may also come after the subcommand
(``idempotence worker --log-json``), and whether each takes a value."""


def hoist(args: list[str]) -> list[str]:
    """``args`` with `ANYWHERE`'s options moved in front of the subcommand
    (click reads a group's options only there); ``--`` ends the search."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        name = arg.split("=", 1)[0]
        if arg == "--":
            rest.extend(args[i:])
            break
        if name in ANYWHERE:
            takes = ANYWHERE[name] and "=" not in arg
            front.extend(args[i : i + 1 + takes])
            i += 1 + takes
            continue
        rest.append(arg)
        i += 1
    return front + rest


class LazyGroup(click.Group):
    """A group whose commands in `LAZY` are imported on first use, and whose
    logging options are accepted after the subcommand too."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, hoist(args))

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in LAZY:
            return super().get_command(ctx, cmd_name)
        module, _, attribute = LAZY[cmd_name].partition(":")
        command: Any = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        return command
