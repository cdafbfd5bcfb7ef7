"""The containers' lazy roots, owned by the agent: mounted, watched, remounted, released.

For each container the runtime shim or the OCI hook asks about (:mod:`bootseer.agents.mountapi`),
the agent starts one FUSE server process for the lazy image (prefetching its hot list,
recording a young one), puts an overlay with a fresh writable layer over it, and hands
back the overlay as the container's root. Everything about a container lives in one
directory, ``<cache_dir>/containers/<key>/`` (the key is the container's id qualified by
its engine's namespace, :func:`bootseer.agents.mountapi.mount_key`)::

    lower/    the lazy image (FUSE)          upper/, work/  the overlay's writable layer
    rootfs/   the overlay: the container's root
    signal/   bound at /run/bootseer in the container: ready file, phase marks
    state.json  what a restarted agent needs to adopt the mount

The agent mounts each FUSE connection itself (:func:`bootseer.fuse.connection.mount_fd`):
the image's and each checkpoint directory's, and keeps their /dev/fuse files; a server
process serves a clone of each. That is what makes a mount
outlive its server: a server that dies is seen by the watcher within
:data:`WATCH_INTERVAL` and replaced by one that takes the connection over. Only the
requests the dead server had read and not answered fail (``ECONNABORTED``; page reads
are retried by the kernel); those still queued are answered by the new server, so the
running container reads on. Servers are processes of their own session, so an agent
that dies or restarts leaves containers served; the next agent adopts them from
``state.json`` and takes its copy of the connection's file back from the server
(``pidfd_getfd``), so it can replace that server too.

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
import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bootseer.agents.mountapi import ContainerMount, MountRequest, check_id
from bootseer.agents.policy import RecordingPolicy
from bootseer.agents.priority import Priority, PriorityGate
from bootseer.agents.spare import SparePool
from bootseer.agents.timeline import StartRecord, container_phases
from bootseer.config import Config
from bootseer.errors import BootseerError
from bootseer.fuse.connection import mount_fd
from bootseer.jsonfile import write_json
from bootseer.mounts import is_mounted, unmount, wait_for_file
from bootseer.ready import READY_FILE_ENV, SIGNAL_DIR
from bootseer.snapshot.key import IMAGE_ID_ENV
from bootseer.store.local import pid_alive

log = logging.getLogger(__name__)

#: Seconds between two looks at every server (is it alive, how far is its prefetch).
WATCH_INTERVAL = 0.5

class UnknownMount(BootseerError):
    """No container of that id has a mount here."""


class MountMismatch(BootseerError):
    """A release named a mount whose root is not the one the engine ran the container on."""


@dataclass
class _Mounted:
    """One container's mount as the agent tracks it (persisted as ``state.json``)."""

    request: MountRequest
    mount: ContainerMount
    pid: int  # the FUSE server
    server_fd: int  # the connection's /dev/fuse file, by its number in the server
    created: float
    server_deaths: int = 0
    failed: bool = False  # the server died and could not be replaced
    #: The FUSE server of each checkpoint mount, by name (``bootseer ckpt mount``).
    checkpoints: dict[str, _Server] = field(default_factory=dict)
    #: The signal directory's mtime at the watcher's last look (not kept in state.json:
    #: a new agent looks again, and a phase's first time wins).
    signal_mtime: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"request": self.request.to_json(), "mount": self.mount.to_json(),
                "pid": self.pid, "server_fd": self.server_fd, "created": self.created,
                "server_deaths": self.server_deaths, "failed": self.failed,
                "checkpoints": {name: asdict(server)
                                for name, server in self.checkpoints.items()}}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> _Mounted:
        return cls(MountRequest.from_json(body["request"]),
                   ContainerMount.from_json(body["mount"]), int(body["pid"]),
                   int(body["server_fd"]), float(body["created"]),
                   int(body.get("server_deaths", 0)), bool(body.get("failed")),
                   {str(name): _Server(**server)
                    for name, server in (body.get("checkpoints") or {}).items()})


