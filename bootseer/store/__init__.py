"""The store: where every Bootseer artifact lives.

Two layers:

* :class:`Store` — immutable byte objects under keys, with ranged reads and atomic
  publish, one backend per URL scheme (``file://`` embedded by default, ``hdfs://`` and
  ``webhdfs://`` at scale). :func:`open_store` picks the backend from the URL.
* :class:`BlobStore` — content-addressed blobs (``sha256:...``), verified on every read,
  ranged reads included, plus named references ("the hot list of image X", "the snapshot
  for key K") on top of any :class:`Store`.
"""

from bootseer.store.base import ObjectInfo, ObjectWriter, Store
from bootseer.store.blobs import BlobInfo, BlobStore, Ref
from bootseer.store.registry import open_configured_store, open_store, register_backend

__all__ = [
    "BlobInfo",
    "BlobStore",
    "ObjectInfo",
    "ObjectWriter",
    "Ref",
    "Store",
    "open_configured_store",
    "open_store",
    "register_backend",
]

