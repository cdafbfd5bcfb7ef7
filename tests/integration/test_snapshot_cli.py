"""``bootseer env`` end to end: real processes, a real venv with a real ``pip install``,
two publishers racing for one key, a restorer polling while a publisher publishes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from support.snapshots import bootseer, remove_target, tiny_wheel, tree_state


def test_env_run_installs_once_then_restores_and_a_failed_command_publishes_nothing(
        tmp_path: Path) -> None:
    store, venv, ran = tmp_path / "store", tmp_path / "node" / "venv", tmp_path / "ran"
    wheel = tiny_wheel(tmp_path)
    lock = tmp_path / "requirements.lock"
    lock.write_text("tiny==1.0\n")
    install = (f"{sys.executable} -m venv --without-pip {venv} && "
               f"{sys.executable} -m pip --python {venv}/bin/python install -q --no-index "
               f"--disable-pip-version-check --no-cache-dir {wheel} && echo ran >> {ran}")
    run = ("env", "run", "--path", str(venv), "--key-file", str(lock), "--", "sh", "-c", install)
    first = bootseer(*run, store=store)
    key = first.stdout.strip()
    assert "published snapshot" in first.stderr and ran.read_text() == "ran\n"
    installed = tree_state(venv)
    assert any(p.endswith(".pyc") and "tiny" in p for p in installed)
    remove_target(venv)  # a fresh node

    second = bootseer(*run, store=store)
    assert second.stdout.strip() == key and "the command was not run" in second.stderr
    assert ran.read_text() == "ran\n" and tree_state(venv) == installed
    out = subprocess.run([venv / "bin" / "python", "-c", "import tiny; print(tiny.ANSWER)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout == "42\n"

    listing = bootseer("env", "ls", store=store).stdout
    assert listing.startswith(key) and str(venv) in listing
    show = bootseer("env", "show", key, store=store).stdout
    assert "tiny/__init__.py" in show and "bin/python -> " in show

    failed = bootseer("env", "run", "--path", str(tmp_path / "w"), "--", "sh", "-c",
                      f"mkdir -p {tmp_path}/w && echo x > {tmp_path}/w/f && exit 7",
                      store=store, check=False)
    assert failed.returncode == 7 and "nothing was published" in failed.stderr
    assert bootseer("env", "ls", store=store).stdout == listing

    bootseer("env", "rm", key, store=store)
    assert bootseer("env", "ls", store=store).stdout == ""
    # A node that has it unpacked still mounts it (a node cache, like staged shards);
    # one that has not finds nothing.
    gone = bootseer("env", "restore", key, store=store, check=False,
                    env={"BOOTSEER_CACHE_DIR": str(tmp_path / "another-node")})
    assert gone.returncode == 1 and gone.stderr.startswith("error: no snapshot")


WRITER = """
import os, sys, time
target, go = sys.argv[1], sys.argv[2]
os.makedirs(target, exist_ok=True)
for n in range(int(sys.argv[3])):
    open(os.path.join(target, f"f{n:03}"), "w").write(str(n) * 3000)
while not os.path.exists(go):
    time.sleep(0.005)
"""


def test_two_publishers_of_one_key_race_and_one_wins(tmp_path: Path) -> None:
    store, go = tmp_path / "store", tmp_path / "go"
    procs = [subprocess.Popen(
        [sys.executable, "-m", "bootseer", "env", "snapshot", "--key", "same", "--path",
         str(tmp_path / f"node{n}"), "--", sys.executable, "-c", WRITER,
         str(tmp_path / f"node{n}"), str(go), "50"],
        env={**os.environ, "BOOTSEER_STORE": f"file://{store}"}, stderr=subprocess.PIPE,
        text=True) for n in (1, 2)]
    time.sleep(1.0)  # both are running their command
    go.touch()
    errs = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert sorted("published by another node" in e for e in errs) == [False, True], errs
    winner = tmp_path / ("node1" if "published snapshot" in errs[0] else "node2")
    captured = tree_state(winner)
    subprocess.run(["rm", "-rf", str(winner)], check=True)
    bootseer("env", "restore", "same", store=store)
    assert tree_state(winner) == captured


POLLER = """
import sys, time
from bootseer.store import BlobStore, open_store
from bootseer.snapshot.restore import load_manifest, restore
blobs = BlobStore(open_store(sys.argv[1]))
misses = 0
while True:
    try:
        manifest = load_manifest(blobs, "polled")
    except FileNotFoundError:
        misses += 1
        time.sleep(0.002)
        continue
    break
restore(blobs, manifest)
print(misses, len(manifest.shards))
"""


def test_a_restorer_polling_during_a_publish_never_sees_a_partial_snapshot(
        tmp_path: Path) -> None:
    store, target = tmp_path / "store", tmp_path / "node" / "t"
    poller = subprocess.Popen([sys.executable, "-c", POLLER, f"file://{store}"],
                              stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)  # polling
    bootseer("env", "snapshot", "--key", "polled", "--path", str(target), "--",
             sys.executable, "-c", WRITER, str(target), str(tmp_path), "200",
             store=store, env={"BOOTSEER_SNAPSHOT_SHARD_SIZE": "8k"})
    published = tree_state(target)
    out, _ = poller.communicate(timeout=60)
    misses, shards = map(int, out.split())
    assert poller.returncode == 0 and misses > 0 and shards >= 50
    assert tree_state(target) == published
