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

from bootseer.agents.client import answering_agent
from bootseer.agents.mountapi import ContainerMount, MountRequest
from bootseer.agents.mounts import MountManager
from bootseer.agents.timeline import StartRecord, Timeline, timeline_path
from bootseer.config import Config
from bootseer.errors import BootseerError


class Mounts(Protocol):
    """What a start needs of the node's mounts (the agent's client, or a manager)."""

    def mount(self, request: MountRequest) -> ContainerMount: ...

    def release(self, container_id: str, exit_code: int | None = None,
                rootfs: str | None = None, *, wait: bool = True) -> StartRecord | None: ...


@contextmanager
def node_mounts(config: Config) -> Iterator[Mounts]:
    """The agent (if one answers on ``agent.socket``), else a manager in this process whose
    starts go into the node's timeline file. An agent serving another store than
    ``config``'s is an error: its mounts would not be the images asked for."""
    with answering_agent(config.agent.socket) as agent:
        if agent is not None:
            store = agent.health().get("store")
            if store != config.store:
                raise BootseerError(
                    f"the node agent (socket {config.agent.socket}) serves the store {store}, "
                    f"not {config.store}: give the agent's store (or none), or point "
                    f"agent.socket at another agent")
            yield agent
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
