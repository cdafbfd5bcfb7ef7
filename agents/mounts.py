"""The containers' lazy roots, owned by the agent: mounted, watched, remounted, released.

For each container the runtime shim or the OCI hook asks about (:mod:`bootseer.agents.mountapi`),
the agent starts one FUSE server process for the lazy image (prefetching its hot list,
recording a young one), puts an overlay with a fresh writable layer over it, and hands
back the overlay as the container's root. Everything about a container lives in one
directory, ``<cache_dir>/containers/<key>/`` (the key is the container's id qualified by
its engine's namespace, :func:`bootseer.agents.mountapi.mount_key`)::

    lower/    the lazy image (FUSE)          upper/, work/  the overlay's writable layer
    meta/     its metadata image (EROFS), when ``lower/`` serves files by key
    rootfs/   the overlay: the container's root
    signal/   bound at /run/bootseer in the container: ready file, phase marks
    state.json  what a restarted agent needs to adopt the mount

The image's connection and each checkpoint directory's are served connections
(:class:`bootseer.agents.served.Served`), supervised alike: the agent holds each
connection's /dev/fuse file, so a server that dies is seen by the watcher within
:data:`WATCH_INTERVAL` and replaced by one that takes the connection over, and the running
container reads on; an agent that restarts adopts them from ``state.json``.

When the container stops (``DELETE``), the overlay and the lazy mount go, the server ends
the recording and writes its report, and the start's record is completed: phases the
workload marked, exit, the mount's statistics.

A container writes its root and its signal directory, so the host must never trust or
expose them: ``containers/`` and each container's directory are root's alone (0700),
every mount made here is ``nosuid,nodev``, and what the agent reads from the signal
directory is read without following links or blocking (:func:`bootseer.ready.read_phases`).
Checkpoint URLs arrive here already allowed and normalised by the agent's policy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bootseer.agents.mountapi import ContainerMount, MountRequest, check_id
from bootseer.agents.policy import RecordingPolicy
from bootseer.agents.priority import Priority, PriorityGate
from bootseer.agents.served import Served, reap
from bootseer.agents.spare import SparePool
from bootseer.agents.timeline import StartRecord, container_phases
from bootseer.config import Config
from bootseer.errors import BootseerError
from bootseer.jsonfile import write_json
from bootseer.mounts import is_mounted, mount_overlay, unmount, wait_for_file
from bootseer.prefetch.serverspec import ImageServerSpec, stats_path
from bootseer.ready import READY_FILE_ENV, SIGNAL_DIR
from bootseer.serve import ServerSpec
from bootseer.snapshot.key import IMAGE_ID_ENV
from bootseer.snapshot.run import MOUNTED_ENVS
from bootseer.store.local import pid_alive
from bootseer.stripedfs.serverspec import CheckpointServerSpec

log = logging.getLogger(__name__)

#: Seconds between two looks at every server (is it alive, how far is its prefetch).
WATCH_INTERVAL = 0.5
#: Released containers whose records are completed at once (each waits for its server's
#: report, seconds while a recording is stored); more wait their turn.
FINISH_THREADS = 4
#: Seconds a stopping agent waits for the records of containers already released.
FINISH_WAIT = 30.0

class UnknownMount(BootseerError):
    """No container of that id has a mount here."""


class MountMismatch(BootseerError):
    """A release named a mount whose root is not the one the engine ran the container on."""


@dataclass
class _Container:
    """One container's mount as the agent tracks it (persisted as ``state.json``): its
    image's connection and one per checkpoint directory, by name."""

    request: MountRequest
    mount: ContainerMount
    created: float
    image: Served
    checkpoints: dict[str, Served] = field(default_factory=dict)
    #: The signal directory's mtime at the watcher's last look (not kept in state.json:
    #: a new agent looks again, and a phase's first time wins).
    signal_mtime: float = 0.0

    def connections(self) -> list[Served]:
        return [self.image, *self.checkpoints.values()]

    def to_json(self) -> dict[str, Any]:
        return {"request": self.request.to_json(), "mount": self.mount.to_json(),
                "created": self.created, "image": self.image.to_json(),
                "checkpoints": {name: served.to_json()
                                for name, served in self.checkpoints.items()}}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> _Container:
        return cls(MountRequest.from_json(body["request"]),
                   ContainerMount.from_json(body["mount"]), float(body["created"]),
                   Served.from_json(body["image"]),
                   {str(name): Served.from_json(served)
                    for name, served in body["checkpoints"].items()})


