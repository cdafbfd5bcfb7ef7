"""The knobs of a start's prefetch, built once from the config file's ``[image]`` table."""

from __future__ import annotations

from dataclasses import dataclass

from bootseer.config import Config
from bootseer.errors import ConfigError


@dataclass(frozen=True)
class PrefetchConfig:
    """How a start's hot list (or a warm's) is read ahead of the workload's reads.

    Settable as ``image.prefetch_concurrency`` and ``image.prefetch_request_size``; a key
    the file leaves unset keeps the default here.
    """

    #: Prefetch reads in flight at once: enough to keep the store's link busy while each
    #: read is set up, few enough to leave room for the start's own demand reads.
    concurrency: int = 4
    #: Bytes of one prefetch read, at most. The first read is short
    #: (:data:`bootseer.prefetch.prefetcher.FIRST_REQUEST`) so that the blocks a start
    #: needs first arrive soon; the limit then doubles per read up to this, where a read's
    #: fixed cost is small next to its transfer.
    request_size: int = 8 << 20

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.request_size < 1:
            raise ValueError("prefetch concurrency and request size must be at least 1")

    @classmethod
    def from_config(cls, config: Config) -> PrefetchConfig:
        """The knobs ``config``'s ``[image]`` table sets, defaults for the rest."""
        image = config.image
        knobs = {"concurrency": image.prefetch_concurrency,
                 "request_size": image.prefetch_request_size}
        try:
            return cls(**{k: v for k, v in knobs.items() if v is not None})
        except ValueError as exc:
            raise ConfigError(f"image: {exc}") from exc