@dataclass
class _Server:
    """A checkpoint mount's server, as the agent tracks it."""

    pid: int
    fd: int  # the connection's /dev/fuse file, by its number in the server (and here)
    deaths: int = 0
    failed: bool = False


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
        #: Whether the image servers of a job's containers read packs through the agent's
        #: swarm (p2p on): ``--peer-job``.
        self.peer_reads = peer_reads
        self.gate = gate or PriorityGate()
        self._claims: dict[str, _Claims] = {}
        self.recording = RecordingPolicy.from_config(config)
        self.root = config.cache_dir / "containers"
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # also when an older agent made it 0755
        self._record = record  # into the timeline (and the metrics): the agent's
        self._mounts: dict[str, _Mounted] = {}
        self._fds: dict[str, int] = {}  # this agent's copy of each connection's file
        #: The same for each checkpoint mount, by (mount key, name).
        self._checkpoint_fds: dict[tuple[str, str], int] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        #: How servers run Bootseer: this agent's store (and its cache, by environment).
        self._bootseer = [sys.executable, "-m", "bootseer", "--store", config.store]
        self._server_env = {**os.environ, "BOOTSEER_CACHE_DIR": str(config.cache_dir)}
        #: Servers started ahead of need; filled by :meth:`start_spares`.
        self.spares = SparePool(self._bootseer, self._server_env,
                                config.cache_dir / "logs" / "spare-servers.log", spare_servers)

    def start_spares(self) -> None:
        """Start the spare servers (in the background: the first mounts do not wait)."""
        threading.Thread(target=self.spares.fill, name="spares", daemon=True).start()

    # -- the API ---------------------------------------------------------------------

    def mount(self, request: MountRequest) -> ContainerMount:
        """The container's root: mounted now, or the one it already has."""
        key = request.key
        with self._lock_for(key):
            if key in self._mounts:
                return self._mounts[key].mount
            created = time.time()
            mounted, fd = self._mount(request, created)
            try:
                self._mounts[key] = mounted
                self._fds[key] = fd
                self._save(mounted)
                self._record(StartRecord(key, job=request.job, image=request.image,
                                         workload=request.workload, runtime=request.runtime,
                                         phases={"created": created,
                                                 "image_ready": time.time()}))
            except BaseException:  # nothing of a refused mount stays behind
                self._mounts.pop(key, None)
                self._fds.pop(key, None)
                self._teardown(self.root / key, mounted.pid, fd)
                raise
            claims = self._claims[key] = _Claims(self.gate)
            claims.set(Priority.STARTING, True)  # until the watcher sees the prefetch end
        return mounted.mount

    def release(self, container_id: str, exit_code: int | None = None,
                rootfs: str | None = None) -> StartRecord:
        """The container stopped: unmount, let the server store its recording, and
        complete the start's record. ``rootfs``, the root the engine ran the container
        on, must be this mount's when given: proof from the engine's own state that the
        caller releases the container's own mount."""
        check_id(container_id)
        with self._lock_for(container_id):
            mounted = self._mounts.get(container_id)
            if mounted is None:
                raise UnknownMount(f"no container {container_id} has a mount here")
            if rootfs is not None and os.path.normpath(rootfs) != mounted.mount.rootfs:
                raise MountMismatch(f"container {container_id}'s root is not {rootfs}: "
                                    f"not releasing another container's mount")
            del self._mounts[container_id]
            claims = self._claims.pop(container_id, None)
            if claims is not None:
                claims.clear()
            directory = self.root / container_id
            exited = time.time()
            fd = self._fds.pop(container_id, None)
            if fd is not None and not pid_alive(mounted.pid):
                os.close(fd)  # no server: end the connection, so unmounting cannot wait
                fd = None
            unmount(Path(mounted.mount.rootfs))
            self._unmount_checkpoints(directory, container_id, mounted.checkpoints)
            unmount(directory / "lower")  # the server sees the connection end, reports
            report = self._report(directory, mounted.pid)
            if fd is not None:
                os.close(fd)
            phases = container_phases(directory / "signal", mounted.created, exited)
            phases["exited"] = exited
            detail: dict[str, Any] = {"image": report} if report else {}
            if exit_code is not None:
                detail["exit_code"] = exit_code
            if mounted.server_deaths:
                detail["server_deaths"] = mounted.server_deaths
                detail["server_failed"] = mounted.failed
            restarts = sum(server.deaths for server in mounted.checkpoints.values())
            if restarts:
                detail["checkpoint_server_deaths"] = restarts
            shutil.rmtree(directory, ignore_errors=True)
        with self._lock:
            self._locks.pop(container_id, None)
        return self._record(StartRecord(container_id, phases=phases, detail=detail))

    def list(self) -> list[dict[str, Any]]:
        with self._lock:
            mounts = list(self._mounts.values())
        return [{"id": m.request.key, "container": m.request.id, "image": m.request.image,
                 "rootfs": m.mount.rootfs,
                 "pid": m.pid, "serving": pid_alive(m.pid), "created": m.created,
                 "server_deaths": m.server_deaths, "failed": m.failed,
                 "checkpoints": {name: {"pid": server.pid, "serving": pid_alive(server.pid),
                                        "server_deaths": server.deaths,
                                        "failed": server.failed}
                                 for name, server in m.checkpoints.items()}}
                for m in mounts]

    # -- lifecycle ---------------------------------------------------------------------

    def adopt(self) -> None:
        """After an agent restart: take over the mounts a previous agent left serving;
        clear what is left of containers whose mounts are gone."""
        for state in sorted(self.root.glob("*/state.json")):
            try:
                mounted = _Mounted.from_json(json.loads(state.read_text()))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring %s: %s", state, exc)
                continue
            if mounted.request.key != state.parent.name:
                log.warning("ignoring %s: it describes container %s", state,
                            mounted.request.key)
                continue
            if is_mounted(Path(mounted.mount.rootfs)):
                fd = _take_fd(mounted.pid, mounted.server_fd) if pid_alive(mounted.pid) else None
                if fd is None:  # server and agent both gone: so is the connection
                    mounted.failed = True
                    log.error("container %s: its mount's server is gone and the connection "
                              "with it; the container's reads of its image fail",
                              mounted.request.key)
                else:
                    self._fds[mounted.request.key] = fd
                for name, server in mounted.checkpoints.items():
                    taken = _take_fd(server.pid, server.fd) if pid_alive(server.pid) else None
                    if taken is None:
                        server.failed = True
                        log.error("container %s: checkpoint mount %s lost its server and "
                                  "its connection", mounted.request.key, name)
                    else:
                        self._checkpoint_fds[(mounted.request.key, name)] = taken
                self._mounts[mounted.request.key] = mounted
                log.info("adopted container %s's mount (server pid %d)", mounted.request.key,
                         mounted.pid)
            else:
                log.info("container %s's mount is gone: removing its directory",
                         mounted.request.key)
                self._unmount_checkpoints(state.parent, mounted.request.key, {})
                unmount(state.parent / "lower")
                shutil.rmtree(state.parent, ignore_errors=True)

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
            mounts = list(self._mounts.values())
        for mounted in mounts:
            _reap(mounted.pid)
            alive = pid_alive(mounted.pid)
            self._claim(mounted, alive)
            self._report_phases(mounted)
            if not alive and not mounted.failed:
                self._replace_server(mounted)
            for name, server in list(mounted.checkpoints.items()):
                _reap(server.pid)
                if not pid_alive(server.pid) and not server.failed:
                    self._replace_checkpoint_server(mounted, name)

    def _report_phases(self, mounted: _Mounted) -> None:
        """Record the phases the workload marked since the last look (when the signal
        directory changed), so a running start's timeline, and its job's report, show
        them before the container exits."""
        signal = self.root / mounted.request.key / "signal"
        try:
            mtime = signal.stat().st_mtime
        except OSError:
            return  # released meanwhile
        if mtime == mounted.signal_mtime:
            return
        mounted.signal_mtime = mtime
        phases = container_phases(signal, mounted.created, time.time())
        if phases:
            self._record(StartRecord(mounted.request.key, phases=phases))

    def _replace_checkpoint_server(self, mounted: _Mounted, name: str) -> None:
        """A checkpoint mount's server died: start one that takes its connection over.
        Reads the dead server had taken fail (``ECONNABORTED``); files stay open, and the
        new server re-creates their readers on their next read."""
        container_id = mounted.request.key
        with self._lock_for(container_id):
            server = mounted.checkpoints.get(name)
            if self._mounts.get(container_id) is not mounted or server is None or \
                    pid_alive(server.pid):
                return  # released, or replaced, meanwhile
            server.deaths += 1
            fd = self._checkpoint_fds.get((container_id, name))
            try:
                if fd is None:
                    raise BootseerError("the connection is gone")
                server.pid, server.fd = self._start_checkpoint_server(
                    mounted.request, self.root / container_id, name, fd, takeover=True)
                log.warning("container %s: the server of checkpoint mount %s died; pid %d "
                            "took its connection over", container_id, name, server.pid)
            except (BootseerError, OSError) as exc:
                server.failed = True
                log.error("container %s: the server of checkpoint mount %s died and cannot "
                          "be replaced: %s", container_id, name, exc)
            self._save(mounted)

    def _replace_server(self, mounted: _Mounted) -> None:
        """A server died: start one that takes its connection over."""
        container_id = mounted.request.key
        with self._lock_for(container_id):
            if self._mounts.get(container_id) is not mounted or pid_alive(mounted.pid):
                return  # released meanwhile
            mounted.server_deaths += 1
            directory = self.root / container_id
            fd = self._fds.get(container_id)
            try:
                if fd is None or not is_mounted(directory / "lower"):
                    raise BootseerError("the connection is gone")
                mounted.pid, mounted.server_fd = self._start_server(
                    mounted.request, directory, fd, takeover=True)
                log.warning("container %s: the FUSE server of image %s died; pid %d took "
                            "its connection over", container_id, mounted.request.image,
                            mounted.pid)
            except (BootseerError, OSError) as exc:
                mounted.failed = True
                log.error("container %s: the FUSE server of image %s died and cannot be "
                          "replaced: %s", container_id, mounted.request.image, exc)
            self._save(mounted)

    def _claim(self, mounted: _Mounted, alive: bool) -> None:
        """Hold the priorities the mount's server needs now, from its statistics file."""
        from bootseer.prefetch.session import MountStats, stats_path

        claims = self._claims.setdefault(mounted.request.key, _Claims(self.gate))
        if not alive:
            claims.clear()
            return
        try:
            stats = MountStats.load(stats_path(self.config.cache_dir,
                                               self.root / mounted.request.key / "lower"))
        except (OSError, ValueError, TypeError):
            return  # not written yet: keep what is held
        claims.set(Priority.STARTING, stats.prefetch is not None and not stats.prefetch.done)
        fetches = stats.reads.fetch_requests
        claims.set(Priority.DEMAND, fetches > claims.demand_fetches)
        claims.demand_fetches = fetches

    # -- the work ------------------------------------------------------------------------

    def _mount(self, request: MountRequest, created: float) -> tuple[_Mounted, int]:
        """The container's mounts and the server; also the connection's file."""
        from bootseer.prefetch.container import mount_overlay
        from bootseer.prefetch.session import MountInfo

        directory = self.root / request.key
        if directory.exists():  # a failed earlier attempt: start clean
            self._teardown(directory, None, None)
        directory.mkdir(mode=0o700)
        parts = {name: directory / name for name in ("lower", "upper", "work", "rootfs",
                                                      "signal")}
        for path in parts.values():
            path.mkdir()
        fd = pid = None
        try:
            fd = mount_fd(parts["lower"], "bootseer-image")
            pid, server_fd = self._start_server(request, directory, fd, takeover=False)
            info = MountInfo.load(directory / "info.json")
            mount_overlay(parts["lower"], parts["upper"], parts["work"], parts["rootfs"])
            checkpoints = self._mount_checkpoints(request, directory)
            image_config = info.config.get("config") or {}
            if not isinstance(image_config, dict):
                raise BootseerError(f"image {request.image}: its config is not an object")
            mount = ContainerMount(
                id=request.key, image=request.image, image_id=info.image_id,
                rootfs=str(parts["rootfs"]), signal_dir=str(parts["signal"]),
                env={READY_FILE_ENV: f"{SIGNAL_DIR}/ready", IMAGE_ID_ENV: info.image_id},
                image_config=image_config, recording=info.recording,
                checkpoints_dir=str(directory / "checkpoints") if request.checkpoints
                else None)
        except BaseException:
            self._teardown(directory, pid, fd)
            raise
        return _Mounted(request, mount, pid, server_fd, created, checkpoints=checkpoints), fd

    def _teardown(self, directory: Path, pid: int | None, fd: int | None) -> None:
        """Remove every mount and file of a container that must not stay (a refused or
        failed mount). The server exits when it sees its mount go; it is waited for
        (killed after :data:`TEARDOWN_WAIT`), because it writes its report into the
        directory on the way out."""
        if fd is not None:  # first: with no server left, this ends the connection, and
            os.close(fd)  # the unmount cannot wait for a server that never comes
        unmount(directory / "rootfs")
        self._unmount_checkpoints(directory, directory.name, {})
        unmount(directory / "lower")
        if pid is not None:
            _wait_or_kill(pid, TEARDOWN_WAIT)
        shutil.rmtree(directory, ignore_errors=True)

    def _mount_checkpoints(self, request: MountRequest, directory: Path) -> dict[str, _Server]:
        """One striped checkpoint mount per name under ``checkpoints/``, each a connection
        this agent holds, served like the image's (a dead server is replaced in place)."""
        if not request.checkpoints:
            return {}
        (directory / "checkpoints").mkdir()
        servers: dict[str, _Server] = {}
        try:
            for name, url in request.checkpoints.items():
                target = directory / "checkpoints" / name
                target.mkdir()
                fd = mount_fd(target, f"bootseer:{url}")
                self._checkpoint_fds[(request.key, name)] = fd
                servers[name] = _Server(
                    *self._start_checkpoint_server(request, directory, name, fd,
                                                   takeover=False))
        except BaseException:
            self._unmount_checkpoints(directory, request.key, servers)
            raise
        return servers

    def _start_checkpoint_server(self, request: MountRequest, directory: Path, name: str,
                                 fd: int, *, takeover: bool) -> tuple[int, int]:
        """A server for checkpoint mount ``name``; the first one is waited for until it
        has listed the store directory. A job's server reads through the job's peers."""
        from bootseer.stripedfs.server import ServerOptions

        cfg = self.config.checkpoint
        ready = directory / f"checkpoint-{name}.ready"
        url = request.checkpoints[name]
        peers = self.peer_reads and request.job is not None
        options = ServerOptions(mode=cfg.mount_mode, memory=cfg.mount_memory, fuse_fd=fd,
                                takeover_state=directory / f"checkpoint-{name}.fuse.json",
                                ready_file=ready, peer_job=request.job if peers else None,
                                agent_socket=self.config.agent.socket if peers else None)
        argv = options.argv(self._bootseer, url, directory / "checkpoints" / name)
        return self._spawn(argv, directory / f"checkpoint-{name}.log", fd,
                           None if takeover else ready, f"checkpoint {url}")

    def _unmount_checkpoints(self, directory: Path, key: str,
                             servers: dict[str, _Server]) -> None:
        """Unmount every checkpoint mount (a connection without a live server is closed
        first, so the unmount cannot wait for it) and let the servers go."""
        base = directory / "checkpoints"
        names = {target.name for target in base.iterdir()} if base.is_dir() else set()
        for name in sorted(names | set(servers)):
            fd = self._checkpoint_fds.pop((key, name), None)
            server = servers.get(name)
            if fd is not None and (server is None or not pid_alive(server.pid)):
                os.close(fd)
                fd = None
            unmount(directory / "checkpoints" / name)
            if fd is not None:
                os.close(fd)
            if server is not None:
                _wait_or_kill(server.pid, TEARDOWN_WAIT)

    def _start_server(self, request: MountRequest, directory: Path, fd: int, *,
                      takeover: bool) -> tuple[int, int]:
        """A FUSE server for the image connection of ``fd``; the first one (not
        ``takeover``) is waited for until it has loaded the image (``info.json``). A
        server that takes over never records (the start's first reads went unseen)."""
        from bootseer.prefetch.recording import ReadyWhen
        from bootseer.prefetch.session import SessionOptions

        cfg = self.config.image
        mode = self.recording.effective(request.image, request.record, request.runtime)
        record = None
        if not takeover and mode != "never":
            record = ReadyWhen(directory / "signal" / "ready", None, cfg.record_timeout)
        options = SessionOptions(
            workload=request.workload, prefetch=cfg.prefetch, record=record,
            record_auto=mode == "auto", info=directory / "info.json",
            report=directory / "report.json", fuse_fd=fd,
            takeover_state=directory / "fuse.json",
            peer_job=request.job if self.peer_reads else None,
            agent_socket=self.config.agent.socket if self.peer_reads and request.job else None)
        argv = options.argv(self._bootseer, request.image, directory / "lower")
        return self._spawn(argv, directory / "server.log", fd,
                           None if takeover else directory / "info.json",
                           f"image {request.image}")

    def _spawn(self, argv: list[str], log_path: Path, fd: int, ready: Path | None,
               what: str) -> tuple[int, int]:
        """Start a server process of its own session serving connection ``fd`` (a spare,
        if one is there, for a first server: one with ``ready``); wait until it creates
        ``ready`` (if given), failing with its log's tail if it exits. Its pid, and the
        connection's number in it."""
        log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW |
                         os.O_CLOEXEC, 0o600)
        with open(log_fd, "ab") as log_file:
            spare = self.spares.take() if ready is not None else None
            server_fd = spare.hand_over(argv[3:], fd, log_fd, SERVER_START_TIMEOUT) \
                if spare is not None else None  # argv[3:]: past `python -m bootseer`
            if spare is not None and server_fd is not None:
                child = spare.process
            else:
                server_fd = fd
                child = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                    start_new_session=True, pass_fds=(fd,), env=self._server_env)
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while ready is not None and not ready.exists():
            if child.poll() is not None or time.monotonic() > deadline:
                child.kill()
                child.wait()
                log_text = log_path.read_text(errors="replace")
                raise BootseerError(f"the mount server of {what} failed: "
                                    f"{log_text.strip()[-800:]}")
            time.sleep(0.01)
        return child.pid, server_fd

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
            _reap(pid)

    def _save(self, mounted: _Mounted) -> None:
        write_json(self.root / mounted.request.key / "state.json", mounted.to_json(),
                   mode=0o600)

    def _lock_for(self, container_id: str) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(container_id, threading.Lock())


