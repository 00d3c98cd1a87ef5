"""Commands loaded when they run: ``idempotence demo`` is Rocket Rides, a package of
its own (``rocket_rides``) that the library never imports; the CLI looks it up by name
only when the command is asked for (or listed in ``--help``)."""

from __future__ import annotations

import importlib
from typing import Any

import click

#: Command name -> "module:attribute" of its click command.
LAZY = {"demo": "rocket_rides.cli:demo"}


class LazyGroup(click.Group):
    """A group whose commands in :data:`LAZY` are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in LAZY:
            return super().get_command(ctx, cmd_name)
        module, _, attribute = LAZY[cmd_name].partition(":")
        command: Any = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        return command
