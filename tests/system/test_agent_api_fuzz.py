"""Random and malformed bodies and methods to every endpoint of a real agent (hypothesis).

Whoever is in the socket's group (and, through the shim and the hook, whoever writes a
container's annotations) writes these bodies. Every answer must be a 2xx or a 4xx, never
a 5xx nor a traceback in the agent's log, and a refused request must leave nothing
behind: no mount, no container directory, no start record. A body that happens to be
valid may succeed; a mount made that way is released again. Bodies nested thousands of
levels deep get a 400; a ``HEAD`` is checked as its ``GET`` (a group member's ``HEAD
/v1/mounts`` is refused as its ``GET`` is), and a method the API does not use gets 405.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.images import big_image, bootseer
from support.users import as_nobody

from bootseer.mounts import unmount
from bootseer_dev.engines import start_agent

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=4),
    max_leaves=12)

#: Valid bodies of each endpoint (the image "big" exists): mutations of these reach the
#: checks deep inside, not just the first "is it an object".
VALID = {
    "/v1/mounts": {"id": "fuzz", "image": "big", "workload": "default", "record": "never",
                   "job": "j", "runtime": "fuzz", "checkpoints": {}, "namespace": "",
                   "pod": "default/fuzz"},
    "/v1/warm": {"image": "big", "workload": "default", "all": False, "envs": [],
                 "checkpoints": []},
    "/v1/starts": {"id": "fuzz-start", "job": "j", "image": "big", "workload": "w",
                   "runtime": "r", "phases": {"created": 1.0}, "detail": {}},
}
HOSTILE_STRINGS = st.sampled_from([
    "../../etc", "/etc/shadow", "file:///etc", "-rf", "--store=file:///", "a" * 5000, "\0",
    "x\ny", "big/../big", "sha256:" + "0" * 64, "", " ", "%2e%2e", "*", "..", "é"])


def _mutated(path: str) -> st.SearchStrategy:
    valid = VALID[path]
    replace = st.tuples(st.sampled_from(sorted(valid)), JSON | HOSTILE_STRINGS).map(
        lambda kv: {**valid, kv[0]: kv[1]})
    drop = st.sampled_from(sorted(valid)).map(
        lambda k: {key: v for key, v in valid.items() if key != k})
    extra = st.tuples(st.text(max_size=10), JSON).map(lambda kv: {**valid, kv[0]: kv[1]})
    return replace | drop | extra


def _nested(path: str) -> st.SearchStrategy:
    """A body nested far deeper than any real one (the agent reads at most 1 MiB): bare,
    closed or not, or in a field of a valid body."""
    depth = st.integers(min_value=33, max_value=200_000)
    opener = st.sampled_from(["[", '{"a":', '{"a":[', '["\\"', '["\\\\",'])
    bare = st.tuples(opener, depth, st.booleans()).map(
        lambda t: t[0] * t[1] + ("]" * t[1] if t[2] and t[0] == "[" else ""))
    inside = st.tuples(st.sampled_from(sorted(VALID[path])), depth).map(
        lambda t: json.dumps({**VALID[path], t[0]: None})[:-1].replace(
            '"' + t[0] + '": null', '"' + t[0] + '": ' + "[" * t[1] + "]" * t[1]) + "}")
    return (bare | inside).map(lambda text: ("raw", text.encode()))


BODIES = st.one_of(
    st.tuples(st.sampled_from(sorted(VALID)), JSON.map(lambda v: ("json", v))),
    st.tuples(st.sampled_from(sorted(VALID)),
              st.binary(max_size=200).map(lambda b: ("raw", b))),
    *(st.tuples(st.just(path), _mutated(path).map(lambda v: ("json", v))) for path in VALID),
    *(st.tuples(st.just(path), _nested(path)) for path in VALID),
)
#: Every route of the API, by the methods it answers (``{id}``: any mount's key).
ROUTES = {"/v1/health": {"GET"}, "/v1/warm": {"POST"}, "/v1/starts": {"GET", "POST"},
          "/metrics": {"GET"}, "/v1/mounts": {"GET", "POST"}, "/v1/mounts/x": {"DELETE"},
          "/v1/p2p/read": {"POST"}, "/v1/p2p/read-file": {"POST"}}
#: Methods the API does not use: refused on every route, whoever asks.
UNLISTED = ["PUT", "PATCH", "OPTIONS", "TRACE", "PROPFIND", "SEARCH"]


class Agent(NamedTuple):
    client: httpx.Client  # root's
    containers: Path
    sock: Path  # reachable by nobody, in the socket's group ("nogroup")
    log: Path


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    for name in ("store", "cache", "image", "agent-cache"):
        (root / name).mkdir()
    bootseer("image", "convert", str(big_image(root / "image")), "--name", "big",
             store=root / "store", cache=root / "cache")
    run = Path(tempfile.mkdtemp(prefix="bootseer-fuzz-"))
    run.chmod(0o755)  # the socket's group reaches the socket (0660, group "nogroup")
    sock = run / "agent.sock"
    proc = start_agent(sock, {"BOOTSEER_STORE": f"file://{root / 'store'}",
                              "BOOTSEER_CACHE_DIR": str(root / "agent-cache"),
                              "BOOTSEER_CHECKPOINT_ALLOWED": f"file://{root}/ckpt/",
                              "BOOTSEER_AGENT_GROUP": "nogroup"})
    client = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)),
                          base_url="http://agent", timeout=120)
    yield Agent(client, root / "agent-cache" / "containers", sock, proc.log)
    client.close()
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    for container in (root / "agent-cache" / "containers").glob("*"):
        unmount(container / "rootfs")
        unmount(container / "lower")
    shutil.rmtree(run)


def _state(client: httpx.Client, containers: Path) -> tuple[list, list, int]:
    mounts = client.get("/v1/mounts").json()
    starts = client.get("/v1/starts").json()
    return mounts, sorted(p.name for p in containers.iterdir()), len(starts)


def _nothing_new(client: httpx.Client, containers: Path, before: tuple) -> None:
    mounts, directories, starts = _state(client, containers)
    assert (mounts, directories) == ([], []), (mounts, directories)
    assert starts == before[2], "a refused request left a start record"


def _no_traceback(agent: Agent, since: int) -> None:
    """Nothing the agent logged from offset ``since`` on is a traceback."""
    with open(agent.log, "rb") as log:
        log.seek(since)
        text = log.read().decode(errors="replace")
    assert "Traceback" not in text, text[text.index("Traceback") - 2000:][:6000]


FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@FUZZ
@given(request=BODIES)
def test_posted_bodies_get_4xx_and_leave_nothing(agent, request) -> None:
    client, containers = agent.client, agent.containers
    path, (kind, body) = request
    before, logged = _state(client, containers), agent.log.stat().st_size
    if kind == "json":
        answer = client.post(path, content=json.dumps(body, allow_nan=True).encode(),
                             headers={"Content-Type": "application/json"})
    else:
        answer = client.post(path, content=body)
    assert answer.status_code < 500, (path, body, answer.status_code, answer.text)
    if answer.status_code >= 400:
        _nothing_new(client, containers, before)
    elif path == "/v1/mounts":  # a valid body: the mount is real, give it back
        assert client.delete(f"/v1/mounts/{answer.json()['id']}").status_code == 200
        assert _state(client, containers)[:2] == ([], [])
    elif path == "/v1/warm":  # errors of a started warm travel in its stream
        events = [json.loads(line) for line in answer.text.splitlines() if line]
        assert events[-1]["event"] in ("result", "error"), events
    _no_traceback(agent, logged)


@FUZZ
@given(mount_id=st.text(max_size=60) | HOSTILE_STRINGS,
       query=st.dictionaries(st.sampled_from(["exit_code", "rootfs", "wait", "x"]),
                             st.text(max_size=20) | HOSTILE_STRINGS, max_size=3))
def test_releases_of_anything_get_4xx(agent, mount_id, query) -> None:
    client, containers = agent.client, agent.containers
    before, logged = _state(client, containers), agent.log.stat().st_size
    answer = client.delete(f"/v1/mounts/{quote(mount_id, safe='')}", params=query)
    assert 400 <= answer.status_code < 500, (mount_id, query, answer.text)
    _nothing_new(client, containers, before)
    _no_traceback(agent, logged)  # a request line aiohttp cannot parse: one line logged


@FUZZ
@given(path=st.sampled_from(["/v1/health", "/v1/starts", "/v1/mounts", "/metrics"]),
       since=st.text(max_size=20) | st.floats(allow_nan=True).map(str),
       body=st.binary(max_size=100))
def test_reads_answer_without_5xx(agent, path, since, body) -> None:
    client, containers = agent.client, agent.containers
    before = _state(client, containers)
    answer = client.request("GET", path, params={"since": since}, content=body)
    assert answer.status_code < 500, (path, since, answer.text)
    _nothing_new(client, containers, before)


@FUZZ
@given(method=st.sampled_from(["HEAD", *UNLISTED]),
       path=st.sampled_from(sorted(ROUTES)) | st.text(max_size=30).map(lambda t: "/" + quote(t)),
       body=st.binary(max_size=100) | st.integers(33, 50_000).map(lambda n: b"[" * n))
def test_any_method_on_any_route_answers_without_5xx(agent, method, path, body) -> None:
    """HEAD on every endpoint runs its GET's handler, or gets 405 where there is none;
    a method the API does not use gets 405 everywhere."""
    client, containers = agent.client, agent.containers
    before, logged = _state(client, containers), agent.log.stat().st_size
    answer = client.request(method, path, content=body)
    assert answer.status_code < 500, (method, path, answer.status_code, answer.text)
    if method in UNLISTED:
        assert answer.status_code == 405, (method, path, answer.status_code)
    elif path in ROUTES:
        assert answer.status_code == (200 if "GET" in ROUTES[path] else 405), (path, answer)
    _nothing_new(client, containers, before)
    _no_traceback(agent, logged)


def _as_group_member(sock: Path, requests: list[tuple[str, str]]) -> list[int]:
    """The statuses of ``requests`` (method, path) made by ``nobody``, a member of the
    socket's group, in one process."""
    probe = ("import json, sys, httpx\n"
             "c = httpx.Client(transport=httpx.HTTPTransport(uds=sys.argv[1]), timeout=60)\n"
             "print(json.dumps([c.request(m, 'http://agent' + p).status_code"
             " for m, p in json.loads(sys.argv[2])]))")
    out = as_nobody(sys.executable, "-c", probe, sock, json.dumps(requests),
                     exec_from_shell=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_group_member_gets_a_root_only_listing_by_no_method(agent) -> None:
    """``HEAD /v1/mounts`` ran the root-only handler for anyone (200, with the listing's
    size); it is the GET it heads, refused. No other method reaches a handler either."""
    logged = agent.log.stat().st_size
    requests = [("HEAD", "/v1/mounts"), ("GET", "/v1/mounts"), ("HEAD", "/v1/health"),
                ("HEAD", "/v1/starts"), ("HEAD", "/metrics"),
                *((method, path) for method in UNLISTED for path in ROUTES)]
    statuses = dict(zip(requests, _as_group_member(agent.sock, requests)))
    assert statuses.pop(("HEAD", "/v1/mounts")) == 403
    assert statuses.pop(("GET", "/v1/mounts")) == 403
    assert [statuses.pop(("HEAD", path)) for path in ("/v1/health", "/v1/starts",
                                                      "/metrics")] == [200, 200, 200]
    assert set(statuses.values()) == {405}, statuses
    assert agent.client.head("/v1/mounts").status_code == 200  # root's, as its GET
    _no_traceback(agent, logged)
