"""Configuration: defaults < TOML files < ``BOOTSEER_*`` environment < command-line flags.

Every setting is declared once, in the dataclasses below, with its type and default. A
value remembers where it came from (``default``, a file path, an environment variable, a
flag) so ``bootseer config show`` can answer "why is it set to that?", and a bad value is
reported with that origin and the key, e.g. ``/etc/bootseer/config.toml: hdfs.replication:
expected an integer, got 'three'``.

Files read, in order (later wins): ``/etc/bootseer/config.toml``, the user's
``config.toml`` in ``platformdirs.user_config_dir("bootseer")``, then the file named by
``--config`` or ``BOOTSEER_CONFIG``. The environment variable for ``hdfs.block_size`` is
``BOOTSEER_HDFS_BLOCK_SIZE``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

from bootseer.errors import ConfigError
from bootseer.units import parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SYSTEM_CONFIG = Path("/etc/bootseer/config.toml")
ENV_PREFIX = "BOOTSEER_"


def _is_root() -> bool:
    return os.geteuid() == 0


def default_store_url() -> str:
    """Root keeps the node's store in /var/lib; a user keeps theirs in their data dir."""
    if _is_root():
        return "file:///var/lib/bootseer/store"
    return Path(platformdirs.user_data_dir("bootseer"), "store").as_uri()


def default_cache_dir() -> Path:
    if _is_root():
        return Path("/var/cache/bootseer")
    return Path(platformdirs.user_cache_dir("bootseer"))


#: The node agent's socket when it runs as root (systemd unit, DaemonSet), where the runtime
#: shim and the hook (root) look by default.
ROOT_AGENT_SOCKET = Path("/run/bootseer/agent.sock")


def default_agent_socket() -> Path:
    if _is_root():
        return ROOT_AGENT_SOCKET
    return Path(platformdirs.user_runtime_dir("bootseer")) / "agent.sock"


class ByteSize(int):
    """An int that config files may write as ``"64m"`` or ``"1GiB"``."""


class FileMode(int):
    """Permission bits; files and variables write them in octal (``"0444"`` or ``0o444``)."""


#: A list of strings: a TOML array, or a comma-separated ``BOOTSEER_*`` variable.
Strings = tuple[str, ...]


@dataclass
class HdfsConfig:
    """Options for the ``hdfs://`` and ``webhdfs://`` store backends."""

    user: str | None = None  # HDFS user to act as; None = the current user
    replication: int | None = None  # replication of new files; None = the cluster default
    block_size: ByteSize | None = None  # block size of new files; None = the cluster default
    kerberos: bool = False  # authenticate with Kerberos (webhdfs://: needs requests-kerberos)


@dataclass
class ImageConfig:
    """Options for lazy images on this node."""

    cache_size: ByteSize = ByteSize(10 << 30)  # local block cache cap (LRU beyond it)
    prefetch: bool = True  # prefetch a mounted image's hot list, if it has one
    #: Prefetch reads in flight, and bytes per prefetch read at most; unset: the defaults
    #: of :class:`bootseer.prefetch.config.PrefetchConfig`, where each is explained.
    prefetch_concurrency: int | None = None
    prefetch_request_size: ByteSize | None = None
    record_timeout: float = 300.0  # seconds after which a recording ends, ready or not
    #: Images (name prefixes; "*" for all) whose container starts may record the shared
    #: hot list, or force ``record=always``. A hot list steers every later start of the
    #: image on every node, so writing it is the operator's grant, not a container's
    #: choice: by default no container records (``bootseer image run`` still does).
    record_images: Strings = ()
    #: Files kept whole on the node (``warm`` makes the files it stages whole) are read
    #: by the kernel itself, not through the mount's server (FUSE passthrough: Linux 6.9
    #: or later, root-run servers; anything else serves every read as before).
    passthrough: bool = True
    #: A container's root names its image's files through a metadata image the kernel
    #: reads (EROFS, built by ``warm`` beside the whole files: Linux 6.12 and
    #: erofs-utils), its data from the whole files or the mount's server: no lookup or
    #: open reaches Python (:mod:`bootseer.prefetch.metaimage`). Needs ``passthrough``.
    kernel_metadata: bool = True


def default_snapshot_concurrency() -> int:
    """Shards packed or restored at once unless configured (see ``snapshot.concurrency``)."""
    return min(8, os.cpu_count() or 2)


