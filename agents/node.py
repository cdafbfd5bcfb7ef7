"""This node's mount manager, for a command: the agent's when one answers, else its own.

``bootseer image run`` starts a container the way the runtime shim does, through the same
:class:`~bootseer.agents.mounts.MountManager`: asked over the agent's socket when an agent
runs (it owns the node's mounts, their takeover and their metrics), or made in this
process when none does. Both answer ``mount(request)`` and ``release(id, exit_code,
rootfs)`` alike, and a start's timeline goes where the agent would put it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from bootseer.agents.client import AgentClient, AgentUnavailable
from bootseer.agents.mountapi import ContainerMount, MountRequest
from bootseer.agents.mounts import MountManager
from bootseer.agents.timeline import StartRecord, Timeline, timeline_path
from bootseer.config import Config
from bootseer.errors import BootseerError


class Mounts(Protocol):
    """What a start needs of the node's mounts (the agent's client, or a manager)."""

    def mount(self, request: MountRequest) -> ContainerMount: ...

    def release(self, container_id: str, exit_code: int | None = None,
                rootfs: str | None = None) -> StartRecord: ...


@contextmanager
def node_mounts(config: Config) -> Iterator[Mounts]:
    """The agent (if one answers on ``agent.socket``), else a manager in this process whose
    starts go into the node's timeline file. An agent serving another store than
    ``config``'s is an error: its mounts would not be the images asked for."""
    if config.agent.socket.exists():
        client = AgentClient(config.agent.socket)
        try:
            health = client.health()
        except AgentUnavailable:
            client.__exit__(None, None, None)
        else:
            with client:
                if health.get("store") != config.store:
                    raise BootseerError(
                        f"the node agent (socket {config.agent.socket}) serves the store "
                        f"{health.get('store')}, not {config.store}: give the agent's store "
                        f"(or none), or point agent.socket at another agent")
                yield client
            return
    timeline = Timeline(timeline_path(config))

    def record(start: StartRecord) -> StartRecord:
        timeline.record(start)
        merged = timeline.get(start.id)
        assert merged is not None
        return merged

    try:
        yield MountManager(config, record)
    finally:
        timeline.close()
