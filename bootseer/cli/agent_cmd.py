"""``bootseer agent``: run the node agent in the foreground (systemd or a DaemonSet keeps it
running); see :mod:`bootseer.agents.agent`."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from bootseer.cli import AppContext, pass_app


@click.command()
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Unix socket to listen on (default: config agent.socket).")
@pass_app
def agent(app: AppContext, socket_path: Path | None) -> None:
    """Run the node agent: it owns this node's caches and serves `bootseer warm`."""
    from bootseer.agents.agent import run

    root = logging.getLogger()
    root.setLevel(min(root.level, logging.INFO))  # a daemon says when it starts and stops
    run(app.loaded.config, socket_path)
