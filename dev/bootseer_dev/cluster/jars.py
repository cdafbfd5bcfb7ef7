"""Fetch and cache the Hadoop 2.7.3 server jars (from the PyPI sdist of pyspark 2.4.8).

There is no Hadoop on PyPI or Debian, but the pyspark 2.4.8 *sdist* carries the unshaded
Hadoop 2.7.3 jars in deps/jars/. We download it once with pip (the registry's ordinary
client), extract only the jars HDFS needs, and keep them in the cache so a second start
neither downloads nor extracts. Everything else Spark ships stays off the classpath: extra
jars only add version clashes (Jersey 2, Jackson 2, ...).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from bootseer.filelock import file_lock

from .downloads import download_sdist
from .paths import cache_dir

__all__ = ["JarsError", "ensure_jars", "server_classpath", "webapp_root", "DEBIAN_JARS",
           "PYSPARK_VERSION"]

log = logging.getLogger(__name__)

PYSPARK_VERSION = "2.4.8"
SDIST_NAME = f"pyspark-{PYSPARK_VERSION}.tar.gz"

# Exact names must all be present; patterns pick up the families the brief lists.
REQUIRED_JARS = (
    "hadoop-common-2.7.3.jar", "hadoop-hdfs-2.7.3.jar", "hadoop-auth-2.7.3.jar",
    "hadoop-annotations-2.7.3.jar", "guava-14.0.1.jar", "protobuf-java-2.5.0.jar",
    "htrace-core-3.1.0-incubating.jar", "jetty-6.1.26.jar", "jetty-util-6.1.26.jar",
    "javax.servlet-api-3.1.0.jar", "log4j-1.2.17.jar", "jackson-core-asl-1.9.13.jar",
    "jackson-mapper-asl-1.9.13.jar", "jackson-jaxrs-1.9.13.jar", "jackson-xc-1.9.13.jar",
    "netty-3.9.9.Final.jar", "netty-all-4.1.47.Final.jar", "leveldbjni-all-1.8.jar",
    "zookeeper-3.4.6.jar", "avro-1.8.2.jar",
)
JAR_PATTERNS = (
    "commons-*.jar", "slf4j-api-*.jar", "slf4j-log4j12-*.jar", "xercesImpl-*.jar",
    "xmlenc-*.jar", "curator-*.jar", "gson-*.jar", "paranamer-*.jar", "httpclient-*.jar",
    "httpcore-*.jar",
)
# commons-* that are Spark/Hive's, not Hadoop's.
JAR_EXCLUDES = ("commons-compiler-*.jar", "commons-crypto-*.jar", "commons-dbcp-*.jar",
                "commons-pool-*.jar")

# WebHDFS is Jersey 1; pyspark only ships Jersey 2, so Jersey 1 comes from Debian
# (libjersey1-*-java, libjsr311-api-java, libjaxb-java, libjettison-java).
DEBIAN_JARS = (
    "jersey1-core.jar", "jersey1-server.jar", "jersey1-servlet.jar", "jersey1-json.jar",
    "jsr311-api.jar", "jaxb-api.jar", "jaxb-core.jar", "jaxb-runtime.jar",
    "javax.activation.jar", "jettison.jar",
)
DEBIAN_JAR_DIR = Path("/usr/share/java")

_EMPTY_WEB_XML = '<?xml version="1.0" encoding="UTF-8"?>\n<web-app/>\n'


class JarsError(RuntimeError):
    """The server jars could not be fetched, extracted or found."""


def _wanted(name: str) -> bool:
    if name in REQUIRED_JARS:
        return True
    if any(fnmatch.fnmatch(name, p) for p in JAR_EXCLUDES):
        return False
    return any(fnmatch.fnmatch(name, p) for p in JAR_PATTERNS)


def _jar_dir(root: Path) -> Path:
    return root / f"pyspark-{PYSPARK_VERSION}-hadoop-jars"


def _download_sdist(root: Path) -> Path:
    for mod in ("setuptools", "wheel"):
        probe = subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True)
        if probe.returncode != 0:
            raise JarsError(f"`pip download pyspark=={PYSPARK_VERSION}` builds sdist metadata "
                            f"without build isolation and needs {mod}: "
                            f"{sys.executable} -m pip install setuptools wheel")
    log.info("downloading %s (~211 MB, once)", SDIST_NAME)
    return download_sdist(f"pyspark=={PYSPARK_VERSION}", SDIST_NAME, root,
                          ["--no-build-isolation"], JarsError)


def _extract(sdist: Path, dest: Path) -> None:
    """Extract the wanted deps/jars/* into a temp dir next to dest, then rename it into place."""
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".extract-"))
    try:
        found: list[str] = []
        with tarfile.open(sdist, "r:gz") as tar:
            for member in tar:
                parts = member.name.split("/")
                if (member.isfile() and len(parts) >= 3 and parts[-2] == "jars"
                        and parts[-3] == "deps" and _wanted(parts[-1])):
                    src = tar.extractfile(member)
                    assert src is not None
                    with src, open(tmp / parts[-1], "wb") as out:
                        shutil.copyfileobj(src, out, 1 << 20)
                    found.append(parts[-1])
        missing = sorted(set(REQUIRED_JARS) - set(found))
        if missing:
            raise JarsError(f"{sdist} lacks required jars: {missing}")
        (tmp / ".complete").write_text("\n".join(sorted(found)) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
        log.info("extracted %d jars into %s", len(found), dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def webapp_root(root: Path | None = None) -> Path:
    """A directory holding webapps/{hdfs,datanode}/WEB-INF/web.xml, to put on the classpath.

    Hadoop's HttpServer2 looks the webapp up as a classpath resource and refuses to start
    without it; an empty <web-app/> is enough because the servlets are added in code.
    """
    root = (root or cache_dir()) / "webroot"
    for app in ("hdfs", "datanode", "secondary"):
        web_xml = root / "webapps" / app / "WEB-INF" / "web.xml"
        if not web_xml.is_file():
            web_xml.parent.mkdir(parents=True, exist_ok=True)
            tmp = web_xml.with_suffix(".tmp")
            tmp.write_text(_EMPTY_WEB_XML)
            os.replace(tmp, web_xml)
    return root


def ensure_jars(root: Path | None = None) -> list[Path]:
    """Return the Hadoop + Jersey jar list, downloading/extracting on first use only."""
    root = root or cache_dir()
    dest = _jar_dir(root)
    if not (dest / ".complete").is_file():
        with file_lock(root / ".jars.lock"):
            if not (dest / ".complete").is_file():
                root.mkdir(parents=True, exist_ok=True)
                _extract(_download_sdist(root), dest)
    names = (dest / ".complete").read_text().split()
    jars = [dest / n for n in names]
    missing_deb = [n for n in DEBIAN_JARS if not (DEBIAN_JAR_DIR / n).is_file()]
    if missing_deb:
        raise JarsError(f"Debian Jersey 1 jars missing from {DEBIAN_JAR_DIR}: {missing_deb}; "
                        "run scripts/install-system-deps.sh as root")
    return jars + [DEBIAN_JAR_DIR / n for n in DEBIAN_JARS]


def server_classpath(conf_dir: Path, root: Path | None = None) -> list[Path]:
    """conf dir first (so *-site.xml and log4j.properties win), then the webapp root, then jars."""
    return [conf_dir, webapp_root(root), *ensure_jars(root)]
