"""Job-wide reports: every node's agent publishes its starts of a job to the store, while
they run; ``bootseer report --job`` shows the whole restart and who held it back."""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

import pytest
from support.images import bootseer

from bootseer.agents import jobreport
from bootseer.agents.client import AgentClient
from bootseer.agents.jobreport import NodeStart, summarize
from bootseer.agents.mountapi import MountRequest
from bootseer.agents.timeline import StartRecord
from bootseer.store import open_store
from bootseer_dev.engines import start_agent


def _start(sid: str, created: float, **seconds: float) -> StartRecord:
    """A start reaching each phase the given seconds after the one before."""
    phases, at = {"created": created}, created
    for phase, step in seconds.items():
        at += step
        phases[phase] = at
    return StartRecord(sid, job="j", phases=phases)


def test_the_summary_takes_each_nodes_latest_start_and_names_who_held_it_back() -> None:
    starts = [NodeStart(f"n{i}", _start(f"s{i}", 100.0, image_ready=1.0, env_ready=2.0 + i,
                                        ready=0.5)) for i in range(10)]
    starts.append(NodeStart("n3", _start("old", 10.0, image_ready=50.0, ready=1.0)))
    starts.append(NodeStart("n9", _start("slow", 101.0, image_ready=30.0, ready=0.5)))
    summary = summarize("j", starts, slowest=2)
    assert summary.nodes == 10  # n3's older start is not part of this restart, n9's is
    assert summary.phases["image_ready"].p50 == 1.0 and summary.phases["image_ready"].max == 30
    assert summary.phases["env_ready"].p50 == 6.0 and summary.phases["env_ready"].max == 10.0
    assert summary.startup.p50 == 7.5 and summary.startup.p99 == summary.startup.max == 30.5
    (first, second) = summary.slowest
    assert (first.node, first.slowest_phase, first.phase_seconds) == ("n9", "image_ready", 30)
    assert (second.node, second.slowest_phase) == ("n8", "env_ready")
    assert json.loads(json.dumps(summary.to_json()))["slowest"][0]["node"] == "n9"


def test_hostile_objects_in_the_store_are_skipped(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}")
    jobreport.publish(store, "good", _start("s1", 1.0, image_ready=1.0))
    store.put(jobreport.key("j", "big", "s2"), b"{" + b" " * (200 << 10) + b"}")
    store.put(jobreport.key("j", "bad", "s3"), b"not json")
    store.put(jobreport.key("j", "other", "s4"),
              json.dumps(StartRecord("s4", job="k", phases={"created": 1.0}).to_json()).encode())
    store.put(jobreport.key("j", "evil", "s5"),
              json.dumps({"id": "s5", "job": "j", "phases": {"owned": 1}}).encode())
    assert [(s.node, s.start.id) for s in jobreport.load(store, "j")] == [("good", "s1")]
    with pytest.raises(ValueError):
        jobreport.load(store, "../x")


