"""Hostile job records (hypothesis): start records in the store, fan-out records in the
scheduler's state.

Any node, and anyone who can write the store, writes ``jobs/<job>/starts/...``; a fan-out
record is the scheduler's, but is read back from a file. Whatever they hold, ``bootseer
report --job`` and ``bootseer job restore`` must skip or refuse it in one line (never a
traceback), within bounded memory, and a restore must touch nothing outside the record's
roots.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tracemalloc

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bootseer import userstate
from bootseer.agents import fanout, jobreport
from bootseer.agents.policy import normalise
from bootseer.agents.timeline import StartRecord
from bootseer.errors import BootseerError
from bootseer.store import open_store

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=10)
DEPTH = st.integers(min_value=33, max_value=150_000)


def _nested(valid: dict) -> st.SearchStrategy[bytes]:
    """``valid`` with one field nested ``DEPTH`` levels, or brackets alone (closed or
    not), or a string full of brackets and escapes."""
    field = st.tuples(st.sampled_from(sorted(valid)), DEPTH, st.sampled_from("[{")).map(
        lambda t: json.dumps({**valid, t[0]: None}).replace(
            f'"{t[0]}": null', f'"{t[0]}": ' + ("[" * t[1] + "]" * t[1] if t[2] == "["
                                                 else '{"a":' * t[1] + "1" + "}" * t[1])))
    bare = st.tuples(st.sampled_from(["[", '{"a":', '["\\"', '["\\\\",']), DEPTH).map(
        lambda t: t[0] * t[1])
    quoted = DEPTH.map(lambda n: json.dumps({**valid, "x": "[\\" * n}))
    return (field | bare | quoted).map(str.encode)


def _record_bytes(valid: dict) -> st.SearchStrategy[bytes]:
    """What a hostile writer might put where ``valid`` belongs."""
    replaced = st.tuples(st.sampled_from(sorted(valid)), JSON).map(
        lambda kv: json.dumps({**valid, kv[0]: kv[1]}, allow_nan=True).encode())
    huge = st.integers(1, 3).map(lambda n: json.dumps({**valid, "pad": "a" * (n * 100_000)})
                                 .encode())
    return st.one_of(replaced, JSON.map(lambda v: json.dumps(v, allow_nan=True).encode()),
                     st.binary(max_size=300), _nested(valid), huge,
                     st.just(json.dumps(valid).encode()))


VALID_START = StartRecord("s", job="j", phases={"created": 1.0, "ready": 2.0},
                          detail={"exit_code": 0}).to_json()
FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@FUZZ
@given(records=st.lists(_record_bytes(VALID_START), min_size=1, max_size=6))
def test_start_records_are_read_or_skipped_within_bounded_memory(tmp_path_factory,
                                                                 records) -> None:
    store = open_store(f"file://{tmp_path_factory.mktemp('starts')}")
    for n, data in enumerate(records):
        store.put(jobreport.key("j", f"n{n}", f"s{n}"), data)
    tracemalloc.start()
    try:
        starts = jobreport.load(store, "j")  # anything but a skip is a failure here
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak  # each record is at most 128 KiB and parsed on its own
    for item in starts:
        assert item.start.job == "j" and item.start.detail == {}
        assert set(item.start.phases) <= {"created", "image_ready", "env_ready",
                                          "checkpoint_first_byte", "ready", "exited"}
    jobreport.summarize("j", starts)


def _fanout_bytes(store: str) -> st.SearchStrategy[bytes]:
    """Records of job "j" fanned out with ``store``, its checkpoint root beside it, whose
    changes name places in, near and outside those roots, in many spellings."""
    ckpt = store.rsplit("/", 1)[0] + "/ckpt/step1"
    valid = fanout.Record("j", store, (store, ckpt), (
        fanout.Change(store, "packs/ab", 3, 8), fanout.Change(ckpt, "rank0.pt", 3, 8),
    )).to_json()
    scheme, _, path = store.partition("://")
    spellings = [store, ckpt, f"{scheme}://{path.split('/', 1)[0]}/", store + "2",
                 f"{store}/../x", f"{ckpt}/..", f"{store}/./packs", store.upper(), ""]
    change = st.fixed_dictionaries({
        "store": st.sampled_from(spellings) | st.text(max_size=30),
        "key": st.sampled_from(["packs/ab", "../x", "a//b", ".tmp/x", "", "/abs", "rank0.pt"])
        | st.text(max_size=20),
        "before": st.integers(-2, 600) | JSON, "after": st.integers(1, 600)})
    changes = st.lists(change, max_size=6).map(
        lambda cs: json.dumps({**valid, "changes": cs}, allow_nan=True).encode())
    return _record_bytes(valid) | changes


STORE = "hdfs://nn:8020/bootseer"


class _Recorder:
    """A store opener that records what a restore would change, and changes nothing."""

    def __init__(self) -> None:
        self.touched: list[str] = []

    def __call__(self, url: str) -> _Recorder:
        self.url = url
        return self

    def set_replication(self, key: str, replicas: int) -> bool:
        self.touched.append(f"{self.url.rstrip('/')}/{key}")
        return True


@FUZZ
@given(data=_fanout_bytes(STORE))
def test_fanout_records_are_refused_or_restored_only_under_their_roots(data) -> None:
    userstate.write(fanout.record_dir(), fanout._record_name(STORE, "j"), data)
    tracemalloc.start()
    try:
        record = fanout.load(STORE, "j")
    except BootseerError:  # refused, in one line
        return
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 16 << 20, peak
    assert record is not None
    opener = _Recorder()
    fanout.restore(record, opener)
    roots = []
    for root in record.roots:
        with contextlib.suppress(ValueError):  # an ambiguous root holds nothing
            roots.append(normalise(root))
    for url in opener.touched:
        assert any(normalise(url).within(root) for root in roots), url


def _bootseer(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bootseer", *args], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ))


CLI = settings(FUZZ, max_examples=25)


@CLI
@given(records=st.lists(_record_bytes(VALID_START), min_size=1, max_size=3))
def test_report_job_exits_cleanly_whatever_the_records(tmp_path_factory, records) -> None:
    store = tmp_path_factory.mktemp("report")
    for n, data in enumerate(records):
        open_store(f"file://{store}").put(jobreport.key("j", f"n{n}", f"s{n}"), data)
    report = _bootseer("--store", f"file://{store}", "report", "--job", "j", "--json")
    assert report.returncode in (0, 1), report.stderr
    assert "Traceback" not in report.stderr, report.stderr
    if report.returncode == 0:
        assert json.loads(report.stdout)["job"] == "j"


@CLI
@given(data=st.data())
def test_job_restore_exits_cleanly_whatever_the_record(tmp_path_factory, data) -> None:
    store = open_store(f"file://{tmp_path_factory.mktemp('restore')}/store")
    store.put("packs/ab", b"x")
    record = data.draw(_fanout_bytes(store.url))
    userstate.write(fanout.record_dir(), fanout._record_name(store.url, "j"), record)
    restored = _bootseer("--store", store.url, "job", "restore", "j")
    assert restored.returncode in (0, 1), restored.stderr
    assert "Traceback" not in restored.stderr, restored.stderr
