"""URL scheme → store backend, imported on first use (the fsspec registry pattern).

Backends with heavy or optional dependencies (HDFS's native client, an HTTP client) are only
imported when a URL of their scheme is opened, so ``file://`` users pay for neither. A
backend that cannot be imported raises :class:`BackendUnavailableError` carrying the hint
of what to install. Third-party backends register through the ``bootseer.stores``
entry-point group (``scheme = "package.module:Class"``).
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from bootseer.config import Config
from bootseer.errors import BackendUnavailableError
from bootseer.store.base import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackendSpec:
    """Where a backend class lives and what to do when it cannot be imported."""

    target: str  # "module:Class"
    install_hint: str = ""


known_backends: dict[str, BackendSpec] = {
    "file": BackendSpec("bootseer.store.local:LocalStore"),
    "hdfs": BackendSpec(
        "bootseer.store.hdfs:HdfsStore",
        "pip install hdfs-native",
    ),
    "webhdfs": BackendSpec("bootseer.store.webhdfs:WebHdfsStore", "pip install hdfs"),
}


def register_backend(scheme: str, target: str, install_hint: str = "") -> None:
    """Make ``scheme://`` URLs open with the class at ``target`` ("module:Class")."""
    known_backends[scheme] = BackendSpec(target, install_hint)


def backend_class(scheme: str) -> type[Store]:
    spec = known_backends.get(scheme) or _entry_point(scheme)
    if spec is None:
        known = ", ".join(f"{s}://" for s in sorted(known_backends))
        raise BackendUnavailableError(f"no store backend for '{scheme}://' (known: {known})")
    module_name, _, class_name = spec.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f": {spec.install_hint}" if spec.install_hint else ""
        raise BackendUnavailableError(
            f"the {scheme}:// store backend is not available ({exc}){hint}"
        ) from exc
    return getattr(module, class_name)


def _entry_point(scheme: str) -> BackendSpec | None:
    # Imported here: importlib.metadata costs every CLI start ~30 ms, and the built-in
    # schemes never need it.
    from importlib.metadata import entry_points

    for ep in entry_points(group="bootseer.stores"):
        if ep.name == scheme:
            return BackendSpec(ep.value)
    return None


def open_store(url: str, **options: Any) -> Store:
    """Open the store at ``url``; a plain path means ``file://``.

    ``options`` go to the backend's constructor (e.g. ``replication=`` for HDFS); options
    a backend does not take are an error rather than silently ignored.
    """
    scheme = urlsplit(url).scheme or "file"
    cls = backend_class(scheme)
    log.debug("opening %s with %s", url, cls.__name__)
    return cls(url, **options)


def store_options(config: Config, url: str) -> dict[str, Any]:
    """The backend options ``config`` sets for the store at ``url`` (``hdfs.*`` for
    ``hdfs://`` and ``webhdfs://``; none for the others)."""
    if urlsplit(url).scheme in ("hdfs", "webhdfs"):
        return {k: v for k, v in vars(config.hdfs).items() if v not in (None, False)}
    return {}


def open_configured_store(config: Config, url: str | None = None) -> Store:
    """The store at ``url`` (default: ``config.store``, the one Bootseer keeps its images
    and snapshots in), with the backend options the config sets: every store a command or
    the checkpoint API opens goes through here, so ``hdfs.*`` apply to all of them."""
    url = config.store if url is None else url
    return open_store(url, **store_options(config, url))
