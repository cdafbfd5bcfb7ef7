"""``bootseer warm``: stage what an upcoming job needs on this node; ``bootseer ready``.

``warm`` (an image's hot blocks, environment snapshots, checkpoints) is meant to be run by
a scheduler on every node of a job before (re)starting it. When the node agent runs (its
socket is there), the agent does the work, in its cache, sharing in-flight fetches with
everything else it serves and yielding to them; otherwise (or with ``--no-agent``) this
process does the same work itself.

With ``--job`` (and ``--nodes``, or ``--peers``) and ``p2p.enabled`` on the agent, the
job's nodes fetch the hot pack and the snapshots' shards from each other, each byte
leaving the store about once (``bootseer.p2p``); without an agent, or with peer-to-peer
off, they change nothing.

Exit status: 0 when everything needed is local, 3 when some of it could not be staged (the
summary says how much and why), 1 on errors.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from bootseer.cli import AppContext, pass_app
from bootseer.errors import BootseerError
from bootseer.p2p import PeerAddressError, parse_peers
from bootseer.p2p.rendezvous import MAX_MEMBERS
from bootseer.prefetch.hotlist import DEFAULT_WORKLOAD
from bootseer.progress import Advance, byte_progress, console
from bootseer.ready import READY_FILE_ENV, mark_ready
from bootseer.units import format_size

if TYPE_CHECKING:
    from bootseer.agents.warm import WarmRequest, WarmSummary
    from bootseer.config import Config
    from bootseer.warming import PartResult

#: Exit status of ``warm`` when it ran but not everything needed is local.
INCOMPLETE = 3


@click.command()
@click.option("--image", "image", help="Image name (as converted with --name) or image id.")
@click.option("--workload", default=DEFAULT_WORKLOAD, show_default=True,
              help="Whose hot list to stage (the key the starts were recorded under).")
@click.option("--all", "all_blocks", is_flag=True,
              help="Stage every block of the image, not only the hot ones.")
@click.option("--env", "envs", multiple=True, metavar="KEY",
              help="Also stage this environment snapshot (`bootseer env ls`); repeatable.")
@click.option("--checkpoint", "checkpoints", multiple=True, metavar="URL",
              help="Also stage this checkpoint, a file or a directory (all files under it; "
                   "a DCP checkpoint), e.g. hdfs://nn:8020/ckpt/step100; repeatable. The "
                   "checkpoint API reads the local copy while the store's file is unchanged.")
@click.option("--job", help="The job this warm is for: with p2p.enabled, its nodes share what "
                           "they fetch (each announces itself in the job's records).")
@click.option("--nodes", type=click.IntRange(1, MAX_MEMBERS), metavar="N",
              help="How many nodes of --job warm now: each waits (briefly) until all N "
                   "have announced, so that all split the store reads alike.")
@click.option("--peers", metavar="LIST",
              help="The job's nodes' peer addresses, \"IP:PORT,...\" (as the scheduler "
                   "knows them; instead of the job's records).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--agent/--no-agent", "use_agent", default=None,
              help="Warm through the node agent (default: if one is running) or in this "
                   "process.")
@pass_app
def warm(app: AppContext, image: str | None, workload: str, all_blocks: bool,
         envs: tuple[str, ...], checkpoints: tuple[str, ...], job: str | None,
         nodes: int | None, peers: str | None, as_json: bool,
         use_agent: bool | None) -> None:
    """Stage an image's hot blocks, environment snapshots and checkpoints on this node
    before a job starts here."""
    from bootseer.agents.warm import WarmRequest

    if image is None and not envs and not checkpoints:
        raise click.UsageError("nothing to warm: give --image and/or --env and/or --checkpoint")
    cfg = app.loaded.config
    try:
        peer_list = tuple(parse_peers(peers or ""))
    except PeerAddressError as exc:
        raise click.BadParameter(str(exc), param_hint="--peers") from exc
    request = WarmRequest(image, workload, all_blocks, envs, checkpoints, job, nodes,
                          peer_list)
    summary = None
    with byte_progress("warming", None) as advance:
        if use_agent is not False and (use_agent or cfg.agent.socket.exists()):
            summary = _warm_via_agent(app, request, advance, required=bool(use_agent))
        if summary is None:
            from bootseer.agents.warm import warm as warm_here

            summary = warm_here(app.blobs, cfg, request, on_plan=advance.add_total,
                                on_progress=advance)
    if as_json:
        click.echo(json.dumps(summary.to_json(), indent=2))
    _print(summary, cfg, all_blocks, warnings_only=as_json)
    if not summary.complete:
        sys.exit(INCOMPLETE)


def _print(summary: WarmSummary, cfg: Config, all_blocks: bool, warnings_only: bool) -> None:
    """The summary for people (stderr), one line per part, each part the same way; with
    ``warnings_only``, just what is missing."""
    for part in summary.parts:
        if not warnings_only:
            console.print(_line(part, all_blocks))
        if not part.complete:
            kind = part.kind
            console.print(f"[yellow]warning:[/yellow] {kind.label} {part.name}: "
                          f"{part.missing} of {part.items} {kind.unit} are not local: "
                          f"{kind.failure}, or the cache "
                          f"({format_size(cfg.get(kind.cache_setting))}, "
                          f"{kind.cache_setting}) is too small")
    if summary.members and not warnings_only:
        parts = summary.parts
        console.print(f"shared with the job's {summary.members} nodes: "
                      f"{format_size(sum(p.peer_bytes for p in parts))} from peers, "
                      f"{format_size(sum(p.store_bytes for p in parts))} from the store")


def _line(part: PartResult, all_blocks: bool) -> str:
    """What warming ``part`` found and did, in one line."""
    kind = part.kind
    if part.detail.get("hot_list") is False and not all_blocks:  # an image without one
        return (f"image {part.name} has no hot list for workload "
                f"{part.detail.get('workload')!r} yet: staged its manifest only (a start run "
                f"with `bootseer image run --record` records one; --all stages the whole "
                f"image)")
    reads = part.detail.get("fetch_requests")
    fetched = format_size(part.store_bytes) + \
        (f" in {reads} reads" if reads is not None else "") + \
        (f", {format_size(part.peer_bytes)} from peers" if part.peer_bytes else "")
    return (f"{kind.label} {part.name}: {part.items} {kind.unit} "
            f"({format_size(part.bytes)}), {part.already_local} already local, "
            f"{part.fetched} fetched ({fetched}) in {part.seconds:.2f} s")


def _warm_via_agent(app: AppContext, request: WarmRequest, advance: Advance,
                    required: bool) -> WarmSummary | None:
    """The agent's summary, or None when no agent answers and it was not required."""
    from bootseer.agents.client import answering_agent

    socket = app.loaded.config.agent.socket
    with answering_agent(socket) as agent:
        if agent is not None:
            return agent.warm(request, on_plan=advance.add_total, on_progress=advance)
    if required:
        raise BootseerError(f"no agent answers on {socket} (start one with `bootseer agent`, "
                            f"or drop --agent)")
    console.print(f"no agent answers on {socket}; warming in this process")
    return None


@click.command()
def ready() -> None:
    """Tell Bootseer this container's start is over (ends the recording of its hot list).

    Same as `bootseer.mark_ready()` in Python or `touch "$BOOTSEER_READY_FILE"`.
    """
    if not mark_ready():
        console.print(f"nothing to do: {READY_FILE_ENV} is not set (this start is not being "
                      f"recorded)")
