"""The node agent serving ``bootseer warm``: through the agent, without one, and with a
dead agent's socket left behind."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

from support.images import bootseer, recorded_big_image
from support.snapshots import published_venv

from bootseer.agents.client import AgentClient


def test_warm_goes_through_a_running_agent(dirs, agent) -> None:
    proc, sock = agent
    recorded_big_image(dirs)
    env = {"BOOTSEER_AGENT_SOCKET": str(sock)}
    with AgentClient(sock) as client:
        assert client.health()["pid"] == proc.pid
    assert sock.stat().st_mode & 0o777 == 0o660
    first = json.loads(bootseer("warm", "--image", "big", "--workload", "train", "--json",
                                store=dirs["store"], cache=dirs["cache"], env=env).stdout)
    assert first["via"] == "agent" and first["complete"]
    assert first["image"]["fetched_blocks"] == 3
    # The agent used its own cache (the node's), not the caller's.
    assert (dirs["agent-cache"] / "blocks" / "entries").is_dir()
    assert not (dirs["cache"] / "blocks").exists()
    again = json.loads(bootseer("warm", "--image", "big", "--workload", "train", "--json",
                                store=dirs["store"], cache=dirs["cache"], env=env).stdout)
    assert again["image"]["already_local"] == 3 and again["image"]["fetched_blocks"] == 0
    key, _, _ = published_venv(dirs["store"].parent)  # an environment snapshot, same store
    both = json.loads(bootseer("warm", "--image", "big", "--workload", "train", "--env", key,
                               "--json", store=dirs["store"], cache=dirs["cache"],
                               env=env).stdout)
    assert both["via"] == "agent" and both["complete"]
    assert both["envs"][0]["fetched_shards"] == both["envs"][0]["shards"] >= 1
    assert (dirs["agent-cache"] / "snapshots" / "entries").is_dir()
    bad = bootseer("warm", "--image", "nope", store=dirs["store"], cache=dirs["cache"],
                   env=env, check=False)
    assert bad.returncode == 1 and "error:" in bad.stderr and "nope" in bad.stderr
    proc.send_signal(signal.SIGTERM)  # graceful: exits 0 and removes its socket
    assert proc.wait(20) == 0 and not sock.exists()


def test_warm_without_an_agent_or_with_a_dead_ones_socket(dirs, tmp_path: Path) -> None:
    recorded_big_image(dirs)
    sock = tmp_path / "agent.sock"
    env = {"BOOTSEER_AGENT_SOCKET": str(sock)}
    alone = json.loads(bootseer("warm", "--image", "big", "--workload", "train", "--json",
                                store=dirs["store"], cache=dirs["cache"], env=env).stdout)
    assert alone["via"] == "standalone" and alone["complete"]
    dead = socket.socket(socket.AF_UNIX)  # bound, never listening: what a killed agent leaves
    dead.bind(str(sock))
    out = bootseer("warm", "--image", "big", "--workload", "train", "--json",
                   store=dirs["store"], cache=dirs["cache"] / "other", env=env)
    assert json.loads(out.stdout)["via"] == "standalone"
    assert "no agent answers" in out.stderr
    required = bootseer("warm", "--agent", "--image", "big", store=dirs["store"],
                        cache=dirs["cache"], env=env, check=False)
    assert required.returncode == 1 and "bootseer agent" in required.stderr
    dead.close()
