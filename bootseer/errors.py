"""Bootseer's own exceptions, under one root.

Missing objects raise the built-in ``FileNotFoundError`` (and an existing one, when the
caller asked for create-only, ``FileExistsError``), the way fsspec backends do, so callers
can use the exceptions they already know. Everything that is Bootseer-specific derives from
:class:`BootseerError`, which the command line prints as one line instead of a traceback.
"""

from __future__ import annotations


class BootseerError(Exception):
    """Root of the errors Bootseer raises on purpose; the message is meant for a user."""


class ConfigError(BootseerError):
    """A configuration value is invalid; the message names the key and where it came from."""


class IntegrityError(BootseerError):
    """Bytes read back do not match their digest: the stored object is corrupt or was altered."""


class InvalidRangeError(BootseerError, ValueError):
    """A ranged read asked for bytes outside the object."""


class BackendUnavailableError(BootseerError, ImportError):
    """A store backend cannot be used here; the message says what to install."""


class SizeLimitError(IntegrityError):
    """Data from the store is larger than its format allows; refused before it is read or
    decompressed, so hostile bytes cannot make a process allocate without bound."""