#: Seconds a torn-down mount's server may take to exit before it is killed.
TEARDOWN_WAIT = 30.0
#: Seconds a first server may take to load its image or list its checkpoint directory.
SERVER_START_TIMEOUT = 120.0


def _wait_or_kill(pid: int, timeout: float) -> None:
    """Wait for the server ``pid`` to exit; SIGKILL it after ``timeout`` seconds."""
    deadline, killed = time.monotonic() + timeout, False
    while pid_alive(pid):
        _reap(pid)
        if time.monotonic() > deadline:
            if killed:  # not even SIGKILL ended it: stop waiting, say so
                log.error("server %d did not die after SIGKILL", pid)
                return
            log.warning("server %d did not exit within %.0f s; killing it", pid, timeout)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline, killed = time.monotonic() + 5.0, True
        time.sleep(0.02)
    _reap(pid)


def _take_fd(pid: int, number: int) -> int | None:
    """A copy of file ``number`` of process ``pid`` (``pidfd_getfd``, Linux 5.6), if it is
    a FUSE connection: how a restarted agent gets back the connection of a mount it
    adopts. None if the process or the file is gone."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        fd = ctypes.CDLL(None, use_errno=True).syscall(_SYS_PIDFD_GETFD, pidfd, number, 0)
        if fd < 0:
            log.warning("pidfd_getfd(%d, %d): %s", pid, number,
                        os.strerror(ctypes.get_errno()))
            return None
        if os.readlink(f"/proc/self/fd/{fd}") != "/dev/fuse":
            os.close(fd)
            return None
        return fd
    finally:
        os.close(pidfd)


_SYS_PIDFD_GETFD = 438  # x86_64 and aarch64 alike (the unified syscall table)


def _reap(pid: int) -> None:
    """Collect a server that was this agent's child and has exited (no zombies)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass

