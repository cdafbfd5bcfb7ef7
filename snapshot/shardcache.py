"""The node's snapshot cache: shards and manifests a warm staged, found again by a restore.

The cache is a :class:`~bootseer.nodecache.NodeCache` (``<cache_dir>/snapshots``, opened
by :meth:`~bootseer.nodecache.NodeCaches.snapshots`): shards and manifests are entries
under their sha256, verified when written and when read back. A manifest is found by its
snapshot's key through ``keys/<key>``, a small file naming the manifest's digest::

    entries/ab/<hex>    a shard or a manifest
    keys/<key>          the digest of snapshot <key>'s manifest

A key names one snapshot for good (publishing it is create-only), so a manifest found here
is the one the store holds: a restore on a warmed node reads nothing from the store.
:func:`stage_manifest` (a warm) writes the record, :func:`cached_manifest` (a restore)
reads it; anything absent, damaged or forged there reads as absent.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from bootseer.errors import BootseerError
from bootseer.nodecache import NodeCache
from bootseer.p2p import Fanout
from bootseer.snapshot.manifest import MAX_MANIFEST_BYTES, REF_PREFIX, Manifest
from bootseer.store import BlobStore, Ref

#: Keys that may name a file in the snapshot cache (``keys/<key>``): every key `env run`
#: derives, and what `env snapshot --key` accepts.
_CACHEABLE_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _key_record(cache: NodeCache, key: str) -> Path | None:
    return cache.directory / "keys" / key if _CACHEABLE_KEY.fullmatch(key) else None


def manifest_ref(blobs: BlobStore, key: str) -> Ref:
    """Snapshot ``key``'s reference (its manifest's digest), from the store."""
    try:
        return blobs.get_ref(REF_PREFIX + key)
    except FileNotFoundError:
        raise FileNotFoundError(f"no snapshot {key} in the store {blobs.store.url}") from None


def store_manifest(blobs: BlobStore, key: str) -> tuple[Ref, bytes]:
    """Snapshot ``key``'s reference and manifest bytes, from the store."""
    ref = manifest_ref(blobs, key)
    return ref, blobs.get(ref.digest, MAX_MANIFEST_BYTES)


def cached_manifest(cache: NodeCache, key: str) -> Manifest | None:
    """Snapshot ``key``'s manifest if a warm staged it in ``cache``; else None."""
    record = _key_record(cache, key)
    if record is not None:
        with contextlib.suppress(OSError, ValueError):  # absent, damaged, forged: the store
            data = cache.get(record.read_text().strip())
            if data is not None:
                return Manifest.decode(data, key)
    return None


def stage_manifest(blobs: BlobStore, cache: NodeCache, key: str,
                   fanout: Fanout | None = None) -> Manifest:
    """Snapshot ``key``'s manifest from the store (through the job's swarm with a
    ``fanout``), kept in ``cache`` like a shard (under its digest, verified on every read)
    with ``keys/<key>`` naming that digest, for :func:`cached_manifest`. A cache this
    process cannot write is left as it is (without a fanout)."""
    if fanout is None:
        ref, data = store_manifest(blobs, key)
    else:
        ref = manifest_ref(blobs, key)
        fanout.cache_blob(blobs, ref.digest, cache, max_size=MAX_MANIFEST_BYTES)
        data = cache.get_or_fetch(ref.digest.removeprefix("sha256:"),  # evicted since?
                                  lambda: blobs.get(ref.digest, MAX_MANIFEST_BYTES))
    manifest = Manifest.decode(data, key)
    record = _key_record(cache, key)
    if record is not None:
        with contextlib.suppress(OSError, BootseerError):
            cache.put(ref.digest.removeprefix("sha256:"), data)
            record.parent.mkdir(mode=0o755, exist_ok=True)
            tmp = cache.new_temporary("key")  # swept if this process dies before the rename
            tmp.write_text(ref.digest.removeprefix("sha256:"))
            os.replace(tmp, record)
    return manifest
