"""Startup timelines: the SQLite record, the agent's /v1/starts and /metrics, `bootseer
report`, and a real runc start that reports its phases."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import httpx
import pytest
from support.images import bootseer

from bootseer.agents.client import AgentClient
from bootseer.agents.timeline import PHASES, StartRecord, Timeline
from bootseer.cli.report_cmd import parse_since
from bootseer_dev.engines import start_agent

T0 = 1_800_000_000.0


def _start(sid: str, **phases: float) -> StartRecord:
    return StartRecord(sid, job="j", image="py", workload="train", runtime="runc",
                       phases={p: T0 + v for p, v in phases.items()})


def test_a_record_merges_and_the_first_time_of_a_phase_wins(tmp_path) -> None:
    timeline = Timeline(tmp_path / "t.sqlite")
    timeline.record(_start("a", created=0, image_ready=1.5))
    timeline.record(StartRecord("a", image="other", phases={"image_ready": T0 + 9,
                                                             "ready": T0 + 4}))
    timeline.mark("a", "exited", T0 + 5)
    got = timeline.get("a")
    assert got.image == "py"  # first values win
    assert list(got.phases) == ["created", "image_ready", "ready", "exited"]
    assert got.breakdown() == {"image_ready": 1.5, "ready": 2.5, "exited": 1.0}
    assert got.startup_seconds == 4.0
    with pytest.raises(ValueError, match="unknown phase"):
        timeline.mark("a", "lunch")
    timeline.close()
    reopened = Timeline(tmp_path / "t.sqlite")  # it is a file: it survives the process
    assert reopened.get("a") == got


def test_starts_since_are_listed_oldest_first(tmp_path) -> None:
    timeline = Timeline(tmp_path / "t.sqlite")
    for i, sid in enumerate(["old", "mid", "new"]):
        timeline.record(StartRecord(sid, phases={"created": T0 + 100 * i}))
    assert [s.id for s in timeline.starts()] == ["old", "mid", "new"]
    assert [s.id for s in timeline.starts(since=T0 + 50)] == ["mid", "new"]


def _writer(path: str, prefix: str) -> None:
    timeline = Timeline(Path(path))
    for i in range(50):
        timeline.record(StartRecord(f"{prefix}{i}", phases={"created": T0 + i,
                                                            "ready": T0 + i + 1}))


def test_several_processes_write_one_timeline_and_lose_nothing(tmp_path) -> None:
    path = str(tmp_path / "t.sqlite")
    procs = [multiprocessing.get_context("spawn").Process(target=_writer, args=(path, p))
             for p in "abc"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(Timeline(Path(path)).starts()) == 150


def test_since_takes_durations_and_dates() -> None:
    assert parse_since("30m", now=T0) == T0 - 1800
    assert parse_since("2d", now=T0) == T0 - 172800
    assert parse_since("2027-01-15T12:00:00+00:00") == 1800014400.0
    with pytest.raises(Exception, match="duration ago"):
        parse_since("yesterday")


def test_the_agent_merges_starts_and_counts_them_once_in_its_metrics(agent) -> None:
    _, sock = agent
    stats = {"bytes_fetched": 1000, "cache_hits": 30, "blocks_fetched": 10,
             "prefetch": {"bytes_fetched": 5000, "done": True, "seconds": 0.7}}
    with AgentClient(sock) as client:
        first = _start("s1", created=0, image_ready=2)
        first.detail = {"image": stats}
        client.record_start(first)
        client.record_start(first)  # reported twice: changes nothing
        merged = client.record_start(_start("s1", env_ready=3, ready=3.5, exited=9))
        assert merged.breakdown() == {"image_ready": 2.0, "env_ready": 1.0, "ready": 0.5,
                                      "exited": 5.5}
        assert [s.id for s in client.starts()] == ["s1"]
        with pytest.raises(Exception, match="unknown phase"):
            client.record_start(StartRecord("s2", phases={"lunch": T0}))
    metrics = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock))).get(
        "http://agent/metrics").text
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
               for line in metrics.splitlines() if line and not line.startswith("#")}
    assert samples['bootseer_starts_total{runtime="runc"}'] == 1
    assert samples['bootseer_startup_phase_seconds_count{phase="image_ready"}'] == 1
    assert samples['bootseer_startup_phase_seconds_sum{phase="image_ready"}'] == 2.0
    assert samples['bootseer_startup_phase_seconds_count{phase="env_ready"}'] == 1
    assert samples["bootseer_startup_seconds_sum"] == 3.5
    assert samples['bootseer_fetched_bytes_total{source="demand"}'] == 1000
    assert samples['bootseer_fetched_bytes_total{source="prefetch"}'] == 5000
    assert samples['bootseer_block_reads_total{result="hit"}'] == 30
    assert samples['bootseer_block_reads_total{result="miss"}'] == 10
    assert samples["bootseer_prefetch_seconds_count"] == 1


def test_report_reads_the_timeline_file_without_an_agent(dirs, tmp_path) -> None:
    timeline = Timeline(dirs["cache"] / "timeline.sqlite")
    now = time.time()
    timeline.record(StartRecord("cold", image="py", runtime="runc", phases={
        "created": now - 60, "image_ready": now - 55, "env_ready": now - 50,
        "checkpoint_first_byte": now - 49, "ready": now - 45, "exited": now - 40}))
    timeline.record(StartRecord("warm", image="py", runtime="runc", phases={
        "created": now - 30, "image_ready": now - 29, "env_ready": now - 28.5,
        "ready": now - 28}))
    timeline.record(StartRecord("ancient", image="py", phases={"created": now - 86400 * 3}))
    timeline.close()
    env = {"BOOTSEER_AGENT_SOCKET": str(tmp_path / "none.sock")}
    table = bootseer("report", store=dirs["store"], cache=dirs["cache"], env=env)
    assert "median of 2" in table.stdout and "15.00" in table.stdout  # cold: 60 - 45
    as_json = json.loads(bootseer("report", "--json", "--since", "1h", store=dirs["store"],
                                  cache=dirs["cache"], env=env).stdout)
    assert [s["id"] for s in as_json] == ["cold", "warm"]
    assert as_json[0]["breakdown"]["checkpoint_first_byte"] == pytest.approx(1.0)
    assert as_json[1]["startup_seconds"] == pytest.approx(2.0)
    png = tmp_path / "report.png"
    bootseer("report", "--png", str(png), store=dirs["store"], cache=dirs["cache"], env=env)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_runc_start_reports_every_phase_it_reached(dirs, agent, tmp_path) -> None:
    """A real lazy start in runc, through the agent: the workload marks its environment
    and its readiness, the host adds created, image ready and exit."""
    from bootseer_dev.image import build_image

    _, sock = agent
    env = {"BOOTSEER_AGENT_SOCKET": str(sock)}
    bootseer("image", "convert", str(build_image(with_python=True)), "--name", "py",
             store=dirs["store"], cache=dirs["cache"])
    script = ("python3 -c 'import time; d = \"/run/bootseer/\"; "
              "open(d + \"phase.env_ready\", \"w\").write(str(time.time()))'; "
              "touch \"$BOOTSEER_READY_FILE\"; echo up")
    bootseer("image", "run", "--job", "train-42", "py", "--", "sh", "-c", script,
             store=dirs["store"], cache=dirs["cache"], env=env)
    with AgentClient(sock) as client:
        (start,) = client.starts()
    assert (start.job, start.image, start.runtime) == ("train-42", "py", "bootseer-image-run")
    assert list(start.phases) == ["created", "image_ready", "env_ready", "ready", "exited"]
    assert all(v >= 0 for v in start.breakdown().values())
    assert start.detail["image"]["blocks_fetched"] > 0 and start.detail["exit_code"] == 0
    report = bootseer("report", store=dirs["store"], cache=dirs["cache"], env=env)
    assert "py" in report.stdout and "bootseer-image" in report.stdout
    assert set(PHASES) >= set(start.phases)
    elsewhere = bootseer("image", "run", "py", "--", "true", store=dirs["store"] / "other",
                         cache=dirs["cache"], env=env, check=False)
    assert elsewhere.returncode == 1 and "serves the store" in elsewhere.stderr


MARKS = """
import sys
import bootseer
import bootseer.checkpoint as ckpt
with ckpt.open(sys.argv[1]) as f:
    f.read(10)
    f.read(10)
