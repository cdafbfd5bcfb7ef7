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


@click.command(hidden=True)
@click.option("--control-fd", type=int, required=True)
@pass_app
def spare(app: AppContext, control_fd: int) -> None:
    """A spare mount server, started by the node agent (see bootseer.agents.spare)."""
    from bootseer.agents.spare import serve_spare
    from bootseer.cli import main

    def warm_up() -> None:
        import bootseer.prefetch.session  # noqa: F401  (the servers' code)
        import bootseer.stripedfs.server  # noqa: F401

        app.store.exists("refs")  # connected: for hdfs://, the JVM is up

    argv = serve_spare(control_fd, warm_up)
    if argv is not None:
        main(argv)
