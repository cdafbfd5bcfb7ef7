"""The ``bootseer`` command.

Subcommands live one module per capability (``config``, ``store``, ...). A user error
(``BootseerError``, or an ``OSError`` such as a missing file) prints one ``error:`` line
and exits 1; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import importlib
import logging
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import click

from bootseer import __version__
from bootseer.config import LoadedConfig, load_config
from bootseer.errors import BootseerError
from bootseer.progress import console
from bootseer.store import BlobStore, Store, open_configured_store


@dataclass
class AppContext:
    """What every subcommand gets: the effective config and, on demand, the store."""

    loaded: LoadedConfig

    @cached_property
    def store(self) -> Store:
        return open_configured_store(self.loaded.config)

    @cached_property
    def blobs(self) -> BlobStore:
        return BlobStore(self.store)


pass_app = click.make_pass_decorator(AppContext)
_debug = False


#: Each subcommand's module, imported when that command runs (or ``--help`` lists them): a
#: start that only restores an environment (``env run``) does not import the image, FUSE
#: and checkpoint machinery of the others (70 ms of a 170 ms CLI import).
COMMANDS = {
    "agent": "bootseer.cli.agent_cmd:agent",
    "ckpt": "bootseer.cli.ckpt_cmd:ckpt",
    "config": "bootseer.cli.config_cmd:config",
    "env": "bootseer.cli.env_cmd:env",
    "image": "bootseer.cli.image_cmd:image",
    "job": "bootseer.cli.job_cmd:job",
    "ready": "bootseer.cli.warm_cmd:ready",
    "report": "bootseer.cli.report_cmd:report",
    "store": "bootseer.cli.store_cmd:store",
    "warm": "bootseer.cli.warm_cmd:warm",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on use (click's documented pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, attribute = target.partition(":")
        return getattr(importlib.import_module(module), attribute)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bootseer")
@click.option("--store", "store_url", metavar="URL",
              help="Store URL (file:///path, hdfs://nn:port/path, webhdfs://nn:port/path).")
@click.option("--config", "config_file", type=click.Path(path_type=Path), metavar="FILE",
              help="Extra config file read after /etc/bootseer and the user's config.")
@click.option("--debug", is_flag=True, help="Log verbosely and show tracebacks on errors.")
@click.pass_context
def cli(ctx: click.Context, store_url: str | None, config_file: Path | None, debug: bool) -> None:
    """Bootseer cuts the startup time of large training jobs."""
    global _debug
    _debug = debug
    loaded = load_config(explicit_file=config_file, flags={"store": store_url})
    level = "DEBUG" if debug else loaded.config.log_level.upper()
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    ctx.obj = AppContext(loaded)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the CLI and turn expected errors into one clean line."""
    try:
        cli.main(args=argv, prog_name="bootseer", standalone_mode=False)
    except click.exceptions.Abort:
        console.print("aborted")
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except (BootseerError, OSError) as exc:
        if _debug:
            raise
        console.print(f"[red]error:[/red] {_describe(exc)}")
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)