bootseer.mark_ready()
"""


def test_the_workload_marks_its_phases_and_the_first_mark_stays(dirs, tmp_path) -> None:
    import os
    import subprocess
    import sys

    from bootseer.ready import read_phases

    signal = tmp_path / "signal"
    signal.mkdir()
    (tmp_path / "ckpt.bin").write_bytes(os.urandom(100_000))
    env = {"BOOTSEER_READY_FILE": str(signal / "ready")}
    bootseer("env", "run", "--path", str(tmp_path / "venv"), "--", "mkdir",
             str(tmp_path / "venv"), store=dirs["store"], cache=dirs["cache"], env=env)
    for _ in range(2):
        subprocess.run([sys.executable, "-c", MARKS, str(tmp_path / "ckpt.bin")],
                       env={**os.environ, **env}, check=True, timeout=60)
        marked = read_phases(signal)
        if _ == 0:
            first = marked
    assert list(sorted(first, key=first.get)) == ["env_ready", "checkpoint_first_byte",
                                                  "ready"]
    assert marked == first  # marked again by the second run: the first times stay


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_on_tcp_serve_nothing_else(dirs, tmp_path) -> None:
    port = _free_port()
    proc = start_agent(tmp_path / "a.sock", {
        "BOOTSEER_STORE": f"file://{dirs['store']}", "BOOTSEER_CACHE_DIR": str(dirs["cache"]),
        "BOOTSEER_AGENT_METRICS_LISTEN": f"127.0.0.1:{port}"})
    try:
        for _ in range(100):
            try:
                scrape = httpx.get(f"http://127.0.0.1:{port}/metrics")
                break
            except httpx.ConnectError:
                time.sleep(0.05)
        assert scrape.status_code == 200 and "bootseer_startup_phase_seconds" in scrape.text
        assert httpx.get(f"http://127.0.0.1:{port}/v1/health").status_code == 404
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_socket_refuses_users_outside_its_group(dirs, tmp_path) -> None:
    """Mode 0660, group agent.group: a member may talk to the agent, anyone else is refused
    by the kernel (here the group is nogroup, whose member is nobody)."""
    import os
    import subprocess
    import sys
    import tempfile

    run_dir = Path(tempfile.mkdtemp(prefix="bootseer-perm-"))
    run_dir.chmod(0o755)  # reachable by all: only the socket's own mode decides
    sock = run_dir / "agent.sock"
    proc = start_agent(sock, {"BOOTSEER_STORE": f"file://{dirs['store']}",
                               "BOOTSEER_CACHE_DIR": str(dirs["cache"]),
                               "BOOTSEER_AGENT_GROUP": "nogroup"})
    probe = ("import sys, httpx; c = httpx.Client(transport=httpx.HTTPTransport(uds=sys.argv[1]))"
             "\ntry:\n    print(c.get('http://agent/v1/health').status_code)"
             "\nexcept httpx.TransportError as e:\n    print('refused', e)")

    def as_user(uid: int, gid: int) -> str:
        return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                               sys.executable, "-c", probe, str(sock)], capture_output=True,
                              text=True, timeout=60, env={**os.environ, "HOME": "/"}).stdout
    try:
        assert sock.stat().st_mode & 0o777 == 0o660
        assert as_user(65534, 65534).strip() == "200"  # nobody, in nogroup
        refused = as_user(65533, 65533)
        assert refused.startswith("refused") and "Permission denied" in refused
    finally:
        proc.terminate()
        proc.wait(30)
        subprocess.run(["rm", "-rf", str(run_dir)], check=False)
