"""Where the dev cluster keeps things: the shared download/build cache, per-cluster state, Java.

The cache (jars) is shared by every cluster of a user and costs a ~211 MB
download once; state (fsimage, block files, logs, PIDs) belongs to one cluster, so tests and
people running side by side each pass their own state dir.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import platformdirs

__all__ = ["cache_dir", "default_state_dir", "java_home", "JavaNotFound"]

CACHE_ENV = "BOOTSEER_HDFS_CACHE"
STATE_ENV = "BOOTSEER_HDFS_STATE"
JAVA_ENV = "BOOTSEER_JAVA_HOME"


class JavaNotFound(RuntimeError):
    """No JDK: the NameNode and DataNodes (and Hadoop's Java tools) cannot run."""


def cache_dir() -> Path:
    """The download/build cache: $BOOTSEER_HDFS_CACHE or <user cache dir>/bootseer/hdfs."""
    override = os.environ.get(CACHE_ENV)
    return Path(override) if override else Path(platformdirs.user_cache_dir("bootseer")) / "hdfs"


def default_state_dir() -> Path:
    """Per-cluster state: $BOOTSEER_HDFS_STATE or <user state dir>/bootseer/hdfs.

    A state dir rather than the runtime dir (/run/user/UID), because block files can be
    large and /run is usually a small tmpfs (and often absent for root in containers).
    """
    override = os.environ.get(STATE_ENV)
    return Path(override) if override else Path(platformdirs.user_state_dir("bootseer")) / "hdfs"


def _is_jdk(path: Path) -> bool:
    return ((path / "include" / "jni.h").is_file()
            and (path / "lib" / "server" / "libjvm.so").is_file())


def java_home() -> Path:
    """The JDK used for the servers and for Hadoop's Java tools (their JAVA_HOME).

    Order: $BOOTSEER_JAVA_HOME, $JAVA_HOME, the Debian OpenJDK 17 (the verified one; this
    machine may carry other JDKs), /usr/lib/jvm/default-java, then `java` on PATH.
    """
    candidates: list[Path] = []
    for var in (JAVA_ENV, "JAVA_HOME"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]))
    candidates += [Path("/usr/lib/jvm/java-17-openjdk-amd64"), Path("/usr/lib/jvm/default-java")]
    java = shutil.which("java")
    if java:
        candidates.append(Path(os.path.realpath(java)).parent.parent)
    for cand in candidates:
        if _is_jdk(cand):
            return cand.resolve()
    raise JavaNotFound(
        "no JDK with include/jni.h and lib/server/libjvm.so found (tried "
        + ", ".join(map(str, candidates))
        + "); run scripts/install-system-deps.sh or set BOOTSEER_JAVA_HOME")