@dataclass
class SnapshotConfig:
    """Options for dependency snapshots (``bootseer env``)."""

    shard_size: ByteSize = ByteSize(32 << 20)  # content bytes per shard (restored in parallel)
    #: zstd level of the shards. A snapshot is packed once and restored on every node at
    #: every restart, which reads it at the link's speed whatever the level (decompressing
    #: costs the same): level 9 makes the bench environment 13% fewer bytes than level 3
    #: (1.54 GB -> 337 MB, not 387) and the CUDA one 5% (5.76 -> 2.69 GB, not 2.84), for
    #: 4-5x the packing CPU (78 s instead of 14 for the CUDA one).
    compression_level: int = 9
    #: Shards packed (threads) or restored (forked workers, ``PROCESSES`` in
    #: bootseer.snapshot.restore) at once: one per core, at most 8. A restore's worker
    #: decompresses and writes files, which is CPU work; the link is kept busy by shard
    #: streams opened ahead of the workers (``OPEN_AHEAD``), not by more of them.
    #: bench-env on 2 cores, full preset from local disk: 1, 2, 4 and 8 workers 4.2, 2.9,
    #: 3.1 and 3.2 s; over HDFS at 100 MB/s, threads alternated: 2 took 4.73 s and
    #: 5.5-6.3 s of CPU, 4 took 4.76 s and 6.8 s.
    concurrency: int = field(default_factory=default_snapshot_concurrency)
    bytecode: bool = True  # compile captured .py files before snapshotting
    cache_size: ByteSize = ByteSize(20 << 30)  # shards staged by `warm --env` (LRU beyond)
    #: As root, a restore where the snapshot was captured mounts it, unpacked once on the
    #: node (an overlay per target, writes in a private upper layer), instead of writing
    #: every file again; a warm as root unpacks it (bootseer.snapshot.mount). Off: every
    #: restore extracts.
    mount: bool = True


@dataclass
class CheckpointConfig:
    """Checkpoints staged on this node by ``bootseer warm --checkpoint``."""

    cache_size: ByteSize = ByteSize(50 << 30)  # local checkpoint copies cap (LRU beyond it)
    #: Ranged reads in flight per checkpoint file while staging: enough to keep several
    #: DataNodes streaming, few enough to leave the link to a start happening meanwhile.
    stage_concurrency: int = 8
    #: Checkpoint URL prefixes (``hdfs://nn:8020/ckpt/``) that containers may mount and
    #: ``warm --checkpoint`` may stage through the agent. A request for anything else is
    #: refused. ``file://`` is allowed only under a prefix listed here. Empty: none.
    allowed: Strings = ()
    #: The widest permission bits a checkpoint mount shows (the store's own bits are shown
    #: where it has them, narrowed by this; where it has none, exactly this).
    mount_mode: FileMode = FileMode(0o444)
    #: Memory of one checkpoint-mount server for fetched and in-flight stripes, across all
    #: its open files: a FUSE server is a root process outside the container's cgroup.
    mount_memory: ByteSize = ByteSize(512 << 20)
    #: The striped reader's knobs, for every checkpoint read of this node (mounts, the
    #: checkpoint API, ``ckpt get``); each is explained, with its default, where it is
    #: declared: :class:`bootseer.stripedfs.config.StripeConfig`. Unset: that default.
    #: (``max_memory`` is a reading process's; a mount's server uses ``mount_memory``.)
    stripe_size: ByteSize | None = None
    max_concurrent_fetches: int | None = None
    max_concurrent_local_reads: int | None = None
    initial_read_window: ByteSize | None = None
    sequential_window_multiplier: int | None = None
    max_read_window: ByteSize | None = None
    max_forward_seek_distance: ByteSize | None = None
    max_backward_seek_distance: ByteSize | None = None
    max_memory: ByteSize | None = None
    max_attempts: int | None = None
    retry_initial_delay: float | None = None


@dataclass
class AgentConfig:
    """Where the node agent listens (``bootseer agent``), and where clients look for it."""

    socket: Path = field(default_factory=default_agent_socket)
    group: str = "bootseer"  # the socket's group (mode 0660), if the group exists
    metrics_listen: str = ""  # "host:port" to also serve /metrics on TCP; "" = socket only
    #: This node's name in job reports (``jobs/<job>/starts/<node>/`` in the store); "":
    #: the host name.
    node_name: str = ""
    #: Mount servers kept started ahead of need (:mod:`bootseer.agents.spare`): each takes
    #: a second or two of CPU (interpreter, imports, the store's connection) off a container's
    #: start. A mount uses one per server (the image's, one per checkpoint directory).
    spare_servers: int = 2
    #: Jobs (name prefixes; "*" for all) a container may join with ``io.bootseer.job``:
    #: a job's report and its peers' swarm are shared by every node of it, so joining one
    #: is the operator's grant (as the pod's annotation, never the image's ``ENV``). By
    #: default no container names a job (``bootseer image run`` and root's warms do).
    jobs: Strings = ()
    #: A cgroup (e.g. ``/bootseer-servers``) the mounts' servers move into as they start,
    #: in every hierarchy under :attr:`cgroup_root` (:mod:`bootseer.agents.cgroups`): where
    #: the agent's own cgroup is killed whole when it stops (a DaemonSet's container), so
    #: that running containers keep their roots and the next agent adopts them. "": they
    #: stay in the agent's (systemd's ``KillMode=process`` spares them).
    servers_cgroup: str = ""
    cgroup_root: Path = Path("/sys/fs/cgroup")  # a DaemonSet: the host's, by a hostPath


