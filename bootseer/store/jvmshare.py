"""A class-data-sharing archive for the JVM that libhdfs starts in our processes.

Every process that opens an ``hdfs://`` store starts a JVM, and most of that start is the
Hadoop client's ~3,800 classes being read from jars, parsed and verified. An AppCDS archive
holds them ready to map (JDK 13+): the connection is made in 0.39 s instead of 0.65 s and
with 0.33 s less CPU on these machines (a restore, a FUSE server and a checkpoint load
each pay it at their start).

The archive is made on the node, once per JDK and list of jars: the first process without
one records the classes it loads (``-XX:DumpLoadedClassList``) and, as it exits, starts
``java -Xshare:dump`` detached and at the lowest CPU priority, which writes the archive
beside the class list and renames it into place. Later processes map it; a class it lacks
loads from its jar as before, and a JVM that cannot map it starts the usual way.

Two constraints of the JVM shape this:

* an archive is refused for a class path that holds a non-empty directory (the Hadoop
  configuration directory usually is one), so it is made over the jars alone and the
  process's ``CLASSPATH`` is put in that order: jars first, then the directories. Only
  a resource present in both a jar and a directory (none of Hadoop's ``*-site.xml``) would
  resolve differently;
* an archive is code the JVM runs, so one is only used from a directory this user owns
  and no one else can write (``~/.cache/bootseer/jvm``, for root too): a local user must
  not be able to hand the agent its classes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import platformdirs

#: Archives kept per user (one per JDK and jar list); older ones are removed by a build.
KEEP_ARCHIVES = 4


@dataclass(frozen=True)
class JvmSetup:
    """What the JVM about to start gets: options, the class path to start it with, and
    what to call as the process exits (the archive's build), if anything."""

    options: tuple[str, ...]
    classpath: str
    at_exit: Callable[[], None] | None = None


def archive_dir() -> Path:
    return Path(platformdirs.user_cache_dir("bootseer")) / "jvm"


def prepare(classpath: str, java_home: str | None, directory: Path | None = None
            ) -> JvmSetup:
    """The options that map this class path's archive, or that record the classes for
    one (and build it at exit); no options where the JDK or the directory do not allow it
    (the JVM then starts as it always did)."""
    jars: list[str] = []
    others: list[str] = []  # directories, mostly: they must come after the jars
    for entry in filter(None, classpath.split(os.pathsep)):
        (jars if entry.endswith(".jar") and os.path.isfile(entry) else others).append(entry)
    java = Path(java_home or "", "bin", "java")
    if not jars or not java_home or not java.is_file():
        return JvmSetup((), classpath)
    directory = directory or archive_dir()
    if not _private_dir(directory):
        return JvmSetup((), classpath)
    ordered = os.pathsep.join(jars + others)
    name = _fingerprint(java_home, jars)
    archive = directory / f"{name}.jsa"
    if _private(archive):
        return JvmSetup((f"-XX:SharedArchiveFile={archive}",), ordered)
    if (directory / f"{name}.failed").exists():
        return JvmSetup((), classpath)
    classlist = directory / f"{name}.{os.getpid()}.classlist"
    return JvmSetup((f"-XX:DumpLoadedClassList={classlist}",), ordered,
                    functools.partial(_build_detached, java, jars, classlist, archive))


def _fingerprint(java_home: str, jars: list[str]) -> str:
    """The JDK build and each jar's path, size and mtime: what the JVM checks an archive
    against (a mismatch makes it ignore the archive, so a stale name only costs a miss)."""
    h = hashlib.sha256()
    with contextlib.suppress(OSError):
        h.update(Path(java_home, "release").read_bytes())
    h.update(os.path.realpath(java_home).encode())
    for jar in jars:
        st = os.stat(jar)
        h.update(f"\0{os.path.realpath(jar)}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()[:32]


def _private_dir(directory: Path) -> bool:
    """Make ``directory`` (mode 0700) if needed; true if it and its parent are
    :func:`_private` directories."""
    with contextlib.suppress(OSError):
        directory.mkdir(mode=0o700, parents=True)
    return _private(directory, stat.S_ISDIR) and _private(directory.parent, stat.S_ISDIR)


def _private(path: Path, is_kind: Callable[[int], bool] = stat.S_ISREG) -> bool:
    """True if ``path`` is of the kind, this user owns it and no one else can write it."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return is_kind(st.st_mode) and st.st_uid == os.geteuid() \
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _build_detached(java: Path, jars: list[str], classlist: Path, archive: Path) -> None:
    """Start the archive's build and return: ``java -Xshare:dump`` takes a second or two
    of CPU, which a process ending a start must not spend, so it runs after it, niced."""
    if not classlist.is_file():
        return
    if _private(archive):  # another process built it meanwhile
        classlist.unlink(missing_ok=True)
        return
    tmp = archive.with_name(f"{archive.stem}.{os.getpid()}.tmp")
    failed = archive.with_name(f"{archive.stem}.failed")
    script = ('"$1" -Xshare:dump -XX:SharedClassListFile="$2" -XX:SharedArchiveFile="$3" '
              '-cp "$4" >/dev/null 2>&1 && chmod 0644 "$3" && mv -f "$3" "$5" '
              '|| { rm -f "$3"; : > "$6"; }; rm -f "$2"')
    argv = ["nice", "-n", "19", "sh", "-c", script, "sh", str(java), str(classlist),
            str(tmp), os.pathsep.join(jars), str(archive), str(failed)]
    with contextlib.suppress(OSError):
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        _remove_old(archive.parent)


def _remove_old(directory: Path) -> None:
    """All but the newest :data:`KEEP_ARCHIVES` archives, and class lists a killed process
    left (older than a day)."""
    with contextlib.suppress(OSError):
        archives = sorted(directory.glob("*.jsa"), key=lambda p: p.stat().st_mtime,
                          reverse=True)
        for old in archives[KEEP_ARCHIVES:]:
            old.unlink(missing_ok=True)
        day_ago = time.time() - 86400
        for left in directory.glob("*.classlist"):
            if left.stat().st_mtime < day_ago:
                left.unlink(missing_ok=True)
