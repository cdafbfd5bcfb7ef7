"""What the operator lets containers do through the agent: policy, never a request's say-so.

The agent runs as root; a container's annotations, its image's ``ENV`` and the body of an
API request are written by whoever starts the pod, builds the image or is in the socket's
group. So every setting that reaches beyond the container itself is checked here against
the operator's configuration before it is acted on:

* **checkpoint sources** (``checkpoint.allowed``): a checkpoint mount or a ``warm
  --checkpoint`` through the agent reads as root, so the URL must lie under a prefix the
  operator listed. URLs are normalised before matching: one spelling per location (scheme
  and host in lower case, the scheme's default port, no ``.`` or empty path components),
  and what could mean two things is refused outright rather than guessed at (``..``,
  percent-encoding, a query, a fragment, user info, control characters). ``file://`` URLs
  are resolved with ``realpath`` on both sides, so a symlink cannot lead out of an allowed
  directory; the store below it never follows symlinks either
  (:class:`bootseer.store.local.LocalStore`). The URL handed on is the normalised one: the
  server opens exactly the location that was checked.
* **recording** (``image.record_images``): a start's recording rewrites the hot list that
  every later start of the image, on every node, prefetches. A container records only for
  images the operator lists; otherwise its ``record`` setting becomes ``never``.
* **jobs** (``agent.jobs``): a job's report and its peers are its nodes' together; a
  container joins one only where the operator grants its name.
* **sharing** (``p2p.checkpoints``): which checkpoints a job's nodes may serve each other
  (matched like ``checkpoint.allowed``).
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from bootseer.config import Config
from bootseer.errors import BootseerError, ConfigError

#: Ports a URL of the scheme means when it names none (Hadoop's defaults).
_DEFAULT_PORTS = {"hdfs": 8020, "webhdfs": 9870}
_MAX_URL = 4096


class PolicyError(BootseerError):
    """The operator's configuration does not allow what was asked; the message names the
    setting that decides it."""


@dataclass(frozen=True)
class Location:
    """A normalised store URL: one spelling for one place."""

    scheme: str
    netloc: str
    path: str  # absolute, normalised; "/" for a whole file system

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.netloc}{self.path}"

    def within(self, prefix: Location) -> bool:
        """Under ``prefix`` by whole path components (``/ckpt`` holds ``/ckpt/x``, not
        ``/ckpt2``)."""
        if (self.scheme, self.netloc) != (prefix.scheme, prefix.netloc):
            return False
        root = prefix.path.rstrip("/")
        return self.path == prefix.path or self.path.startswith(root + "/")


def normalise(url: str) -> Location:
    """``url`` in its one spelling, or ``ValueError`` saying what makes it ambiguous."""
    if not isinstance(url, str) or not url:
        raise ValueError("a checkpoint URL must be a non-empty string")
    if len(url) > _MAX_URL or any(ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise ValueError(f"{url[:80]!r}: too long, or holds control characters")
    if "%" in url or "\\" in url:
        raise ValueError(f"{url!r}: percent-encoding and backslashes are not accepted")
    parts = urlsplit(url)
    scheme = (parts.scheme or "file").lower()
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise ValueError(f"{url!r}: a checkpoint URL has no query or fragment")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{url!r}: a checkpoint URL carries no user")
    components = parts.path.split("/")
    if ".." in components:
        raise ValueError(f"{url!r}: '..' is not accepted in a checkpoint URL")
    if not parts.path.startswith("/"):
        raise ValueError(f"{url!r}: the path must be absolute")
    path = posixpath.normpath(parts.path)
    if path.startswith("//"):  # normpath keeps a leading "//"
        path = "/" + path.lstrip("/")
    return Location(scheme, _netloc(scheme, parts, url), _resolve(scheme, path))


def _netloc(scheme: str, parts: SplitResult, url: str) -> str:
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{url!r}: a file:// URL names no host")
        return ""
    try:
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:
        raise ValueError(f"{url!r}: the port is not a number") from None
    host = (parts.hostname or "").lower()
    if not host:
        raise ValueError(f"{url!r}: names no host")
    return f"{host}:{port}" if port else host


def _resolve(scheme: str, path: str) -> str:
    """A ``file://`` path with every symlink resolved: the place it leads to is what the
    policy judges (and what the server then opens)."""
    return os.path.realpath(path) if scheme == "file" else path


class CheckpointPolicy:
    """URL prefixes a checkpoint must lie under: ``checkpoint.allowed`` (what the agent
    reads checkpoints from), or ``p2p.checkpoints`` (what a job's nodes may share)."""

    def __init__(self, allowed: tuple[str, ...], key: str = "checkpoint.allowed") -> None:
        self.setting = key
        self.prefixes = []
        for prefix in allowed:
            try:
                self.prefixes.append(normalise(prefix))
            except ValueError as exc:
                raise ConfigError(f"{self.setting}: {exc}") from None

    @classmethod
    def from_config(cls, config: Config) -> CheckpointPolicy:
        return cls(config.checkpoint.allowed)

    @classmethod
    def sharing(cls, config: Config) -> CheckpointPolicy:
        """``p2p.checkpoints``: the checkpoints a job's nodes may serve each other."""
        return cls(config.p2p.checkpoints, "p2p.checkpoints")

    def allows(self, url: str) -> bool:
        try:
            self.check(url)
        except PolicyError:
            return False
        return True

    def check(self, url: str) -> str:
        """The URL to read ``url`` through, if the operator allows it; else
        :class:`PolicyError` naming the setting."""
        try:
            location = normalise(url)
        except ValueError as exc:
            raise PolicyError(f"checkpoint {exc}; {self.setting} allows only plain URLs under "
                              f"its prefixes") from None
        if not any(location.within(prefix) for prefix in self.prefixes):
            listed = ", ".join(p.url for p in self.prefixes) or "none"
            raise PolicyError(
                f"checkpoint {url} is not under a prefix the operator allows "
                f"({self.setting}: {listed}); ask the node's operator to add its location to "
                f"{self.setting} in /etc/bootseer/config.toml")
        return location.url


class NameGrant:
    """Names the operator grants, as prefixes (``"*"``: all): what ``agent.jobs`` and
    ``image.record_images`` list."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        self.prefixes = prefixes

    def allows(self, name: str) -> bool:
        return any(p == "*" or name.startswith(p) for p in self.prefixes if p)


class JobPolicy(NameGrant):
    """``agent.jobs``: which jobs a container may join (their reports, their swarms)."""

    KEY = "agent.jobs"

    @classmethod
    def from_config(cls, config: Config) -> JobPolicy:
        return cls(config.agent.jobs)

    def effective(self, job: str | None, runtime: str = "") -> str | None:
        """The job a container joins: the one it names where the operator grants it (or
        for the operator's own starts, :data:`OPERATOR_RUNTIMES`), else none."""
        if job is None or runtime in OPERATOR_RUNTIMES or self.allows(job):
            return job
        return None


class RecordingPolicy(NameGrant):
    """``image.record_images``: which images' container starts may record hot lists."""

    KEY = "image.record_images"

    @classmethod
    def from_config(cls, config: Config) -> RecordingPolicy:
        return cls(config.image.record_images)

    def effective(self, image: str, asked: str, runtime: str = "") -> str:
        """The record mode a container gets: what it asked for where recording is granted
        for ``image``, else ``never`` (asking for less is always allowed). The operator's
        own starts (:data:`OPERATOR_RUNTIMES`) get what they ask: only root reaches the
        mount API, and the runtime is named by the caller's code, never by a container."""
        return asked if runtime in OPERATOR_RUNTIMES or self.allows(image) else "never"


#: Who starts containers on the operator's word rather than a container's: ``bootseer
#: image run`` (a root command line, its flags its operator's).
OPERATOR_RUNTIMES = frozenset({"bootseer-image-run"})