class _Claims:
    """A mount's current claims on the node's fetch priorities, switched by the watcher:
    STARTING while its hot list is being prefetched, DEMAND while its reads fetch."""

    def __init__(self, gate: PriorityGate) -> None:
        self.gate = gate
        self.demand_fetches = 0  # the server's demand fetch requests at the last look
        self._held: dict[Priority, AbstractContextManager[None]] = {}

    def set(self, priority: Priority, on: bool) -> None:
        if on and priority not in self._held:
            hold = self.gate.hold(priority)
            hold.__enter__()
            self._held[priority] = hold
        elif not on and priority in self._held:
            self._held.pop(priority).__exit__(None, None, None)

    def clear(self) -> None:
        for priority in list(self._held):
            self.set(priority, False)


class MountManager:
    """The containers' mounts on this node; every method is blocking (the agent runs them
    in its thread pool), and safe to call from several threads."""

    def __init__(self, config: Config, record: Callable[[StartRecord], StartRecord],
                 gate: PriorityGate | None = None, *, spare_servers: int = 0,
                 peer_reads: bool = False) -> None:
        self.config = config
        #: Whether the servers of a job's containers read through the agent's swarm (p2p
        #: on): their specs' ``peer_job``.
        self.peer_reads = peer_reads
        self.gate = gate or PriorityGate()
        self._claims: dict[str, _Claims] = {}
        self.recording = RecordingPolicy.from_config(config)
        self.root = config.cache_dir / "containers"
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # also when an older agent made it 0755
        self._record = record  # into the timeline (and the metrics): the agent's
        self._mounts: dict[str, _Container] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        #: Released containers' records being completed (``release(wait=False)``).
        self._finishing = ThreadPoolExecutor(FINISH_THREADS, thread_name_prefix="finish")
        self._unfinished: set[Future] = set()
        #: Servers started ahead of need; filled by :meth:`start_spares`.
        self.spares = SparePool(config, config.cache_dir / "logs" / "spare-servers.log",
                                spare_servers)

    def start_spares(self) -> None:
        """Start the spare servers (in the background: the first mounts do not wait)."""
        threading.Thread(target=self.spares.fill, name="spares", daemon=True).start()

    # -- the API ---------------------------------------------------------------------

    def mount(self, request: MountRequest, image_id: str | None = None) -> ContainerMount:
        """The container's root: mounted now, or the one it already has. ``image_id``:
        what the request's image resolved to, if the caller has resolved it."""
        key = request.key
        with self._lock_for(key):
            if key in self._mounts:
                return self._mounts[key].mount
            created = time.time()
            container = self._mount(request, created, image_id)
            try:
                self._mounts[key] = container
                self._save(container)
                self._record(StartRecord(key, job=request.job, image=request.image,
                                         workload=request.workload, runtime=request.runtime,
                                         phases={"created": created,
                                                 "image_ready": time.time()},
                                         detail={"pod": request.pod} if request.pod else {}))
            except BaseException:  # nothing of a refused mount stays behind
                self._mounts.pop(key, None)
                self._teardown(self.root / key, container.connections())
                raise
            claims = self._claims[key] = _Claims(self.gate)
            claims.set(Priority.STARTING, True)  # until the watcher sees the prefetch end
        return container.mount

    def release(self, container_id: str, exit_code: int | None = None,
                rootfs: str | None = None, *, wait: bool = True) -> StartRecord | None:
        """The container stopped: unmount, let the server store its recording, and
        complete the start's record. ``rootfs``, the root the engine ran the container
        on, must be this mount's when given: proof from the engine's own state that the
        caller releases the container's own mount.

        Without ``wait``, returns once the container's mounts are gone (what its engine
        waits for before it removes the container); its server's report, the recording
        it stores (seconds, for a recording start) and the start's record follow in the
        background (None is returned). The container's id stays locked until then, so a
        new container of the same id mounts only after its directory is cleared."""
        check_id(container_id)
        lock = self._lock_for(container_id)
        lock.acquire()
        try:
            container = self._mounts.get(container_id)
            if container is None:
                raise UnknownMount(f"no container {container_id} has a mount here")
            if rootfs is not None and os.path.normpath(rootfs) != container.mount.rootfs:
                raise MountMismatch(f"container {container_id}'s root is not {rootfs}: "
                                    f"not releasing another container's mount")
            del self._mounts[container_id]
            claims = self._claims.pop(container_id, None)
            if claims is not None:
                claims.clear()
            exited = time.time()
            unmount(Path(container.mount.rootfs))
            unmount(self.root / container_id / "meta")
            for served in container.checkpoints.values():
                served.close()
            container.image.close(wait=None)  # the server sees the connection end, reports
        except BaseException:
            lock.release()
            raise

        def finish() -> StartRecord:
            try:
                record = self._finish(container_id, container, exited, exit_code)
            finally:
                lock.release()
            with self._lock:
                self._locks.pop(container_id, None)
            return self._record(record)

        if wait:
            return finish()
        future = self._finishing.submit(finish)
        with self._lock:
            self._unfinished.add(future)
        future.add_done_callback(functools.partial(self._finished, container_id))
        return None

    def _finished(self, container_id: str, future: Future) -> None:
        with self._lock:
            self._unfinished.discard(future)
        if not future.cancelled() and future.exception() is not None:
            log.error("completing the record of container %s failed", container_id,
                      exc_info=future.exception())

    def _finish(self, container_id: str, container: _Container, exited: float,
                exit_code: int | None) -> StartRecord:
        """A released container's record, once its server has reported; its directory
        is removed."""
        directory = self.root / container_id
        report = self._report(directory, container.image.pid)
        phases = container_phases(directory / "signal", container.created, exited)
        phases["exited"] = exited
        detail: dict[str, Any] = {"image": report} if report else {}
        if isinstance(container.image.spec, ImageServerSpec) and container.image.spec.by_key:
            detail["metadata_image"] = True  # names from the kernel, files by key
        if exit_code is not None:
            detail["exit_code"] = exit_code
        if container.image.deaths:
            detail["server_deaths"] = container.image.deaths
            detail["server_failed"] = container.image.failed
        restarts = sum(served.deaths for served in container.checkpoints.values())
        if restarts:
            detail["checkpoint_server_deaths"] = restarts
        shutil.rmtree(directory, ignore_errors=True)
        return StartRecord(container_id, phases=phases, detail=detail)

    def close(self, timeout: float = FINISH_WAIT) -> None:
        """Stop: wait (``timeout`` seconds at most) for released containers' records,
        then for the spare servers."""
        with self._lock:
            unfinished = list(self._unfinished)
        if futures.wait(unfinished, timeout).not_done:
            log.warning("stopping before every released container's record is complete")
        self._finishing.shutdown(wait=False)
        self.spares.close()

    def list(self) -> list[dict[str, Any]]:
        with self._lock:
            containers = list(self._mounts.values())
        return [{"id": c.request.key, "container": c.request.id, "image": c.request.image,
                 "rootfs": c.mount.rootfs, "created": c.created, **c.image.status(),
                 "checkpoints": {name: served.status()
                                 for name, served in c.checkpoints.items()}}
                for c in containers]

    # -- lifecycle ---------------------------------------------------------------------

    def adopt(self) -> None:
        """After an agent restart: take over the mounts a previous agent left serving;
        clear what is left of containers whose mounts are gone."""
        for state in sorted(self.root.glob("*/state.json")):
            try:
                body = json.loads(state.read_text())
                container = self._from_before_served(body, state.parent) \
                    if "server_fd" in body else _Container.from_json(body)
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                log.warning("ignoring %s: %s", state, exc)
                continue
            key = container.request.key
            if key != state.parent.name:
                log.warning("ignoring %s: it describes container %s", state, key)
                continue
            if not is_mounted(Path(container.mount.rootfs)):
                log.info("container %s's mount is gone: removing its directory", key)
                _clear(state.parent)
                continue
            for served in container.connections():
                if not served.adopt():
                    log.error("container %s: the server of %s is gone and the connection "
                              "with it; the container's reads of it fail", key,
                              served.spec.what)
            self._mounts[key] = container
            log.info("adopted container %s's mount (server pid %d)", key, container.image.pid)

    def _from_before_served(self, body: dict[str, Any], directory: Path) -> _Container:
        """A ``state.json`` an agent of an earlier release left (its servers' pids and
        fds, no specs): those servers serve on, so their specs are rebuilt from the
        request as this agent would write them, which is all a takeover needs (an
        upgraded agent can still replace them, and releases their mounts)."""
        request = MountRequest.from_json(body["request"])

        def served(spec: ServerSpec, log_path: Path, pid: Any, fd: Any, deaths: Any,
                   failed: Any) -> Served:
            return Served(spec, log_path, int(pid), int(fd), int(deaths), bool(failed))

        mount = ContainerMount.from_json(body["mount"])
        image = served(self._image_spec(request, directory, mount.image_id, by_key=False),
                       directory / "server.log", body["pid"], body["server_fd"],
                       body.get("server_deaths", 0),
                       body.get("failed", False))
        checkpoints = {
            str(name): served(self._checkpoint_spec(request, directory, name),
                              directory / f"checkpoint-{name}.log", server["pid"],
                              server["fd"], server.get("deaths", 0), server.get("failed", False))
            for name, server in (body.get("checkpoints") or {}).items()}
        return _Container(request, mount, float(body["created"]), image, checkpoints)

    async def watch(self, stop: asyncio.Event, pool: Executor | None = None) -> None:
        """Look at every server each :data:`WATCH_INTERVAL` until ``stop`` is set, on
        ``pool`` (the agent gives it a thread of its own: warm requests wait on the
        priorities the watcher releases, so it must never queue behind them)."""
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            await loop.run_in_executor(pool, self._look)
            try:
                await asyncio.wait_for(stop.wait(), WATCH_INTERVAL)
            except TimeoutError:
                pass

    def _look(self) -> None:
        with self._lock:
            containers = list(self._mounts.values())
        for container in containers:
            self._claim(container, container.image.serving())
            self._report_phases(container)
            for served in container.connections():
                if not served.serving() and not served.failed:
                    self._take_over(container, served)

    def _report_phases(self, container: _Container) -> None:
        """Record the phases the workload marked since the last look (when the signal
        directory changed), so a running start's timeline, and its job's report, show
        them before the container exits."""
        signal = self.root / container.request.key / "signal"
        try:
            mtime = signal.stat().st_mtime
        except OSError:
            return  # released meanwhile
        if mtime == container.signal_mtime:
            return
        container.signal_mtime = mtime
        phases = container_phases(signal, container.created, time.time())
        if phases:
            self._record(StartRecord(container.request.key, phases=phases))

    def _take_over(self, container: _Container, served: Served) -> None:
        """A server died: start one that takes its connection over. Reads the dead server
        had taken fail (``ECONNABORTED``); a checkpoint's files stay open, and the new
        server re-creates their readers on their next read."""
        key = container.request.key
        with self._lock_for(key):
            if self._mounts.get(key) is not container or pid_alive(served.pid):
                return  # released, or replaced, meanwhile
            try:
                served.take_over()
                log.warning("container %s: the server of %s died; pid %d took its "
                            "connection over", key, served.spec.what, served.pid)
            except (BootseerError, OSError) as exc:
                served.failed = True
                log.error("container %s: the server of %s died and cannot be replaced: %s",
                          key, served.spec.what, exc)
            self._save(container)

    def _claim(self, container: _Container, alive: bool) -> None:
        """Hold the priorities the image's server needs now, from its statistics file."""
        from bootseer.prefetch.session import MountStats

        claims = self._claims.setdefault(container.request.key, _Claims(self.gate))
        if not alive:
            claims.clear()
            return
        try:
            stats = MountStats.load(stats_path(self.config.cache_dir,
                                               self.root / container.request.key / "lower"))
        except (OSError, ValueError, TypeError):
            return  # not written yet: keep what is held
        claims.set(Priority.STARTING, stats.prefetch is not None and not stats.prefetch.done)
        fetches = stats.reads.fetch_requests
        claims.set(Priority.DEMAND, fetches > claims.demand_fetches)
        claims.demand_fetches = fetches

    # -- the work ------------------------------------------------------------------------

    def _mount(self, request: MountRequest, created: float,
               image_id: str | None) -> _Container:
        """The container's connections, served, and its overlay."""
        from bootseer.prefetch.session import MountInfo

        directory = self.root / request.key
        if directory.exists():  # a failed earlier attempt: start clean
            _clear(directory)
        directory.mkdir(mode=0o700)
        parts = {name: directory / name for name in ("lower", "upper", "work", "rootfs",
                                                      "signal")}
        for path in parts.values():
            path.mkdir()
        opened: list[Served] = []
        try:
            image = self._open(self._image_spec(request, directory, image_id),
                               directory / "server.log")
            opened.append(image)
            info = MountInfo.load(directory / "info.json")
            image.spec = dataclasses.replace(image.spec, by_key=info.by_key)  # for takeovers
            if info.by_key:
                self._mount_by_key(info.image_id, directory, parts, request.envs)
            else:
                envs = self._environments(request.envs, parts["lower"], parts["upper"])
                mount_overlay([*envs, parts["lower"]], parts["upper"], parts["work"],
                              parts["rootfs"], volatile=True)
            checkpoints: dict[str, Served] = {}
            if request.checkpoints:
                (directory / "checkpoints").mkdir()
            for name in request.checkpoints or {}:
                (directory / "checkpoints" / name).mkdir()
                checkpoints[name] = self._open(self._checkpoint_spec(request, directory, name),
                                               directory / f"checkpoint-{name}.log")
                opened.append(checkpoints[name])
            image_config = info.config.get("config") or {}
            if not isinstance(image_config, dict):
                raise BootseerError(f"image {request.image}: its config is not an object")
            mount = ContainerMount(
                id=request.key, image=request.image, image_id=info.image_id,
                rootfs=str(parts["rootfs"]), signal_dir=str(parts["signal"]),
                env={READY_FILE_ENV: f"{SIGNAL_DIR}/ready", IMAGE_ID_ENV: info.image_id,
                     **({MOUNTED_ENVS: ",".join(request.envs)} if request.envs else {})},
                image_config=image_config, recording=info.recording,
                checkpoints_dir=str(directory / "checkpoints") if request.checkpoints
                else None)
        except BaseException:
            self._teardown(directory, opened)
            raise
        return _Container(request, mount, created, image, checkpoints)

    def _mount_by_key(self, image_id: str, directory: Path, parts: dict[str, Path],
                      envs: tuple[str, ...]) -> None:
        """The overlay over the image's metadata image (``meta/``), its files' data from
        the node's whole files, else from the server serving them by key (``lower/``);
        the snapshots ``envs`` above it."""
        from bootseer.nodecache import NodeCaches, whole_files_beside
        from bootseer.prefetch.metaimage import MetaImage

        meta = MetaImage(whole_files_beside(NodeCaches.for_config(self.config).blocks()),
                         image_id)
        (directory / "meta").mkdir()
        meta.data_dir.mkdir(mode=0o700, exist_ok=True)  # every whole file may be evicted
        meta.mount(directory / "meta")
        layers = self._environments(envs, directory / "meta", parts["upper"])
        mount_overlay([*layers, directory / "meta"], parts["upper"], parts["work"],
                      parts["rootfs"], data=[meta.data_dir, parts["lower"]], volatile=True)

    def _environments(self, keys: tuple[str, ...], image: Path, upper: Path) -> list[Path]:
        """The trees of the snapshots a container names, to lay over its image
        (:mod:`bootseer.agents.envs`)."""
        if not keys:
            return []
        from bootseer.agents.envs import layers
        from bootseer.nodecache import NodeCaches
        from bootseer.snapshot.config import SnapshotOptions
        from bootseer.store import BlobStore, open_configured_store

        return layers(keys, BlobStore(open_configured_store(self.config)),
                      NodeCaches.for_config(self.config).snapshots(),
                      SnapshotOptions.from_config(self.config.snapshot), image, upper)

    def _open(self, spec: ServerSpec, log_path: Path) -> Served:
        """A connection served by a spare, if one is there (it is ahead of a fresh start)."""
        return Served.open(spec, log_path, self.spares.take())

    def _image_spec(self, request: MountRequest, directory: Path,
                    image_id: str | None, *, by_key: bool | None = None) -> ImageServerSpec:
        """How the image's servers run: the first one records as the policy says (a
        server that takes over never does), and is waited for until it has loaded the
        image (``info.json``). A job's server reads through the job's peers."""
        mode = self.recording.effective(request.image, request.record, request.runtime)
        record = None
        if mode != "never":
            from bootseer.prefetch.recording import ReadyWhen

            record = ReadyWhen(directory / "signal" / "ready", None,
                               self.config.image.record_timeout)
        peers = self.peer_reads and request.job is not None
        return ImageServerSpec.of(
            self.config, request.image, directory / "lower", image_id=image_id,
            workload=request.workload,
            record=record, record_auto=mode == "auto", info=directory / "info.json",
            report=directory / "report.json", takeover_state=directory / "fuse.json",
            peer_job=request.job if self.peer_reads else None,
            agent_socket=self.config.agent.socket if peers else None, by_key=by_key)

    def _checkpoint_spec(self, request: MountRequest, directory: Path,
                         name: str) -> CheckpointServerSpec:
        """How the servers of checkpoint mount ``name`` run: the first one is waited for
        until it has listed the store directory. A job's server reads through the job's
        peers."""
        peers = self.peer_reads and request.job is not None
        return CheckpointServerSpec.of(
            self.config, request.checkpoints[name], directory / "checkpoints" / name,
            takeover_state=directory / f"checkpoint-{name}.fuse.json",
            ready_file=directory / f"checkpoint-{name}.ready",
            peer_job=request.job if peers else None,
            agent_socket=self.config.agent.socket if peers else None)

    def _teardown(self, directory: Path, connections: list[Served]) -> None:
        """Remove every mount and file of a container that must not stay (a refused or
        failed mount). Each server exits when it sees its mount go; it is waited for
        (killed after a while), because the image's writes its report into the directory
        on the way out."""
        unmount(directory / "rootfs")
        for served in reversed(connections):
            served.close()
        _clear(directory)

    def _report(self, directory: Path, pid: int) -> dict[str, Any] | None:
        """The server's final statistics (written after it stored the recording)."""
        from bootseer.prefetch.session import MountStats

        try:
            wait_for_file(directory / "report.json", pid, 300.0)
            return MountStats.load(directory / "report.json").to_json()
        except (BootseerError, OSError, ValueError, TypeError) as exc:
            log.warning("no report from the mount server of %s: %s", directory.name, exc)
            return None
        finally:
            reap(pid)

    def _save(self, container: _Container) -> None:
        write_json(self.root / container.request.key / "state.json", container.to_json(),
                   mode=0o600)

    def _lock_for(self, container_id: str) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(container_id, threading.Lock())


def _clear(directory: Path) -> None:
    """Unmount whatever a container's directory still has mounted (its overlay, its
    checkpoint mounts, its lazy image: those of a mount no connection is known for) and
    remove it."""
    unmount(directory / "rootfs")
    unmount(directory / "meta")
    checkpoints = directory / "checkpoints"
    for target in sorted(checkpoints.iterdir()) if checkpoints.is_dir() else ():
        unmount(target)
    unmount(directory / "lower")
    shutil.rmtree(directory, ignore_errors=True)
