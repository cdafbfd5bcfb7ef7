"""``bootseer config``: show the effective configuration and where each value came from."""

from __future__ import annotations

import dataclasses
import json

import click
from rich.console import Console
from rich.table import Table

from bootseer.cli import AppContext, pass_app
from bootseer.config import Config, FileMode
from bootseer.prefetch.config import PrefetchConfig
from bootseer.stripedfs.config import StripeConfig


@click.group()
def config() -> None:
    """Inspect the configuration."""


@config.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@pass_app
def show(app: AppContext, as_json: bool) -> None:
    """Print every setting, its effective value and its source."""
    owned = _technique_defaults(app.loaded.config)
    settings = [s if s.value is not None or s.key not in owned else
                dataclasses.replace(s, value=owned[s.key][0],
                                    source=f"{s.source} ({owned[s.key][1]})")
                for s in app.loaded.settings()]
    if as_json:
        rows = {s.key: {"value": _jsonable(s.value), "source": s.source} for s in settings}
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(box=None, pad_edge=False)
    table.add_column("setting")
    table.add_column("value")
    table.add_column("source", style="dim")
    for s in settings:
        value = _jsonable(s.value)
        table.add_row(s.key, ", ".join(value) if isinstance(value, list)
                      else "" if value is None else str(value), s.source)
    Console(highlight=False).print(table)


def _technique_defaults(config: Config) -> dict[str, tuple[object, str]]:
    """The value a technique uses for each key the configuration leaves unset, and where
    that default is declared: the technique owns it (one place), the table shows it."""
    prefetch = PrefetchConfig.from_config(config)
    stripes = StripeConfig.from_config(config)
    owned: dict[str, tuple[object, str]] = {
        "image.prefetch_concurrency": (prefetch.concurrency, "prefetch"),
        "image.prefetch_request_size": (prefetch.request_size, "prefetch")}
    owned.update({f"checkpoint.{f.name}": (getattr(stripes, f.name), "stripedfs")
                  for f in dataclasses.fields(stripes)})
    return owned


def _jsonable(value: object) -> object:
    if isinstance(value, FileMode):
        return f"{value:04o}"
    if isinstance(value, tuple):
        return list(value)
    return value if value is None or isinstance(value, (bool, int, str)) else str(value)
