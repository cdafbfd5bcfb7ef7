"""FUSE passthrough: a node's reads done by the kernel, from a local backing file.

Once a file's bytes are all on the node, serving its reads from Python only adds a trip
through this process per read; with passthrough (Linux 6.9, ``FUSE_PASSTHROUGH``) the
server names, at OPEN, a local file holding exactly those bytes (registered with
``FUSE_DEV_IOC_BACKING_OPEN``), and the kernel does every read and mmap of that open file
from it, as it would for a local file. A tree offers such files (:meth:`Tree.backing`);
this module decides, registers and remembers, under the kernel's rules:

* **One mode per node.** The kernel fails an open with ``EIO`` when a node's concurrent
  opens mix passthrough and cached reads (or two backing files). So a node's mode is
  decided at its first OPEN on the connection and kept while the connection lives: a
  node the tree could not back then (not whole on the node yet, a recording under way,
  which must see every read) is served by the server until the mount ends. A tree whose
  files can change (a checkpoint directory) names each content a version of its own
  (:meth:`Tree.content_version`), decided afresh: bytes of an old version are never
  served for a new one (an open that would mix versions fails with ``EIO``, never
  stale).
* **Takeover decides the same.** A decision is appended to a log beside the connection's
  takeover state before the OPEN it answers is answered, and a taking-over server reads
  the log back. Its backing ids stay valid: registrations belong to the connection (the
  kernel drops them when it ends), not to the server that made them, and files open in
  passthrough need no server at all. A fresh connection (INIT) starts a fresh log.
* **Who may.** Registering takes ``CAP_SYS_ADMIN``, so only a privileged server asks for
  passthrough in INIT (a fusermount3 mount serves every read itself). The mount's
  ``max_stack_depth`` is 1: backing files must be on a file system that stacks nothing
  (not overlayfs), and an overlay over the mount stays within the kernel's depth of 2.
  A registration the kernel refuses (``ELOOP``, ``EPERM``) is logged once and turns
  passthrough off for the server: its nodes are served as before.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from bootseer.fuse import proto as p
from bootseer.fuse.tree import Tree

log = logging.getLogger(__name__)

#: A decision in the log: node id, content version, backing id (0: served by the server).
_RECORD = struct.Struct("=QQI")
#: Longest log read back: a record per node that was opened (millions of nodes fit).
MAX_LOG_BYTES = 64 << 20
#: What the mount tells the kernel: backing files stack nothing (see the module docstring).
MAX_STACK_DEPTH = 1
CAP_SYS_ADMIN = 21


def may_pass_through() -> bool:
    """Whether this process may register backing files (``CAP_SYS_ADMIN`` in effect)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    except (OSError, ValueError):
        pass
    return False


@dataclass
class PassthroughCounts:
    """What passthrough did on a connection, for a mount's report (the opens it answered
    with a backing file are its requests' ``open_passthrough``)."""

    registered: int = 0  # backing files registered by this server
    served: int = 0  # nodes decided for the server (nothing whole to name, or recording)
    inherited: int = 0  # decisions read back from a predecessor's log
    refused: int = 0  # registrations the kernel refused (passthrough then off)


class Passthrough:
    """The decisions of one connection: (node id, content version) → backing id (0: the
    server reads)."""

    def __init__(self, fd: int, tree: Tree, log_path: Path | None, *, fresh: bool,
                 counts: PassthroughCounts) -> None:
        self.fd, self.tree, self.counts = fd, tree, counts
        self.decisions: dict[tuple[int, int], int] = {}
        self.ids: dict[str, int] = {}  # a backing file's key → its id (shared content)
        self.enabled = True
        self._lock = threading.Lock()
        self._log: int | None = None
        if log_path is not None:
            if not fresh:
                self.decisions = _read_log(log_path)
                counts.inherited = len(self.decisions)
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
            self._log = os.open(log_path, flags | (os.O_TRUNC if fresh else 0), 0o600)
            os.fchmod(self._log, 0o600)  # also a file left from before

    def backing_id(self, ino: int) -> int:
        """The backing id node ``ino``'s opens name, 0 if the server reads it."""
        node = (ino, self.tree.content_version(ino))
        found = self.decisions.get(node)
        if found is not None:
            return found
        with self._lock:
            found = self.decisions.get(node)
            if found is None:
                found = self._decide(ino)
                if self._log is not None:  # before the OPEN is answered: see the docstring
                    os.write(self._log, _RECORD.pack(*node, found))
                self.decisions[node] = found
            return found

    def close(self) -> None:
        if self._log is not None:
            os.close(self._log)
            self._log = None

    def _decide(self, ino: int) -> int:
        backing = self.tree.backing(ino) if self.enabled else None
        if backing is None:
            self.counts.served += 1
            return 0
        try:
            known = self.ids.get(backing.key)
            if known is not None:
                return known
            try:
                # A mutable buffer: ioctl then returns the call's result, the backing id.
                backing_id = fcntl.ioctl(self.fd, p.FUSE_DEV_IOC_BACKING_OPEN,
                                         bytearray(p.BACKING_MAP.pack(backing.fd, 0, 0)))
            except OSError as exc:
                self.enabled = False
                self.counts.refused += 1
                self.counts.served += 1
                hint = (" (the backing file is on a stacked file system, overlayfs?)"
                        if exc.errno == errno.ELOOP else "")
                log.warning("the kernel refused a backing file (%s)%s; serving reads "
                            "here from now on", exc.strerror, hint)
                return 0
            self.ids[backing.key] = backing_id
            self.counts.registered += 1
            return backing_id
        finally:
            os.close(backing.fd)


def _read_log(path: Path) -> dict[tuple[int, int], int]:
    """A predecessor's decisions; a torn last record (a kill mid-write) is ignored."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_LOG_BYTES + 1)
    except FileNotFoundError:
        return {}
    if len(raw) > MAX_LOG_BYTES:
        raise OSError(errno.EFBIG, f"passthrough log {path} is over {MAX_LOG_BYTES} bytes")
    whole = len(raw) - len(raw) % _RECORD.size
    return {(ino, version): backing
            for ino, version, backing in _RECORD.iter_unpack(raw[:whole])}
