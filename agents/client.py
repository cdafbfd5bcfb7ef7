"""Talk to the node agent over its Unix socket, for the CLI, the mount servers, the
runtime shim and the OCI hook.

HTTP/1.1 from the standard library (:mod:`http.client`), one connection per call: the
shim and the hook are Python processes on every container's start and stop, and a client
library's import (httpx: about 0.1 s, its command line's dependencies included) would be
the largest part of their time; a Unix socket's connect costs microseconds, and a
connection per call is safe from every thread of a mount server. What only some calls
need (the timeline's records, a warm's summary), they import.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from bootseer.agents.mountapi import ContainerMount, MountRequest, PeerFileRead, PeerRead
from bootseer.errors import BootseerError

if TYPE_CHECKING:
    from bootseer.agents.timeline import StartRecord
    from bootseer.agents.warm import WarmRequest, WarmSummary
    from bootseer.store import ObjectInfo

#: Longest a mount server waits for the agent's read through peers (it then reads the
#: store): the agent's own bound (p2p.demand_wait + the swarm's timeout) and a margin.
PEER_READ_TIMEOUT = 30.0


class AgentUnavailable(BootseerError):
    """No agent answers on the socket (none runs, or it died and left its socket)."""


class AgentError(BootseerError):
    """The agent answered with an error; the message is the agent's."""


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over the agent's Unix socket; ``timeout`` bounds the connect and the send."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("bootseer-agent", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


#: What a call that never got its answer raises: no agent, it died, or it did not answer
#: in time (socket.timeout is an OSError).
_TRANSPORT_ERRORS = (OSError, http.client.HTTPException)


class AgentClient:
    def __init__(self, socket_path: Path, timeout: float = 10.0,
                 answer_timeout: float = 600.0) -> None:
        """``timeout`` bounds connecting and sending; ``answer_timeout`` waiting for an
        answer (a mount starts a server; a release waits for its report). A warm's
        stream has no answer timeout: it reports progress, and a warm may wait its turn."""
        self.socket_path = socket_path
        self.timeout, self.answer_timeout = timeout, answer_timeout

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass  # no connection outlives its call

    @contextmanager
    def _request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                 json_body: Any = None, stream: bool = False,
                 ) -> Iterator[http.client.HTTPResponse]:
        """One call's response (its status and headers read), on a connection of its own;
        a ``stream`` (a warm's events) is waited for as long as it takes."""
        connection = _UnixConnection(str(self.socket_path), self.timeout)
        try:
            body = None if json_body is None else json.dumps(json_body).encode()
            headers = {"Content-Type": "application/json"} if body is not None else {}
            connection.request(method, quote(path) + (f"?{urlencode(params)}" if params
                                                      else ""), body=body, headers=headers)
            assert connection.sock is not None
            connection.sock.settimeout(None if stream else self.answer_timeout)
            with connection.getresponse() as response:
                yield response
        finally:
            connection.close()

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
            with self._request("POST", path, json_body=body) as response:
                data = response.read()
        except _TRANSPORT_ERRORS:
            return None
        return data if response.status == 200 else None

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/v1/health")

    def warm(self, request: WarmRequest, *,
             on_plan: Callable[[int], None] | None = None,
             on_progress: Callable[[int], None] | None = None) -> WarmSummary:
        """Ask the agent to stage what ``request`` names; its summary when done."""
        from bootseer.agents.warm import WarmSummary

        body = request.to_json()
        try:
            with self._request("POST", "/v1/warm", json_body=body, stream=True) as response:
                if response.status != 200:
                    raise AgentError(f"agent: {response.read().decode(errors='replace')}")
                for line in response:
                    if not line.strip():
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
        except _TRANSPORT_ERRORS as exc:
            raise AgentUnavailable(f"no agent answers on {self.socket_path}: {exc}") from exc
        raise AgentError("the agent ended the warm without a result")

    def record_start(self, record: StartRecord) -> StartRecord:
        """Merge ``record`` into the node's timeline; the start as the agent now knows it."""
        from bootseer.agents.timeline import StartRecord

        return StartRecord.from_json(self._call("POST", "/v1/starts",
                                                json_body=record.to_json()))

    def starts(self, since: float = 0.0) -> list[StartRecord]:
        from bootseer.agents.timeline import StartRecord

        return [StartRecord.from_json(s)
                for s in self._call("GET", "/v1/starts", params={"since": since})]

    def mount(self, request: MountRequest) -> ContainerMount:
        """The container's lazy root (mounted now, or already): ``POST /v1/mounts``."""
        return ContainerMount.from_json(self._call("POST", "/v1/mounts",
                                                   json_body=request.to_json()))

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
        if not wait:
            return None
        from bootseer.agents.timeline import StartRecord

        return StartRecord.from_json(body)

    def mounts(self) -> list[dict[str, Any]]:
        """The containers' mounts the agent serves (``GET /v1/mounts``)."""
        return self._call("GET", "/v1/mounts")

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON answer of a call; :class:`AgentError` with the agent's words if it
        refused (any status but 2xx)."""
        try:
            with self._request(method, path, **kwargs) as response:
                status, data = response.status, response.read()
        except _TRANSPORT_ERRORS as exc:
            raise AgentUnavailable(f"no agent answers on {self.socket_path}: {exc}") from exc
        if not 200 <= status < 300:
            raise AgentError(f"agent: {data.decode(errors='replace')}")
        return json.loads(data)


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
