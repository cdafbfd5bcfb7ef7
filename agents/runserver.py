"""The process every FUSE server runs in: ``python -m bootseer.agents.runserver``.

Not a user command: :func:`bootseer.serve.spawn_server` and the spare pool
(:mod:`bootseer.agents.spare`) start it, ``bootseer image mount --foreground`` and
``bootseer ckpt mount --foreground`` call :func:`run` in their own process.

- ``serve KIND SOURCE MOUNTPOINT``: read the spec from stdin (:func:`bootseer.serve.decode`)
  and serve it until unmounted; the arguments only say, in ``ps``, what it serves.
- ``spare --control-fd N``: a spare server: read the node's configuration from stdin,
  get ready, and wait on socket ``N`` for the spec to serve.

It lives with the agents because a server of a job's container reads through the node
agent (``peer_job``), and the agent's client is here.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import logging
import sys

from bootseer import boundedjson, typedjson
from bootseer.agents import cgroups
from bootseer.agents.spare import serve_spare
from bootseer.config import Config
from bootseer.errors import BootseerError
from bootseer.prefetch.serverspec import ImageServerSpec
from bootseer.serve import MAX_SPEC, ServerSpec, decode


def run(spec: ServerSpec) -> None:
    """Serve ``spec`` in this process until it is unmounted."""
    agent = None
    if spec.peer_job is not None:
        from bootseer.agents.client import PEER_READ_TIMEOUT, AgentClient

        agent = AgentClient(spec.agent_socket or spec.config.agent.socket,
                            answer_timeout=PEER_READ_TIMEOUT)
    if isinstance(spec, ImageServerSpec):
        from bootseer.prefetch.session import serve as serve_image

        serve_image(spec, functools.partial(agent.peer_read, spec.peer_job) if agent else None)
    else:
        from bootseer.stripedfs.server import serve as serve_checkpoint

        serve_checkpoint(spec, functools.partial(agent.peer_read_file, spec.peer_job)
                         if agent else None)


def warm_up(config: Config) -> None:
    """What a spare does before it is needed: the servers' imports, the store connected,
    and one blob's reference and chunk table read the way a start's first read (its hot
    list) reads them, so that the first read's own setup (for ``hdfs://``, the client's
    connections and runtime) does not lie on the start. The blob is an image's manifest;
    its table is a few hundred bytes (a chunk, 1 MiB per spare, is traffic a job reading
    through its peers would see at the DataNode: tests/system/test_p2p_warm.py)."""
    import bootseer.prefetch.session  # noqa: F401  (the servers' code)
    import bootseer.stripedfs.server  # noqa: F401
    from bootseer.prefetch.blockformat import IMAGE_REF_PREFIX
    from bootseer.store import BlobStore, open_configured_store

    blobs = BlobStore(open_configured_store(config))
    blobs.store.exists("refs")  # connected: a store that cannot be reached fails here
    try:
        for name in itertools.islice(blobs.list_refs(IMAGE_REF_PREFIX), 1):
            blobs.chunk_table(blobs.get_ref(name).digest)
    except (OSError, BootseerError) as exc:  # a store without images, say: nothing to warm
        logging.getLogger(__name__).info("spare: no sample read (%s)", exc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    modes = parser.add_subparsers(dest="mode", required=True)
    serve = modes.add_parser("serve", help="serve the spec on stdin")
    for label in ("kind", "source", "mountpoint"):
        serve.add_argument(label, help="what it serves, for ps (the spec says it all)")
    modes.add_parser("spare", help="wait for a spec on a socket").add_argument(
        "--control-fd", type=int, required=True)
    args = parser.parse_args(argv)
    data = sys.stdin.buffer.read(MAX_SPEC + 1)
    try:
        if args.mode == "serve":
            spec = decode(data)
            _place(spec.config)
        else:
            config = typedjson.from_json(Config, boundedjson.loads(
                data, limit=MAX_SPEC, what="a node configuration"))
            _place(config)
            _log_at(config)
            taken = serve_spare(args.control_fd, functools.partial(warm_up, config))
            if taken is None:  # the agent went away first
                return 0
            spec = taken
        _log_at(spec.config)
        run(spec)
    except (BootseerError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _place(config: Config) -> None:
    """Out of the agent's cgroup, first, where the operator says so (a DaemonSet):
    :mod:`bootseer.agents.cgroups`."""
    if config.agent.servers_cgroup:
        cgroups.enter(config.agent.servers_cgroup, config.agent.cgroup_root)


def _log_at(config: Config) -> None:
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(levelname)s %(name)s: %(message)s", force=True)


if __name__ == "__main__":
    sys.exit(main())