def _tiny_entries(size: int) -> dict[str, int]:
    """A ``detail`` of ``size`` bytes of JSON in entries as small as they come: the most
    Python objects a record of that size can make."""
    return {f"k{i:05}": 0 for i in range(size // len('"k00000": 0, '))}


def test_a_report_keeps_only_what_it_shows_of_each_record(tmp_path: Path) -> None:
    """300 records of 63 KiB of tiny ``detail`` entries took 0.9 MiB each held whole
    (87 GiB for the 100,000 a report may read); what the report shows is a few hundred
    bytes of each."""
    store = open_store(f"file://{tmp_path}")
    detail = _tiny_entries(63 << 10)
    for n in range(300):
        record = StartRecord(f"s{n}", job="j", phases={"created": n, "ready": n + 1.5},
                             detail=detail)
        store.put(jobreport.key("j", f"n{n}", f"s{n}"), json.dumps(record.to_json()).encode())
    assert len(store.get(jobreport.key("j", "n0", "s0"))) > 63 << 10
    tracemalloc.start()
    try:
        starts = jobreport.load(store, "j")
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(starts) == 300 and starts[0].start.detail == {}
    assert summarize("j", starts).startup.max == 1.5
    assert peak < 10 << 20 and held < 2 << 20, (held, peak)


def test_a_nested_or_oversized_record_is_skipped_and_the_report_runs(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path / 'store'}")
    jobreport.publish(store, "good", _start("s1", 1.0, image_ready=1.0, ready=2.0))
    store.put(jobreport.key("j", "deep", "s2"), b"[" * (100 << 10))
    store.put(jobreport.key("j", "deeper", "s3"), json.dumps(
        {"id": "s3", "job": "j", "phases": {"created": 1.0}}).encode()[:-1]
        + b', "detail": {"x": ' + b"[" * 5000 + b"]" * 5000 + b"}}")
    store.put(jobreport.key("j", "huge", "s4"), b'{"id": "s4", "job": "j", "x": "'
              + b"a" * (200 << 10) + b'"}')
    report = bootseer("report", "--job", "j", "--json", store=tmp_path / "store",
                      cache=tmp_path / "cache")
    assert json.loads(report.stdout)["nodes"] == 1
    assert "Traceback" not in report.stderr
    assert report.stderr.count("skipping") == 3, report.stderr


def _agents(store: Path, tmp_path: Path, nodes: list[str]):
    return {node: start_agent(tmp_path / node / "agent.sock",
                              {"BOOTSEER_STORE": f"file://{store}",
                               "BOOTSEER_CACHE_DIR": str(tmp_path / node / "cache"),
                               "BOOTSEER_AGENT_NODE_NAME": node,
                               # the operator lets containers join jobs by annotation
                               "BOOTSEER_AGENT_JOBS": "*"}) for node in nodes}


def test_nodes_publish_their_starts_while_they_run_and_the_report_shows_the_job(
        dirs, tmp_path: Path) -> None:
    from bootseer_dev.image import build_image

    bootseer("image", "convert", str(build_image(with_python=True)), "--name", "py",
             store=dirs["store"], cache=dirs["cache"])
    agents = _agents(dirs["store"], tmp_path, ["node-a", "node-b"])
    store = open_store(f"file://{dirs['store']}")
    try:
        # node-a: a start that says it is ready while it runs: published before it ends.
        with AgentClient(tmp_path / "node-a" / "agent.sock") as client:
            mount = client.mount(MountRequest("c1", "py", job="train-7", record="never"))
            (Path(mount.signal_dir) / "phase.env_ready").write_text(str(time.time()))
            (Path(mount.signal_dir) / "ready").write_text("1")
            deadline = time.monotonic() + 20
            while True:
                published = jobreport.load(store, "train-7")
                if published and "ready" in published[0].start.phases:
                    break
                assert time.monotonic() < deadline, published
                time.sleep(0.2)
            assert published[0].node == "node-a"
            assert "exited" not in published[0].start.phases  # still running
            client.release("c1", exit_code=0)
        # node-b: a real start in runc, through `bootseer image run --job`.
        bootseer("image", "run", "--job", "train-7", "py", "--", "sh", "-c",
                 "sleep 0.3; touch \"$BOOTSEER_READY_FILE\"", store=dirs["store"],
                 cache=dirs["cache"],
                 env={"BOOTSEER_AGENT_SOCKET": str(tmp_path / "node-b" / "agent.sock")})
        report = json.loads(bootseer("report", "--job", "train-7", "--json",
                                     store=dirs["store"], cache=dirs["cache"]).stdout)
        assert report["nodes"] == 2 and report["startup"]["max"] > 0
        assert {"image_ready", "ready", "exited"} <= set(report["phases"])
        assert {lag["node"] for lag in report["slowest"]} == {"node-a", "node-b"}
        table = bootseer("report", "--job", "train-7", store=dirs["store"], cache=dirs["cache"])
        assert "node-a" in table.stdout and "node-b" in table.stdout and "p99" in table.stdout
        png = tmp_path / "job.png"
        bootseer("report", "--job", "train-7", "--png", str(png), store=dirs["store"],
                 cache=dirs["cache"])
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        for proc in agents.values():
            proc.kill()
            proc.wait()