@dataclass
class P2PConfig:
    """Peer-to-peer fan-out between the nodes of a job (``bootseer.p2p``).

    When a thousand nodes restart together, each needs the same bytes; fetched from the
    store one by one, the store serves them a thousand times. With this on, a node takes
    from the store only its share of an object's pieces and the rest from the other nodes,
    every piece checked against hashes the store vouches for.
    """

    #: The off switch: false (the default) means no peer session, nothing listens, and
    #: every read is a plain store read exactly as without this feature.
    enabled: bool = False
    #: "address:port" this node's peer session listens on and announces to its job
    #: ("198.18.64.2:6881", "[fd00::2]:6881"; port 0: any free port). An address, not
    #: 0.0.0.0: peers must be told where to connect, and a node should not answer on
    #: every network it is on.
    listen: str = ""
    #: Cap on the bytes per second this node uploads to peers (0: no cap). Peers share
    #: the training job's network; the cap keeps fan-out from crowding out its traffic.
    upload_rate: ByteSize = ByteSize(0)
    #: Seconds an object stays seeded after this node has it (the agent also stops
    #: seeding when the job has started): nodes that start late still find it, and a
    #: training job does not upload for ever. 0: never seed.
    seed_time: float = 600.0
    #: Seconds this node keeps seeding once a container has started on it: the job's
    #: late nodes still find what it has, then its uploads stop and leave the network to
    #: training (and checkpoint saves). Shortens seed_time, never lengthens it.
    seed_after_start: float = 30.0
    #: Seconds a demand read (a container's lazy read of an image pack, served through
    #: the agent) waits for a piece another node of the job is reading from the store,
    #: before reading it itself: longer saves store reads, shorter bounds a read's wait.
    demand_wait: float = 0.5
    #: Seconds a piece that no peer has, and whose owner is gone or makes no progress,
    #: waits before this node reads it from the store. Shorter: a dead peer costs less
    #: time; longer: a slow peer costs fewer extra store reads.
    piece_grace: float = 2.0
    #: Seconds a whole-object fetch waits for a member that is up (connected to this node
    #: for another of the job's objects) but has not opened this object yet, before its
    #: share of the store reads goes to the others (a piece_grace later): a job's nodes
    #: reach each object at different times. Longer: fewer pieces read twice from the
    #: store; shorter: an early node waits less for a late one's share. Nodes with CPUs
    #: of their own reach an object within a second or two of each other, so a member
    #: later than that is slow, and costs the others 2 s and a grace, not 10 (single runs
    #: of 4 lab nodes at 0.1 core each: job warm 31-35 s at 10 s, 26-28 s at 2 s; three
    #: runs of bench-restart at 2 s, 33-35 s, within the spread of the runs at 10 s).
    late_member_wait: float = 2.0
    #: The cluster's peer key, the same on every node (root's alone, mode 0600, at least
    #: 32 random bytes: ``head -c 32 /dev/urandom``): only holders connect to a node's
    #: swarm, and only records it authenticates (members, piece hashes) are believed.
    #: A store writer, a container or a local user holds none.
    key_file: Path = Path("/etc/bootseer/p2p.key")
    #: The networks peers are on (CIDRs, "198.18.0.0/15"): the swarm dials and answers
    #: addresses in them only, never loopback, link-local, multicast or unspecified ones.
    #: Required with ``enabled``.
    networks: Strings = ()
    #: Checkpoint URL prefixes whose files may be shared between a job's nodes (each
    #: file also readable by every user at its source). Empty (the default): checkpoints
    #: are always read from the store, never served to peers.
    checkpoints: Strings = ()


@dataclass
class Config:
    """Everything Bootseer reads from its configuration."""

    store: str = field(default_factory=default_store_url)  # URL of the store
    cache_dir: Path = field(default_factory=default_cache_dir)  # node-local caches
    log_level: str = "warning"  # debug, info, warning, error
    hdfs: HdfsConfig = field(default_factory=HdfsConfig)
    image: ImageConfig = field(default_factory=ImageConfig)
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    p2p: P2PConfig = field(default_factory=P2PConfig)

    def get(self, key: str) -> Any:
        node: Any = self
        for part in key.split("."):
            node = getattr(node, part)
        return node


