"""Hand a container start's timeline to the node agent, or keep it locally without one.

The runtimes Bootseer starts containers with (``bootseer image run`` today) report each
start here when it ends. The agent, when one answers on its socket, merges the record
into the node's timeline and counts it in its metrics; otherwise the record goes straight
into the same SQLite file, so ``bootseer report`` works on a node without an agent too.
Reporting never fails the start it describes: a problem is logged and the start goes on.
"""

from __future__ import annotations

import logging

import httpx

from bootseer.agents.client import answering_agent
from bootseer.agents.timeline import StartRecord, Timeline, timeline_path
from bootseer.config import Config
from bootseer.errors import BootseerError

log = logging.getLogger(__name__)


def report_start(config: Config, record: StartRecord) -> str | None:
    """Record ``record``; where it went ("agent" or "file"), None if nowhere."""
    with answering_agent(config.agent.socket) as agent:
        if agent is not None:
            try:
                agent.record_start(record)
                return "agent"
            except (BootseerError, httpx.HTTPError) as exc:
                log.warning("the agent did not take the start's timeline (%s); keeping it "
                            "locally", exc)
    try:
        timeline = Timeline(timeline_path(config))
        try:
            timeline.record(record)
        finally:
            timeline.close()
        return "file"
    except Exception as exc:  # sqlite3.Error, OSError: never fail the start for this
        log.warning("could not record the start's timeline in %s: %s",
                    timeline_path(config), exc)
        return None
