"""The libhdfs JVM's class-data-sharing archive: built after a first connection, mapped
by the next ones, and never taken from a place another user can write."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.ci import require
from support.wait import wait_until

from bootseer.store import jvmshare

CONNECT = """
import os, sys
from bootseer.store import open_store
store = open_store(sys.argv[1])
store.put("probe", b"x")
assert store.get("probe") == b"x"
ours = [line for line in open("/proc/self/maps") if sys.argv[2] in line and ".jsa" in line]
print("mapped" if ours else "unmapped", os.environ["CLASSPATH"])
"""


def _connect(url: str, cache: Path) -> tuple[str, str]:
    env = os.environ | {"XDG_CACHE_HOME": str(cache)}
    env.pop("LIBHDFS_OPTS", None)
    out = subprocess.run([sys.executable, "-c", CONNECT, url, str(cache)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    said, classpath = out.stdout.split()
    return said, classpath


def test_the_first_connection_builds_the_archive_and_the_next_maps_it(hdfs_cluster,
                                                                        tmp_path) -> None:
    url = f"{hdfs_cluster.namenode_rpc_url}/jvmshare-{os.getpid()}"
    cache = tmp_path / "cache"
    said, classpath = _connect(url, cache)
    assert said == "unmapped"
    jvm = cache / "bootseer" / "jvm"
    wait_until(lambda: list(jvm.glob("*.jsa")), seconds=60)  # built after it exited
    wait_until(lambda: not list(jvm.glob("*.classlist")), seconds=10)
    assert (jvm.stat().st_mode & 0o777) == 0o700
    said, classpath = _connect(url, cache)
    assert said == "mapped"
    entries = classpath.split(":")
    jars = [e for e in entries if e.endswith(".jar")]
    assert entries[: len(jars)] == jars  # the configuration directory comes after the jars
    assert any(not e.endswith(".jar") for e in entries)


def _jars(tmp_path: Path) -> tuple[str, str]:
    (tmp_path / "a.jar").write_bytes(b"PK")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "core-site.xml").write_text("<configuration/>")
    java_home = tmp_path / "jdk"
    (java_home / "bin").mkdir(parents=True)
    (java_home / "bin" / "java").write_text("")
    return f"{tmp_path / 'conf'}:{tmp_path / 'a.jar'}", str(java_home)


def test_an_archive_is_used_only_from_a_directory_no_one_else_can_write(tmp_path) -> None:
    classpath, java_home = _jars(tmp_path)
    directory = tmp_path / "cache" / "jvm"
    first = jvmshare.prepare(classpath, java_home, directory)
    assert first.options[0].startswith("-XX:DumpLoadedClassList=")
    assert first.classpath == f"{tmp_path / 'a.jar'}:{tmp_path / 'conf'}"
    name = first.options[0].rpartition("/")[2].split(".")[0]
    archive = directory / f"{name}.jsa"
    archive.write_bytes(b"archive")
    assert jvmshare.prepare(classpath, java_home, directory).options == (
        f"-XX:SharedArchiveFile={archive}",)
    archive.chmod(0o666)  # another user could have written it
    assert not any("Shared" in o for o in jvmshare.prepare(classpath, java_home,
                                                              directory).options)
    archive.chmod(0o644)
    directory.chmod(0o777)
    assert jvmshare.prepare(classpath, java_home, directory).options == ()
    directory.chmod(0o700)
    directory.parent.chmod(0o757)
    assert jvmshare.prepare(classpath, java_home, directory).options == ()


def test_an_archive_another_user_owns_is_not_used(tmp_path) -> None:
    require(os.geteuid() != 0 and "giving a file to another user needs root",
            "an archive another user owns")
    classpath, java_home = _jars(tmp_path)
    directory = tmp_path / "cache" / "jvm"
    name = jvmshare.prepare(classpath, java_home, directory).options[0] \
        .rpartition("/")[2].split(".")[0]
    archive = directory / f"{name}.jsa"
    archive.write_bytes(b"archive")
    os.chown(archive, 65534, 65534)
    assert not any("Shared" in o for o in jvmshare.prepare(classpath, java_home,
                                                              directory).options)


def test_no_jdk_or_no_jars_leaves_the_jvm_as_it_was(tmp_path) -> None:
    classpath, java_home = _jars(tmp_path)
    directory = tmp_path / "cache" / "jvm"
    assert jvmshare.prepare(classpath, None, directory) == jvmshare.JvmSetup((), classpath)
    conf_only = str(tmp_path / "conf")
    assert jvmshare.prepare(conf_only, java_home, directory) == jvmshare.JvmSetup(
        (), conf_only)
