"""The node agent: one long-lived process per node that owns the local caches.

It serves a small HTTP API on a Unix socket (aiohttp on uvloop). Being long-lived is the
point: the store client (for ``hdfs://``, a JVM) is opened once, the block cache and the
in-flight table of each image are shared by every request, so two ``warm`` calls for the
same image never fetch a block twice.

API (JSON; long operations stream NDJSON events, one per line):

* ``GET /v1/health`` -> ``{"version", "pid", "store", "cache_dir"}``
* ``POST /v1/starts`` a start record (:class:`agents.timeline.StartRecord` JSON: ``id`` and
  any of ``job``, ``image``, ``workload``, ``runtime``, ``phases``, ``detail``) -> the
  record as now known (merged: first values win); ``GET /v1/starts?since=UNIX`` -> the
  records of starts since then, oldest first (``bootseer report``).
* ``POST /v1/mounts`` a :class:`agents.mountapi.MountRequest` -> the container's lazy
  root (:class:`agents.mountapi.ContainerMount`); ``DELETE /v1/mounts/{id}?exit_code=N``
  -> the completed start record; ``GET /v1/mounts`` -> the mounts served
  (:mod:`agents.mounts`). Used by the runtime shim and the OCI hook.
* ``GET /metrics``: Prometheus text format (:mod:`agents.metrics`); also on TCP at
  ``agent.metrics_listen`` (``host:port``) when set, for Prometheus to scrape.
* ``POST /v1/warm`` ``{"image", "workload", "all", "envs", "checkpoints"}`` -> events ``{"event":
  "plan", "bytes"}``, ``{"event": "progress", "bytes"}``..., then ``{"event": "result",
  ...}`` (:meth:`agents.warm.WarmSummary.to_json`) or ``{"event": "error", "message"}``.

SIGTERM and SIGINT stop it gracefully: requests in progress finish their current step,
the socket is removed; containers' mounts keep serving and the next agent adopts them.
"""

from __future__ import annotations

import asyncio
import grp
import json
import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import uvloop
from aiohttp import web

from agents.metrics import AgentMetrics
from agents.mountapi import MountRequest
from agents.mounts import MountManager, UnknownMount
from agents.priority import Priority, PriorityGate
from agents.timeline import StartRecord, Timeline, timeline_path
from agents.warm import WarmRequest, warm
from bootseer import __version__
from bootseer.config import Config
from bootseer.errors import BootseerError
from bootseer.store import BlobStore, open_configured_store
from prefetch.blockcache import BlockCache
from prefetch.lazyimage import LazyImage, resolve_image

log = logging.getLogger(__name__)

T = TypeVar("T")


class Agent:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.blobs = BlobStore(open_configured_store(config))
        self.cache = BlockCache(config.cache_dir / "blocks", config.image.cache_size)
        self._images: dict[str, LazyImage] = {}  # by image id: one in-flight table each
        self._lock = threading.Lock()
        self.timeline = Timeline(timeline_path(config))
        self._merging = threading.Lock()  # start records are merged one at a time
        self.metrics = AgentMetrics()
        self.gate = PriorityGate()  # demand reads > containers starting > warm requests
        self.mounts = MountManager(config, self.record, self.gate)

    def image(self, name: str) -> LazyImage:
        image_id = resolve_image(self.blobs, name)
        with self._lock:
            if image_id not in self._images:
                self._images[image_id] = LazyImage(self.blobs, image_id, self.cache)
            return self._images[image_id]

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([web.get("/v1/health", self.health), web.post("/v1/warm", self.warm),
                        web.post("/v1/starts", self.record_start),
                        web.get("/v1/starts", self.list_starts),
                        web.get("/metrics", self.serve_metrics),
                        web.post("/v1/mounts", self.mount),
                        web.get("/v1/mounts", self.list_mounts),
                        web.delete("/v1/mounts/{id}", self.release)])
        return app

    async def mount(self, request: web.Request) -> web.Response:
        mount_request = await _parse(request, MountRequest.from_json, "mount request")
        try:
            mount = await asyncio.get_running_loop().run_in_executor(
                None, self.mounts.mount, mount_request)
        except (BootseerError, OSError) as exc:
            raise web.HTTPInternalServerError(
                text=f"mounting image {mount_request.image} for {mount_request.id}: "
                     f"{exc}") from exc
        return web.json_response(mount.to_json())

    async def release(self, request: web.Request) -> web.Response:
        exit_code = request.query.get("exit_code")
        try:
            code = None if exit_code is None else int(exit_code)
        except ValueError as exc:
            raise web.HTTPBadRequest(text="exit_code: an integer") from exc
        try:
            record = await asyncio.get_running_loop().run_in_executor(
                None, self.mounts.release, request.match_info["id"], code)
        except ValueError as exc:
            raise web.HTTPBadRequest(text=str(exc)) from exc
        except UnknownMount as exc:
            raise web.HTTPNotFound(text=str(exc)) from exc
        return web.json_response(record.to_json())

    async def list_mounts(self, request: web.Request) -> web.Response:
        mounts = await asyncio.get_running_loop().run_in_executor(None, self.mounts.list)
        return web.json_response(mounts)

    def record(self, start: StartRecord) -> StartRecord:
        """Merge ``start`` into the timeline and count what it added in the metrics."""
        before, after = self._record(start)
        self.metrics.observe(before, after)
        return after

    async def record_start(self, request: web.Request) -> web.Response:
        start = await _parse(request, StartRecord.from_json, "start record")
        after = await asyncio.get_running_loop().run_in_executor(None, self.record, start)
        return web.json_response(after.to_json())

    def _record(self, start: StartRecord) -> tuple[StartRecord | None, StartRecord]:
        with self._merging:  # "before" is what this merge started from
            before = self.timeline.get(start.id)
            self.timeline.record(start)
            after = self.timeline.get(start.id)
        assert after is not None
        return before, after

    async def list_starts(self, request: web.Request) -> web.Response:
        try:
            since = float(request.query.get("since", "0"))
        except ValueError as exc:
            raise web.HTTPBadRequest(text="since: Unix seconds") from exc
        starts = await asyncio.get_running_loop().run_in_executor(
            None, self.timeline.starts, since)
        return web.json_response([s.to_json() for s in starts])

    async def serve_metrics(self, request: web.Request) -> web.Response:
        body, content_type = self.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"version": __version__, "pid": os.getpid(),
                                  "store": self.config.store,
                                  "cache_dir": str(self.config.cache_dir),
                                  "busy": {p.name.lower(): n
                                           for p, n in self.gate.busy().items()}})

    async def warm(self, request: web.Request) -> web.StreamResponse:
        warm_request = await _parse(request, WarmRequest.from_json, "warm request")
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

        def emit(event: dict[str, Any] | None) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        def work() -> None:
            try:
                lazy = self.image(warm_request.image) if warm_request.image else None
                summary = warm(self.blobs, self.config, warm_request, image_cache=self.cache,
                               lazy=lazy,
                               before_fetch=lambda: self.gate.wait_turn(Priority.WARM),
                               on_plan=lambda n: emit({"event": "plan", "bytes": n}),
                               on_progress=lambda n: emit({"event": "progress", "bytes": n}))
                if summary.image is not None:
                    summary.image.image = warm_request.image or summary.image.image
                summary.via = "agent"
                self.metrics.warmed(summary)
                emit({"event": "result", **summary.to_json()})
            except (BootseerError, OSError) as exc:
                emit({"event": "error", "message": str(exc)})
            except Exception as exc:
                log.exception("warm %s failed", warm_request)
                emit({"event": "error", "message": f"internal error: {exc}"})
            finally:
                emit(None)

        task = loop.run_in_executor(None, work)
        while (event := await events.get()) is not None:
            await response.write(json.dumps(event).encode() + b"\n")
        await task
        await response.write_eof()
        return response


