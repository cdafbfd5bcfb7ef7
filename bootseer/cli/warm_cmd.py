"""``bootseer warm``: stage what an upcoming job needs on this node; ``bootseer ready``.

``warm`` is meant to be run by a scheduler on every node of a job before (re)starting it.
When the node agent runs (its socket is there), the agent does the work, in its cache,
sharing in-flight fetches with everything else it serves; otherwise (or with
``--no-agent``) this process does the same work itself.

Exit status: 0 when everything needed is local, 3 when some of it could not be staged (the
summary says how much and why), 1 on errors.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import click

from bootseer.cli import AppContext, pass_app
from bootseer.errors import BootseerError
from bootseer.progress import Advance, byte_progress, console
from bootseer.ready import READY_FILE_ENV, mark_ready
from bootseer.units import format_size
from prefetch.hotlist import DEFAULT_WORKLOAD
from prefetch.warm import WarmResult

#: Exit status of ``warm`` when it ran but not everything needed is local.
INCOMPLETE = 3


@click.command()
@click.option("--image", "image", required=True,
              help="Image name (as converted with --name) or image id.")
@click.option("--workload", default=DEFAULT_WORKLOAD, show_default=True,
              help="Whose hot list to stage (the key the starts were recorded under).")
@click.option("--all", "all_blocks", is_flag=True,
              help="Stage every block of the image, not only the hot ones.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--agent/--no-agent", "use_agent", default=None,
              help="Warm through the node agent (default: if one is running) or in this "
                   "process.")
@pass_app
def warm(app: AppContext, image: str, workload: str, all_blocks: bool, as_json: bool,
         use_agent: bool | None) -> None:
    """Prefetch an image's hot blocks into this node's cache before a job starts here."""
    cfg = app.loaded.config
    result = None
    with byte_progress(f"warming {image}", None) as advance:
        if use_agent is not False and (use_agent or cfg.agent.socket.exists()):
            result = _warm_via_agent(app, image, workload, all_blocks, advance,
                                     required=bool(use_agent))
        if result is None:
            from prefetch.blockcache import BlockCache
            from prefetch.warm import warm_image

            cache = BlockCache(cfg.cache_dir / "blocks", cfg.image.cache_size)
            result = warm_image(app.blobs, cache, image, workload, all_blocks=all_blocks,
                                concurrency=cfg.image.prefetch_concurrency,
                                request_size=cfg.image.prefetch_request_size,
                                on_plan=advance.set_total, on_progress=advance)
            result.via = "standalone"
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(result) | {"complete": result.complete},
                              indent=2))
    elif not result.hot_list and not all_blocks:
        console.print(f"image {image} has no hot list for workload {workload!r} yet: staged "
                      f"its manifest only (a start run with `bootseer image run --record` "
                      f"records one; --all stages the whole image)")
    else:
        console.print(f"{result.blocks} blocks ({format_size(result.bytes)}) of {image}: "
                      f"{result.already_local} already local, {result.fetched_blocks} "
                      f"fetched ({format_size(result.fetched_bytes)} in "
                      f"{result.fetch_requests} reads) in {result.seconds:.2f} s")
    if not result.complete:
        console.print(f"[yellow]warning:[/yellow] {result.missing} of {result.blocks} blocks "
                      f"are not local: the store failed them, or the cache "
                      f"({format_size(cfg.image.cache_size)}, image.cache_size) is too small")
        sys.exit(INCOMPLETE)


def _warm_via_agent(app: AppContext, image: str, workload: str, all_blocks: bool,
                    advance: Advance, required: bool) -> WarmResult | None:
    """The agent's summary, or None when no agent answers and it was not required."""
    from agents.client import AgentClient, AgentUnavailable

    socket = app.loaded.config.agent.socket
    try:
        with AgentClient(socket) as client:
            summary = client.warm(image, workload, all_blocks=all_blocks,
                                  on_plan=advance.set_total, on_progress=advance)
    except AgentUnavailable as exc:
        if required:
            raise BootseerError(f"{exc} (start one with `bootseer agent`, or drop --agent)")\
                from exc
        console.print(f"no agent answers on {socket}; warming in this process")
        return None
    summary.pop("complete", None)
    return WarmResult(**summary)


@click.command()
def ready() -> None:
    """Tell Bootseer this container's start is over (ends the recording of its hot list).

    Same as `bootseer.mark_ready()` in Python or `touch "$BOOTSEER_READY_FILE"`.
    """
    if not mark_ready():
        console.print(f"nothing to do: {READY_FILE_ENV} is not set (this start is not being "
                      f"recorded)")
