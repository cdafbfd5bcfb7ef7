"""``bootseer warm --env``: a snapshot's shards staged on a node; a restore then needs
nothing but its manifest from the store, and through the agent it works the same."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from support.snapshots import bootseer, published_venv, remove_target, tiny_wheel, tree_state


def test_warm_env_stages_the_shards_and_a_restore_reads_them_locally(tmp_path: Path) -> None:
    key, venv, run = published_venv(tmp_path)
    store, cache = tmp_path / "store", tmp_path / "cache"
    installed = tree_state(venv)
    env = {"BOOTSEER_CACHE_DIR": str(cache)}
    summary = json.loads(bootseer("warm", "--env", key, "--json", store=store, env=env).stdout)
    staged = summary["envs"][0]
    assert summary["complete"] and summary["image"] is None
    assert staged["shards"] >= 1 and staged["fetched_shards"] == staged["shards"]
    again = json.loads(bootseer("warm", "--env", key, "--json", store=store, env=env).stdout)
    assert again["envs"][0]["already_local"] == staged["shards"]
    # The shards leave the store: the node restores from what it staged.
    manifest = json.loads(bootseer("env", "show", key, "--json", store=store).stdout)
    for shard in manifest["shards"]:
        hexdigest = shard["digest"].removeprefix("sha256:")
        (store / "blobs" / "sha256" / hexdigest[:2] / hexdigest).unlink()
    remove_target(venv)
    restored = bootseer(*run, store=store, env=env)
    assert "the command was not run" in restored.stderr and tree_state(venv) == installed
    # Without the staged shards the same restore fails, clearly, and changes nothing.
    remove_target(venv)
    gone = bootseer("env", "restore", key, store=store, check=False,
                    env={"BOOTSEER_CACHE_DIR": str(tmp_path / "empty")})
    assert gone.returncode == 1 and gone.stderr.startswith("error:") and not venv.exists()


def test_warm_env_reports_what_it_could_not_stage(tmp_path: Path) -> None:
    key, _, _ = published_venv(tmp_path)
    store = tmp_path / "store"
    manifest = json.loads(bootseer("env", "show", key, "--json", store=store).stdout)
    hexdigest = manifest["shards"][0]["digest"].removeprefix("sha256:")
    (store / "blobs" / "sha256" / hexdigest[:2] / hexdigest).unlink()
    out = bootseer("warm", "--env", key, "--json", store=store, check=False,
                   env={"BOOTSEER_CACHE_DIR": str(tmp_path / "cache")})
    assert out.returncode == 3 and json.loads(out.stdout)["envs"][0]["missing"] == 1
    assert "shards are not local" in out.stderr
    nothing = bootseer("warm", store=store, check=False)
    assert nothing.returncode == 2 and "give --image and/or --env" in nothing.stderr


def test_env_run_publishes_and_restores_through_hdfs(hdfs_cluster, tmp_path: Path) -> None:
    """The same install, with the real HDFS cluster as the store."""
    url = f"{hdfs_cluster.namenode_rpc_url}/test-env-{tmp_path.name}"
    venv, wheel = tmp_path / "node" / "venv", tiny_wheel(tmp_path)
    install = (f"{sys.executable} -m venv --without-pip {venv} && "
               f"{sys.executable} -m pip --python {venv}/bin/python install -q --no-index "
               f"--disable-pip-version-check --no-cache-dir {wheel}")
    run = ("--store", url, "env", "run", "--path", str(venv), "--", "sh", "-c", install)
    first = bootseer(*run, store=tmp_path / "unused")
    installed = tree_state(venv)
    remove_target(venv)
    second = bootseer(*run, store=tmp_path / "unused")
    assert second.stdout == first.stdout and "the command was not run" in second.stderr
    assert tree_state(venv) == installed


def test_a_warmed_restore_reads_nothing_from_the_store(tmp_path: Path) -> None:
    """The warm stages the manifest with the shards (``keys/<key>`` names its digest): with
    the store emptied, the node restores from its cache alone. A record that names a
    damaged or unknown entry is not trusted: the store is asked instead."""
    key, venv, run = published_venv(tmp_path)
    store, cache = tmp_path / "store", tmp_path / "cache"
    env = {"BOOTSEER_CACHE_DIR": str(cache)}
    bootseer("warm", "--env", key, store=store, env=env)
    record = cache / "snapshots" / "keys" / key
    assert len(record.read_text()) == 64
    installed = tree_state(venv)
    remove_target(venv)
    store.rename(tmp_path / "store-gone")
    restored = bootseer(*run, store=store, env=env)
    assert "the command was not run" in restored.stderr and tree_state(venv) == installed
    (tmp_path / "store-gone").rename(store)
    for forged in ("0" * 64, "../../../etc/passwd"):
        record.write_text(forged)
        remove_target(venv)
        again = bootseer(*run, store=store, env=env)
        assert "the command was not run" in again.stderr and tree_state(venv) == installed


def test_a_warmed_restore_never_connects_to_hdfs(hdfs_cluster, tmp_path: Path) -> None:
    """Warmed from the real cluster, the restore runs with the store's NameNode gone (an
    address where nothing listens): the store is opened but never connected to."""
    url = f"{hdfs_cluster.namenode_rpc_url}/test-env-{tmp_path.name}"
    venv, wheel = tmp_path / "node" / "venv", tiny_wheel(tmp_path)
    install = (f"{sys.executable} -m venv --without-pip {venv} && "
               f"{sys.executable} -m pip --python {venv}/bin/python install -q --no-index "
               f"--disable-pip-version-check --no-cache-dir {wheel}")
    command = ("env", "run", "--path", str(venv), "--", "sh", "-c", install)
    env = {"BOOTSEER_CACHE_DIR": str(tmp_path / "cache")}
    key = bootseer("--store", url, *command, store=tmp_path / "unused").stdout.strip()
    installed = tree_state(venv)
    bootseer("--store", url, "warm", "--env", key, store=tmp_path / "unused", env=env)
    remove_target(venv)
    restored = bootseer("--store", "hdfs://127.0.0.1:9/nothing-listens", *command,
                        store=tmp_path / "unused", env=env)
    assert "the command was not run" in restored.stderr and tree_state(venv) == installed
