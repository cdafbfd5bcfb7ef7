"""The node agent: one long-lived process per node that owns the local caches.

It serves a small HTTP API on a Unix socket (aiohttp on uvloop). Being long-lived is the
point: the store client (for ``hdfs://``, its NameNode connection) is opened once, the
block cache and the in-flight table of each image are shared by every request, so two
``warm`` calls for the same image never fetch a block twice.

API (JSON; long operations stream NDJSON events, one per line). Every body is checked
field by field (:mod:`bootseer.agents.fields`): a malformed one gets a 400, a request the operator's
policy does not allow a 403 naming the setting (:mod:`bootseer.agents.policy`), and neither leaves
anything behind. Requests marked *root* are refused (403) to any other peer
(``SO_PEERCRED``): the socket's group may warm and read, not mount or record.

* ``GET /v1/health`` -> ``{"version", "pid", "store", "cache_dir", "busy",
  "spares": {"ready", "size"}, "store_connected"}`` (spare servers warm, and wanted; the
  agent's own store connection made, which it starts at once)
* ``POST /v1/starts`` (root) a start record (:class:`bootseer.agents.timeline.StartRecord` JSON:
  ``id`` and any of ``job``, ``image``, ``workload``, ``runtime``, ``phases``,
  ``detail``) -> the record as now known (merged: first values win);
  ``GET /v1/starts?since=UNIX`` -> the records of starts since then, oldest first
  (``bootseer report``).
* ``POST /v1/mounts`` (root) a :class:`bootseer.agents.mountapi.MountRequest` -> the container's
  lazy root (:class:`bootseer.agents.mountapi.ContainerMount`);
  ``DELETE /v1/mounts/{key}?exit_code=N&rootfs=PATH`` (root) -> the completed start
  record; with ``wait=false``, 202 once the mounts are gone, the record following
  (:meth:`~bootseer.agents.mounts.MountManager.release`); ``GET /v1/mounts`` (root) ->
  the mounts served (:mod:`bootseer.agents.mounts`). Used by the runtime shim and the OCI
  hook.
* ``GET /metrics``: Prometheus text format (:mod:`bootseer.agents.metrics`); also on TCP at
  ``agent.metrics_listen`` (``host:port``) when set, for Prometheus to scrape.
* ``POST /v1/warm`` ``{"image", "workload", "all", "envs", "checkpoints", "job", "nodes",
  "peers"}`` (``job`` and ``peers``: root only, they choose whom the node serves) -> events
  ``{"event": "plan", "bytes"}``, ``{"event": "progress", "bytes"}``..., then
  ``{"event": "result", ...}`` (:meth:`bootseer.agents.warm.WarmSummary.to_json`) or
  ``{"event": "error", "message"}``; 503 while :data:`MAX_WARMS` are in progress.
* ``POST /v1/p2p/read`` (root: the node's mount servers) a
  :class:`bootseer.agents.mountapi.PeerRead` -> the bytes of an image pack's range through
  the job's swarm (:mod:`bootseer.p2p.demand`); 404: read the store.
  ``POST /v1/p2p/read-file`` (root: checkpoint mount servers) a
  :class:`bootseer.agents.mountapi.PeerFileRead` -> the same for a checkpoint file.

Each kind of work has threads of its own (mounts, releases, warms, queries, the watcher),
and every wait has a timeout, so no number of requests of one kind holds up another.

Peer-to-peer (``p2p.enabled``): the agent holds the node's one swarm
(:mod:`bootseer.p2p`) for its lifetime, in its p2p node (:mod:`bootseer.agents.p2pnode`).
A warm that names its job (or its peers) announces
this node in the job's records, reads the job's members (waiting briefly for ``nodes`` of
them: every node must see the same list) and fetches the hot pack and the snapshots' shards
through the swarm, seeding each once it is in the cache, until ``p2p.seed_time`` or
``p2p.seed_after_start`` seconds after a container's mount here. A mount of a job's
container opens its image's packs in the swarm, and its servers read them and its
checkpoint files through the agent (``/v1/p2p/read``, ``/v1/p2p/read-file``), from the
job's peers where they have the bytes. Off, no swarm exists and
libtorrent is never loaded; a job in a warm request changes nothing.

SIGTERM and SIGINT stop it gracefully: requests in progress finish their current step,
the socket is removed, this node's peer records are withdrawn and the swarm closed;
containers' mounts keep serving and the next agent adopts them.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import functools
import gc
import grp
import json
import logging
import math
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import uvloop
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from bootseer import __version__, boundedjson
from bootseer.agents import fields, jobreport
from bootseer.agents.metrics import AgentMetrics
from bootseer.agents.mountapi import MountRequest, PeerFileRead, PeerRead
from bootseer.agents.mounts import MountManager, MountMismatch, UnknownMount
from bootseer.agents.p2pnode import P2PNode
from bootseer.agents.policy import CheckpointPolicy, JobPolicy, PolicyError
from bootseer.agents.priority import Priority, PriorityGate
from bootseer.agents.timeline import StartRecord, Timeline, timeline_path
from bootseer.agents.warm import WarmRequest, warm
from bootseer.config import Config
from bootseer.errors import BootseerError
from bootseer.nodecache import NodeCaches
from bootseer.p2p import Fanout
from bootseer.p2p.demand import NotShared
from bootseer.p2p.sharedfile import SharedFile
from bootseer.prefetch.blockformat import MAX_MANIFEST_BYTES
from bootseer.prefetch.lazyimage import LazyImage, resolve_image
from bootseer.store import BlobStore, open_configured_store
from bootseer.stripedfs.files import CheckpointSource

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Threads per kind of work. Each kind has its own, so that no number of requests of one
#: kind can hold up another: warms cannot delay a container's mount or release, and the
#: watcher that frees the priority gate warms wait on always has its thread.
MOUNT_THREADS = 8
RELEASE_THREADS = 8
WARM_THREADS = 2
#: Mount servers' reads through peers at once (each mostly waits for pieces): an image's
#: and a checkpoint's servers' reads together.
P2P_THREADS = 16
QUERY_THREADS = 2
#: Warm requests admitted at once (running or waiting for a thread); more get 503.
MAX_WARMS = 16
#: Longest a warm's fetch yields to demand reads and starting containers (each time):
#: a container that reads for ever must not starve staging for good.
WARM_MAX_YIELD = 30.0
#: Requests only root may make (the runtime shim and the OCI hook run as root): they
#: mount, release and record containers' starts. The socket's group may warm and read.
ROOT_ONLY = {("POST", "/v1/mounts"), ("GET", "/v1/mounts"), ("DELETE", "/v1/mounts/{id}"),
             ("POST", "/v1/starts"), ("POST", "/v1/p2p/read"),
             ("POST", "/v1/p2p/read-file")}


#: What a mount itself records (``MountManager.mount``), before the workload runs.
MOUNT_PHASES = frozenset({"created", "image_ready"})


class Agent:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.checkpoints = CheckpointPolicy.from_config(config)  # a bad list fails here
        self.sharing = CheckpointPolicy.sharing(config)
        self.jobs = JobPolicy.from_config(config)
        self.blobs = BlobStore(open_configured_store(config))
        self.cache = NodeCaches.for_config(config).blocks()
        #: Images warms are using now, by id, with how many use each: one in-flight table
        #: per image while warms of it run, none kept after (their memory goes with it).
        self._images: dict[str, tuple[LazyImage, int]] = {}
        self._lock = threading.Lock()
        self.timeline = Timeline(timeline_path(config))
        self.node = fields.name(config.agent.node_name or socket.gethostname(),
                                "agent.node_name", fields.COMPONENT)
        self._merging = threading.Lock()  # start records are merged one at a time
        #: The node's swarm and demand reads (:mod:`bootseer.agents.p2pnode`); None when
        #: peer-to-peer is off.
        self.p2p = P2PNode.open(config, self.blobs.store, self.node, self.sharing.allows)
        #: The job root last warmed this node for, and when (monotonic).
        self._warmed_for: tuple[str, float] | None = None
        self.metrics = AgentMetrics(self.p2p.swarm.stats if self.p2p else None,
                                    self.p2p.demand.snapshot if self.p2p else None)
        self.gate = PriorityGate()  # demand reads > containers starting > warm requests
        self.mounts = MountManager(config, self.record, self.gate,
                                   spare_servers=config.agent.spare_servers,
                                   peer_reads=self.p2p is not None)
        self.pools = {kind: ThreadPoolExecutor(n, thread_name_prefix=kind) for kind, n in
                      (("mount", MOUNT_THREADS), ("release", RELEASE_THREADS),
                       ("p2p", P2P_THREADS),
                       ("warm", WARM_THREADS), ("query", QUERY_THREADS), ("watch", 1))}
        self._warms = 0  # admitted warm requests
        self.store_connected = threading.Event()

    def connect_store(self) -> None:
        """Connect to the store ahead of the first request (for ``hdfs://``, the NameNode's):
        else the first container start on a freshly started agent pays for it before its
        mount even begins. In the background; a failure is the first request's to report."""
        def connect() -> None:
            try:
                self.blobs.store.exists("refs")
            except Exception as exc:
                log.warning("cannot reach the store %s yet: %s", self.config.store, exc)
            else:
                self.store_connected.set()

        threading.Thread(target=connect, name="store-connect", daemon=True).start()

    @contextmanager
    def image(self, name: str, fanout: Fanout | None = None) -> Iterator[LazyImage]:
        """The image for a warm, shared with the warms of it running meanwhile (their
        fetches then never overlap); released, with its memory, when the last one ends.
        With ``fanout``, a manifest not in the cache comes through the job's swarm."""
        image_id = resolve_image(self.blobs, name)
        with self._lock:
            lazy, users = self._images.get(image_id, (None, 0))
        if lazy is None:  # outside the lock: loading a manifest reads the store
            if fanout is not None:
                fanout.cache_blob(self.blobs, image_id, self.cache,
                                  max_size=MAX_MANIFEST_BYTES)
            lazy = LazyImage(self.blobs, image_id, self.cache, prefetch_memory=0)
        with self._lock:
            lazy, users = self._images.get(image_id, (lazy, 0))
            self._images[image_id] = (lazy, users + 1)
        try:
            yield lazy
        finally:
            with self._lock:
                lazy, users = self._images[image_id]
                if users == 1:
                    del self._images[image_id]
                else:
                    self._images[image_id] = (lazy, users - 1)
            if users == 1:
                del lazy
                _give_memory_back()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_root_only])
        app.add_routes([web.get("/v1/health", self.health), web.post("/v1/warm", self.warm),
                        web.post("/v1/starts", self.record_start),
                        web.get("/v1/starts", self.list_starts),
                        web.get("/metrics", self.serve_metrics),
                        web.post("/v1/mounts", self.mount),
                        web.get("/v1/mounts", self.list_mounts),
                        web.delete("/v1/mounts/{id}", self.release),
                        web.post("/v1/p2p/read", self.peer_read),
                        web.post("/v1/p2p/read-file", self.peer_read_file)])
        return app

    async def _run(self, kind: str, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pools[kind], fn, *args)

    async def mount(self, request: web.Request) -> web.Response:
        mount_request = await _parse(request, MountRequest.from_json, "mount request")
        try:
            allowed = {name: self.checkpoints.check(url)
                       for name, url in mount_request.checkpoints.items()}
            image_id = await self._run("mount", resolve_image, self.blobs, mount_request.image)
            mount_request = dataclasses.replace(mount_request, checkpoints=allowed,
                                                job=self._job_of(mount_request))
            mount = await self._run("mount", self.mounts.mount, mount_request, image_id)
        except Exception as exc:
            raise _http_error(exc, f"mounting image {mount_request.image} for "
                                   f"{mount_request.id}") from exc
        if self.p2p is not None:  # a job started here: its network is for training soon
            self.p2p.container_started()
        if self.p2p is not None and mount_request.job is not None:
            self.pools["p2p"].submit(self._open_image, mount_request.job, mount_request.image)
        return web.json_response(mount.to_json())

    def _job_of(self, request: MountRequest) -> str | None:
        """The job a container joins: the one its pod names where ``agent.jobs`` grants
        it, else the one root last warmed this node for (``warm --job``: the scheduler
        readies a node for the job it starts there), for ``p2p.seed_time`` after."""
        job = self.jobs.effective(request.job, request.runtime)
        if request.job is not None and job is None:
            log.warning("container %s names job %s, which %s does not grant", request.id,
                        request.job, JobPolicy.KEY)
        with self._lock:
            warmed = self._warmed_for
        if job is None and warmed is not None and \
                time.monotonic() - warmed[1] < self.config.p2p.seed_time:
            job = warmed[0]
        return job

    def _open_image(self, job: str, image: str) -> None:
        """The image's packs opened in the swarm for the job's demand reads (its server
        reads through :meth:`peer_read`); in the background: never on a start's path."""
        assert self.p2p is not None
        try:
            with self.image(image) as lazy:
                packs = list(lazy.manifest.packs)
            self.p2p.open_image(job, packs)
        except Exception:  # an optimisation: the server reads the store
            log.exception("p2p: opening image %s for job %s", image, job)

    async def peer_read(self, request: web.Request) -> web.Response:
        """A range of an image pack through the job's swarm, for a mount server (root);
        404 when it is not to be had so (then the server reads the store)."""
        if self.p2p is None:
            raise web.HTTPNotFound(text="peer-to-peer is off on this node")
        body = await _parse(request, PeerRead.from_json, "peer read")
        try:
            data = await self._run("p2p", self.p2p.demand.read, body.job, body.pack,
                                   body.offset, body.length)
        except NotShared as exc:
            raise web.HTTPNotFound(text=str(exc)) from exc
        return web.Response(body=data, content_type="application/octet-stream")

    async def peer_read_file(self, request: web.Request) -> web.Response:
        """A range of a checkpoint file through the job's swarm, for a checkpoint mount's
        server (root); 404 when it is not to be had so (then the server reads the store),
        403 when ``checkpoint.allowed`` does not allow the file."""
        if self.p2p is None:
            raise web.HTTPNotFound(text="peer-to-peer is off on this node")
        body = await _parse(request, PeerFileRead.from_json, "peer read")
        try:
            data = await self._run("p2p", self._read_file, body)
        except NotShared as exc:
            raise web.HTTPNotFound(text=str(exc)) from exc
        except Exception as exc:
            raise _http_error(exc, f"reading {body.url} through peers") from exc
        return web.Response(body=data, content_type="application/octet-stream")

    @functools.cached_property
    def _checkpoint_source(self) -> CheckpointSource:
        """Checkpoint stores as configured, each opened once (demand reads' own)."""
        return CheckpointSource(self.config)

    def _read_file(self, body: PeerFileRead) -> bytes:
        assert self.p2p is not None
        url = self.checkpoints.check(body.url)
        store, key = self._checkpoint_source.locate(url)
        file = SharedFile(store, self.blobs.store, key, url, body.size, body.mtime)
        return self.p2p.demand.read_file(body.job, file, body.offset, body.length)

    async def release(self, request: web.Request) -> web.Response:
        exit_code = request.query.get("exit_code")
        try:
            code = None if exit_code is None else int(exit_code)
        except ValueError as exc:
            raise web.HTTPBadRequest(text="exit_code: an integer") from exc
        try:
            record = await self._run("release", functools.partial(
                self.mounts.release, request.match_info["id"], code,
                request.query.get("rootfs"), wait=request.query.get("wait") != "false"))
        except Exception as exc:
            raise _http_error(exc, "releasing a mount") from exc
        if record is None:  # the record follows (GET /v1/starts)
            return web.json_response({"id": request.match_info["id"]}, status=202)
        return web.json_response(record.to_json())

    async def list_mounts(self, request: web.Request) -> web.Response:
        return web.json_response(await self._run("query", self.mounts.list))

    def record(self, start: StartRecord) -> StartRecord:
        """Merge ``start`` into the timeline and count what it added in the metrics; a
        start of a job is published for the job's report whenever it changed, from its
        workload's first phase on: the mount, on the start's critical path, never waits
        for a write to the store."""
        before, after = self._record(start)
        self.metrics.observe(before, after)
        if after.job is not None and after != before and set(after.phases) - MOUNT_PHASES:
            try:
                jobreport.publish(self.blobs.store, self.node, after)
            except Exception as exc:  # a report must never fail a start
                log.warning("could not publish start %s of job %s: %s", after.id, after.job,
                            exc)
        return after

    async def record_start(self, request: web.Request) -> web.Response:
        start = await _parse(request, StartRecord.from_request, "start record")
        after = await self._run("query", self.record, start)
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
            if not math.isfinite(since):
                raise ValueError(since)
        except ValueError as exc:
            raise web.HTTPBadRequest(text="since: Unix seconds") from exc
        starts = await self._run("query", self.timeline.starts, since)
        return web.json_response([s.to_json() for s in starts])

    async def serve_metrics(self, request: web.Request) -> web.Response:
        body, content_type = await self._run("query", self.metrics.exposition)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def health(self, request: web.Request) -> web.Response:
        # The spare pool's lock is held while it spawns a spare: not on the event loop.
        spares_ready = await self._run("query", self.mounts.spares.ready)
        return web.json_response({"version": __version__, "pid": os.getpid(),
                                  "store": self.config.store,
                                  "cache_dir": str(self.config.cache_dir),
                                  "busy": {p.name.lower(): n
                                           for p, n in self.gate.busy().items()},
                                  "spares": {"ready": spares_ready,
                                             "size": self.mounts.spares.size},
                                  "store_connected": self.store_connected.is_set()})

    async def warm(self, request: web.Request) -> web.StreamResponse:
        warm_request = await _parse(request, WarmRequest.from_json, "warm request")
        if (warm_request.job is not None or warm_request.peers) and not _is_root(request):
            raise web.HTTPForbidden(text="warm: only root (the scheduler) may name a job or "
                                         "peers: they decide whom this node serves")
        try:
            warm_request = dataclasses.replace(warm_request, checkpoints=tuple(
                self.checkpoints.check(url) for url in warm_request.checkpoints))
            if warm_request.image is not None:
                await self._run("query", resolve_image, self.blobs, warm_request.image)
        except Exception as exc:
            raise _http_error(exc, "warm") from exc
        if self._warms >= MAX_WARMS:
            raise web.HTTPServiceUnavailable(
                text=f"{MAX_WARMS} warm requests are already in progress; retry later")
        self._warms += 1
        try:
            return await self._stream_warm(request, warm_request)
        finally:
            self._warms -= 1

    async def _stream_warm(self, request: web.Request,
                           warm_request: WarmRequest) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

        def emit(event: dict[str, Any] | None) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        def before_fetch() -> None:
            self.gate.wait_turn(Priority.WARM, timeout=WARM_MAX_YIELD)

        def work() -> None:
            fanout = None
            try:
                fanout = self._fanout(warm_request)
                with self._lazy(warm_request.image, fanout) as lazy:
                    summary = warm(self.blobs, self.config, warm_request,
                                   image_cache=self.cache, lazy=lazy, fanout=fanout,
                                   before_fetch=before_fetch,
                                   on_plan=lambda n: emit({"event": "plan", "bytes": n}),
                                   on_progress=lambda n: emit({"event": "progress",
                                                               "bytes": n}))
                if summary.image is not None:
                    summary.image.name = warm_request.image or summary.image.name
                summary.via = "agent"
                self.metrics.warmed(summary)
                emit({"event": "result", **summary.to_json()})
            except (BootseerError, OSError) as exc:
                emit({"event": "error", "message": str(exc)})
            except Exception as exc:
                log.exception("warm %s failed", warm_request)
                emit({"event": "error", "message": f"internal error: {exc}"})
            finally:
                if fanout is not None:
                    self.metrics.shared(fanout.results)
                    assert self.p2p is not None
                    self.p2p.warm_done()
                emit(None)

        task = loop.run_in_executor(self.pools["warm"], work)
        while (event := await events.get()) is not None:
            await response.write(json.dumps(event).encode() + b"\n")
        await task
        await response.write_eof()
        return response

    def _fanout(self, request: WarmRequest) -> Fanout | None:
        """The job's swarm for a warm (:meth:`P2PNode.fanout`): None with peer-to-peer
        off or for a warm of no job. A warm that names its job readies this node for it
        (:meth:`_job_of`), peer-to-peer or not."""
        if request.job is not None:
            with self._lock:
                self._warmed_for = (request.job, time.monotonic())
        if self.p2p is None:
            return None
        return self.p2p.fanout(request.job, request.peers, request.nodes,
                               request.checkpoints)

    def close(self) -> None:
        """Leave the jobs' swarms (:meth:`P2PNode.close`)."""
        if self.p2p is not None:
            self.p2p.close()

    @contextmanager
    def _lazy(self, name: str | None, fanout: Fanout | None) -> Iterator[LazyImage | None]:
        if name is None:
            yield None
        else:
            with self.image(name, fanout) as lazy:
                yield lazy