@dataclass(frozen=True)
class Setting:
    key: str  # dotted, e.g. "hdfs.replication"
    type: Any
    value: Any
    source: str  # "default", a file path, "env BOOTSEER_X" or "flag --x"


@dataclass
class LoadedConfig:
    """The effective config plus, for each key, where its value came from."""

    config: Config
    sources: dict[str, str]

    def settings(self) -> list[Setting]:
        return [Setting(k, t, self.config.get(k), self.sources[k]) for k, t in _fields(Config)]


def _fields(cls: type, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    hints = typing.get_type_hints(cls, globals())
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            out.extend(_fields(kind, f"{prefix}{f.name}."))
        else:
            out.append((prefix + f.name, kind))
    return out


def env_name(key: str) -> str:
    return ENV_PREFIX + key.replace(".", "_").upper()


def coerce(kind: Any, raw: Any, key: str, origin: str) -> Any:
    """Convert a TOML value or an environment string to the declared type."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType) and type(None) in args:
        if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "none")):
            return None
        kind = next(a for a in args if a is not type(None))
    try:
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if kind is ByteSize:
            return ByteSize(parse_size(raw))
        if kind is FileMode:
            mode = raw if isinstance(raw, int) and not isinstance(raw, bool) \
                else int(str(raw).strip().removeprefix("0o"), 8)
            if not 0 <= mode <= 0o777:
                raise ValueError
            return FileMode(mode)
        if kind is int:
            if isinstance(raw, bool):
                raise ValueError
            return int(raw)
        if kind is float:
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)
        if kind is Path:
            return Path(os.path.expanduser(str(raw)))
        if kind == Strings:
            items = raw.split(",") if isinstance(raw, str) else raw
            if not isinstance(items, list | tuple) or \
                    not all(isinstance(i, str) for i in items):
                raise ValueError
            return tuple(i.strip() for i in items if i.strip())
        if kind is str:
            if not isinstance(raw, str):
                raise ValueError
            return raw
    except ValueError:
        pass
    else:
        raise AssertionError(f"unsupported config type {kind} for {key}")
    expected = {bool: "true or false", int: "an integer", float: "a number",
                ByteSize: "a size like 64m", str: "a string", Strings: "a list of strings",
                FileMode: "octal permission bits"}.get(kind, str(kind))
    raise ConfigError(f"{origin}: {key}: expected {expected}, got {raw!r}")


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in table.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{name}."))
        else:
            out[prefix + name] = value
    return out


def _assign(config: Config, key: str, value: Any) -> None:
    *parents, last = key.split(".")
    node: Any = config
    for part in parents:
        node = getattr(node, part)
    setattr(node, last, value)


def config_files(explicit: Path | None = None) -> list[Path]:
    files = [SYSTEM_CONFIG, Path(platformdirs.user_config_dir("bootseer"), "config.toml")]
    if explicit is not None:
        files.append(explicit)
    return files


def load_config(
    *,
    explicit_file: Path | None = None,
    flags: dict[str, Any] | None = None,
    environ: typing.Mapping[str, str] | None = None,
    files: list[Path] | None = None,
) -> LoadedConfig:
    """Build the effective config from defaults, files, environment and flags."""
    environ = os.environ if environ is None else environ
    if explicit_file is None and environ.get(ENV_PREFIX + "CONFIG"):
        explicit_file = Path(environ[ENV_PREFIX + "CONFIG"])
    kinds = dict(_fields(Config))
    config = Config()
    sources = {key: "default" for key in kinds}

    for path in files if files is not None else config_files(explicit_file):
        try:
            present = path.is_file()
        except OSError as exc:  # a directory on the way this user may not enter
            raise ConfigError(f"{path}: cannot be read: {exc.strerror}") from exc
        if not present:
            if path == explicit_file:
                raise ConfigError(f"config file {path} does not exist")
            continue
        try:
            table = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
        except OSError as exc:
            raise ConfigError(f"{path}: cannot be read: {exc.strerror}") from exc
        for key, raw in _flatten(table).items():
            if key not in kinds:
                raise ConfigError(f"{path}: unknown setting {key!r} "
                                  f"(known: {', '.join(sorted(kinds))})")
            _assign(config, key, coerce(kinds[key], raw, key, str(path)))
            sources[key] = str(path)

    for key, kind in kinds.items():
        name = env_name(key)
        if name in environ:
            _assign(config, key, coerce(kind, environ[name], key, f"env {name}"))
            sources[key] = f"env {name}"

    for key, raw in (flags or {}).items():
        if raw is not None:
            flag = "--" + key.replace("_", "-").replace(".", "-")
            _assign(config, key, coerce(kinds[key], raw, key, f"flag {flag}"))
            sources[key] = f"flag {flag}"
    return LoadedConfig(config, sources)
