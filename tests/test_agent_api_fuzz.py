"""Random and malformed bodies to every endpoint of a real agent (hypothesis).

Whoever is in the socket's group (and, through the shim and the hook, whoever writes a
container's annotations) writes these bodies. Every answer must be a 2xx or a 4xx, never
a 5xx, and a refused request must leave nothing behind: no mount, no container
directory, no start record. A body that happens to be valid may succeed; a mount made
that way is released again.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_prefetch_lazy import big_image, bootseer

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
                   "job": "j", "runtime": "fuzz", "checkpoints": {}, "namespace": ""},
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


BODIES = st.one_of(
    st.tuples(st.sampled_from(sorted(VALID)), JSON.map(lambda v: ("json", v))),
    st.tuples(st.sampled_from(sorted(VALID)),
              st.binary(max_size=200).map(lambda b: ("raw", b))),
    *(st.tuples(st.just(path), _mutated(path).map(lambda v: ("json", v))) for path in VALID),
)


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    for name in ("store", "cache", "image", "agent-cache"):
        (root / name).mkdir()
    bootseer("image", "convert", str(big_image(root / "image")), "--name", "big",
             store=root / "store", cache=root / "cache")
    sock = root / "run" / "agent.sock"
    proc = start_agent(sock, {"BOOTSEER_STORE": f"file://{root / 'store'}",
                              "BOOTSEER_CACHE_DIR": str(root / "agent-cache"),
                              "BOOTSEER_CHECKPOINT_ALLOWED": f"file://{root}/ckpt/"})
    client = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)),
                          base_url="http://agent", timeout=120)
    yield client, root / "agent-cache" / "containers"
    client.close()
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    for container in (root / "agent-cache" / "containers").glob("*"):
        unmount(container / "rootfs")
        unmount(container / "lower")


def _state(client: httpx.Client, containers: Path) -> tuple[list, list, int]:
    mounts = client.get("/v1/mounts").json()
    starts = client.get("/v1/starts").json()
    return mounts, sorted(p.name for p in containers.iterdir()), len(starts)


def _nothing_new(client: httpx.Client, containers: Path, before: tuple) -> None:
    mounts, directories, starts = _state(client, containers)
    assert (mounts, directories) == ([], []), (mounts, directories)
    assert starts == before[2], "a refused request left a start record"


FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@FUZZ
@given(request=BODIES)
def test_posted_bodies_get_4xx_and_leave_nothing(agent, request) -> None:
    client, containers = agent
    path, (kind, body) = request
    before = _state(client, containers)
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


@FUZZ
@given(mount_id=st.text(max_size=60) | HOSTILE_STRINGS,
       query=st.dictionaries(st.sampled_from(["exit_code", "rootfs", "x"]),
                             st.text(max_size=20) | HOSTILE_STRINGS, max_size=3))
def test_releases_of_anything_get_4xx(agent, mount_id, query) -> None:
    client, containers = agent
    before = _state(client, containers)
    answer = client.delete(f"/v1/mounts/{quote(mount_id, safe='')}", params=query)
    assert 400 <= answer.status_code < 500, (mount_id, query, answer.text)
    _nothing_new(client, containers, before)


@FUZZ
@given(path=st.sampled_from(["/v1/health", "/v1/starts", "/v1/mounts", "/metrics"]),
       since=st.text(max_size=20) | st.floats(allow_nan=True).map(str),
       body=st.binary(max_size=100))
def test_reads_answer_without_5xx(agent, path, since, body) -> None:
    client, containers = agent
    before = _state(client, containers)
    answer = client.request("GET", path, params={"since": since}, content=body)
    assert answer.status_code < 500, (path, since, answer.text)
    _nothing_new(client, containers, before)