def _give_memory_back() -> None:
    """Return what a finished warm freed to the system: its fetch buffers are many MiB
    each, and glibc keeps freed heap for the process unless asked (``malloc_trim``)."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the allocator keeps its own counsel
        pass


def _http_error(exc: Exception, doing: str) -> web.HTTPException:
    """The status a failure maps to: the client's fault is a 4xx naming what to change."""
    text = f"{doing}: {exc}"
    if isinstance(exc, PolicyError):
        return web.HTTPForbidden(text=text)
    if isinstance(exc, UnknownMount | FileNotFoundError):
        return web.HTTPNotFound(text=text)
    if isinstance(exc, MountMismatch):
        return web.HTTPConflict(text=text)
    if isinstance(exc, ValueError):
        return web.HTTPBadRequest(text=text)
    if not isinstance(exc, BootseerError | OSError):
        log.exception("%s failed", doing)
    return web.HTTPInternalServerError(text=text)


def _is_root(request: web.Request) -> bool:
    """Whether root (or the agent's own user) is at the other end of the socket."""
    return _peer_uid(request) in (0, os.geteuid())


def _peer_uid(request: web.Request) -> int | None:
    """The uid of the process at the other end of the Unix socket (``SO_PEERCRED``)."""
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


@web.middleware
async def _root_only(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
    """:data:`ROOT_ONLY` requests from anyone but root (or the agent's own user) get 403:
    the socket's group may warm and read, not mount or release containers. A ``HEAD`` is
    checked as the ``GET`` it is (aiohttp runs the GET's handler for it), and a method the
    API does not use is refused (405) before any handler: no other spelling of a request
    reaches a root-only handler unchecked."""
    method = "GET" if request.method == "HEAD" else request.method
    if method not in ("GET", "POST", "DELETE"):
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD", "POST", "DELETE"])
    route = request.match_info.route.resource
    canonical = route.canonical if route is not None else request.path
    if (method, canonical) in ROOT_ONLY and not _is_root(request):
        raise web.HTTPForbidden(text=f"{request.method} {canonical}: only root (the runtime "
                                     f"shim and the OCI hook) may ask this of the agent")
    return await handler(request)


async def _parse(request: web.Request, from_json: Callable[[Any], T], what: str) -> T:
    """The request's JSON body as ``from_json`` reads it; a 400 naming ``what`` if not.
    The body is at most ``client_max_size`` (else aiohttp's 413) and is parsed within that
    and :data:`bootseer.boundedjson.MAX_DEPTH`: a nested body is a 400, not a
    ``RecursionError`` and a 500."""
    body = await request.read()
    try:
        return from_json(boundedjson.loads(body, limit=request.client_max_size, what=what))
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


class _UnparsedRequestsInOneLine(logging.Filter):
    """aiohttp logs a request it cannot parse (a request line over 8 KiB, a bad header)
    at ERROR with its traceback: anyone who may connect, the socket's group, could fill
    root's log so. Such a request is the client's fault: one line, at WARNING."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg, record.args = f"{record.getMessage()}: {exc.message}", ()
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


async def _serve(agent: Agent, socket_path: Path) -> None:
    logging.getLogger("aiohttp.server").addFilter(_UnparsedRequestsInOneLine())
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
    watcher = asyncio.create_task(agent.mounts.watch(stop, agent.pools["watch"]))
    agent.mounts.start_spares()
    agent.connect_store()
    try:
        await stop.wait()
        await watcher
    finally:
        await runner.cleanup()
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        socket_path.unlink(missing_ok=True)
        for pool in agent.pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
        agent.mounts.close()
        agent.close()
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
