"""Talk to the node agent over its Unix socket (httpx), for the CLI and the runtime hook."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from bootseer.agents.mountapi import ContainerMount, MountRequest, PeerFileRead, PeerRead
from bootseer.agents.timeline import StartRecord
from bootseer.agents.warm import WarmRequest, WarmSummary
from bootseer.errors import BootseerError
from bootseer.store import ObjectInfo

#: Longest a mount server waits for the agent's read through peers (it then reads the
#: store): the agent's own bound (p2p.demand_wait + the swarm's timeout) and a margin.
PEER_READ_TIMEOUT = 30.0


class AgentUnavailable(BootseerError):
    """No agent answers on the socket (none runs, or it died and left its socket)."""


class AgentError(BootseerError):
    """The agent answered with an error; the message is the agent's."""


class AgentClient:
    def __init__(self, socket_path: Path, timeout: float = 10.0,
                 answer_timeout: float = 600.0) -> None:
        """``timeout`` bounds connecting and sending; ``answer_timeout`` waiting for an
        answer (a mount starts a server; a release waits for its report). A warm's
        stream has no answer timeout: it reports progress, and a warm may wait its turn."""
        self.socket_path = socket_path
        self._client = httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)),
                                    base_url="http://bootseer-agent",
                                    timeout=httpx.Timeout(timeout, read=answer_timeout))
        self._stream_timeout = httpx.Timeout(timeout, read=None)

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()

    def peer_read(self, job: str, pack: str, offset: int, length: int) -> bytes | None:
        """A range of an image pack through the agent's swarm for ``job`` (a mount
        server's read); None when the agent cannot serve it so: read the store."""
        return self._peer_read("/v1/p2p/read", PeerRead(job, pack, offset, length).to_json())

    def peer_read_file(self, job: str, url: str, info: ObjectInfo, offset: int,
                       length: int) -> bytes | None:
        """A range of checkpoint file ``url`` (the version ``info`` describes) through
        the agent's swarm for ``job`` (a checkpoint mount server's read); None when the
        agent cannot serve it so: read the store."""
        body = PeerFileRead(job, url, info.size, info.mtime, offset, length).to_json()
        return self._peer_read("/v1/p2p/read-file", body)

    def _peer_read(self, path: str, body: dict[str, Any]) -> bytes | None:
        try:
            response = self._client.post(path, json=body)
        except httpx.TransportError:
            return None
        return response.content if response.status_code == 200 else None

    def health(self) -> dict[str, Any]:
        try:
            response = self._client.get("/v1/health")
        except httpx.TransportError as exc:
            raise AgentUnavailable(f"no agent answers on {self.socket_path}: {exc}") from exc
        response.raise_for_status()
        return response.json()

    def warm(self, request: WarmRequest, *,
             on_plan: Callable[[int], None] | None = None,
             on_progress: Callable[[int], None] | None = None) -> WarmSummary:
        """Ask the agent to stage what ``request`` names; its summary when done."""
        body = request.to_json()
        try:
            with self._client.stream("POST", "/v1/warm", json=body,
                                     timeout=self._stream_timeout) as response:
                if response.status_code != 200:
                    raise AgentError(f"agent: {response.read().decode(errors='replace')}")
                for line in response.iter_lines():
                    if not line:
                        continue
                    event = json.loads(line)
                    kind = event.pop("event")
                    if kind == "plan" and on_plan:
                        on_plan(event["bytes"])
                    elif kind == "progress" and on_progress:
                        on_progress(event["bytes"])
                    elif kind == "error":
                        raise AgentError(event["message"])
                    elif kind == "result":
                        return WarmSummary.from_json(event)
        except httpx.TransportError as exc:
            raise AgentUnavailable(f"no agent answers on {self.socket_path}: {exc}") from exc
        raise AgentError("the agent ended the warm without a result")

    def record_start(self, record: StartRecord) -> StartRecord:
        """Merge ``record`` into the node's timeline; the start as the agent now knows it."""
        return StartRecord.from_json(self._call("POST", "/v1/starts", json=record.to_json()))

    def starts(self, since: float = 0.0) -> list[StartRecord]:
        return [StartRecord.from_json(s)
                for s in self._call("GET", "/v1/starts", params={"since": since})]

    def mount(self, request: MountRequest) -> ContainerMount:
        """The container's lazy root (mounted now, or already): ``POST /v1/mounts``."""
        return ContainerMount.from_json(self._call("POST", "/v1/mounts",
                                                   json=request.to_json()))

    def release(self, container_id: str, exit_code: int | None = None,
                rootfs: str | None = None, *, wait: bool = True) -> StartRecord | None:
        """The container stopped: end its recording, unmount, complete its timeline.
        ``rootfs`` is the root the engine ran it on: the agent refuses the release if it
        is not the mount's. Without ``wait``, returns None once the mounts are gone, the
        record following (:meth:`starts`)."""
        params: dict[str, Any] = {} if wait else {"wait": "false"}
        if exit_code is not None:
            params["exit_code"] = exit_code
        if rootfs is not None:
            params["rootfs"] = rootfs
        body = self._call("DELETE", f"/v1/mounts/{container_id}", params=params)
        return StartRecord.from_json(body) if wait else None

    def mounts(self) -> list[dict[str, Any]]:
        """The containers' mounts the agent serves (``GET /v1/mounts``)."""
        return self._call("GET", "/v1/mounts")

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise AgentUnavailable(f"no agent answers on {self.socket_path}: {exc}") from exc
        if not response.is_success:
            raise AgentError(f"agent: {response.text}")
        return response.json()


@contextmanager
def answering_agent(socket_path: Path) -> Iterator[AgentClient | None]:
    """The node agent's client if one answers on ``socket_path``, else None: the one place
    a command decides between asking the agent and doing the work in its own process. A
    socket without an agent behind it (one that died) counts as none."""
    if not socket_path.exists():
        yield None
        return
    with AgentClient(socket_path) as client:
        try:
            client.health()
        except AgentUnavailable:
            yield None
            return
        yield client