async def _parse(request: web.Request, from_json: Callable[[dict[str, Any]], T],
                 what: str) -> T:
    """The request's JSON body as ``from_json`` reads it; a 400 naming ``what`` if not."""
    try:
        body = await request.json()
        return from_json(body if isinstance(body, dict) else {})
    except (ValueError, TypeError) as exc:
        raise web.HTTPBadRequest(text=f"bad {what}: {exc}") from exc


def _restrict(socket_path: Path, group: str) -> None:
    """Owner and group may connect (mode 0660): root, and members of ``group`` if it exists
    (as the Docker socket does with group ``docker``)."""
    os.chmod(socket_path, 0o660)
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        log.info("group %r does not exist: only %s may use %s", group,
                 "root" if os.geteuid() == 0 else "this user", socket_path)
        return
    os.chown(socket_path, -1, gid)


async def _serve(agent: Agent, socket_path: Path) -> None:
    runner = web.AppRunner(agent.app(), handle_signals=False)
    await runner.setup()
    socket_path.parent.mkdir(parents=True, exist_ok=True)
    socket_path.unlink(missing_ok=True)  # a previous agent's, or we could not bind
    site = web.UnixSite(runner, str(socket_path))
    await site.start()
    _restrict(socket_path, agent.config.agent.group)
    metrics_runner = await _serve_metrics(agent)
    log.info("bootseer agent %s listening on %s (pid %d)", __version__, socket_path,
                os.getpid())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(agent.mounts.watch(stop))
    try:
        await stop.wait()
        await watcher
    finally:
        await runner.cleanup()
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        socket_path.unlink(missing_ok=True)
        agent.timeline.close()
        log.info("bootseer agent stopped")


async def _serve_metrics(agent: Agent) -> web.AppRunner | None:
    """``/metrics`` alone on TCP (``agent.metrics_listen``): Prometheus scrapes over TCP,
    and the Unix socket's API stays reachable only to root and the group."""
    listen = agent.config.agent.metrics_listen
    if not listen:
        return None
    host, _, port = listen.rpartition(":")
    app = web.Application()
    app.add_routes([web.get("/metrics", agent.serve_metrics)])
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host or "0.0.0.0", int(port)).start()
    log.info("metrics on http://%s/metrics", listen)
    return runner


def run(config: Config, socket_path: Path | None = None) -> None:
    """Run the agent in the foreground until SIGTERM/SIGINT.

    Containers' mounts outlive the agent (their servers are processes of their own): a
    stopping agent leaves them serving, and the next one adopts them.
    """
    agent = Agent(config)
    agent.mounts.adopt()
    uvloop.run(_serve(agent, socket_path or config.agent.socket))
