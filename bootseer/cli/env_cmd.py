"""``bootseer env``: run a dependency install once, snapshot it, restore it everywhere.

``env run`` is the everyday command; ``snapshot`` publishes under a key you name (no key
derivation: you vouch for what determines the result), ``restore``, ``ls``, ``show`` and
``rm`` work on published snapshots, ``key`` prints the key ``run`` would use and why.

``run`` and ``snapshot`` exit with the command's exit status (0 after a restore).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

import click

from bootseer.cli import AppContext, pass_app
from bootseer.errors import BootseerError
from bootseer.nodecache import NodeCache, NodeCaches
from bootseer.progress import byte_progress, console
from bootseer.ready import mark_phase
from bootseer.snapshot.config import SnapshotOptions
from bootseer.snapshot.key import KeyInputs, key_material, snapshot_key
from bootseer.snapshot.manifest import REF_PREFIX
from bootseer.snapshot.run import CaptureOutcome, capture_command, env_run
from bootseer.units import format_size

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@click.group()
def env() -> None:
    """Snapshot what a command installs; restore it instead of running it again."""


def _options(app: AppContext, bytecode: bool | None = None) -> SnapshotOptions:
    """The config file's ``[snapshot]`` options, ``--bytecode/--no-bytecode`` over them."""
    options = SnapshotOptions.from_config(app.loaded.config.snapshot)
    return options if bytecode is None else replace(options, bytecode=bytecode)


def _shard_cache(app: AppContext) -> NodeCache:
    """Shards `bootseer warm --env` staged on this node; restores read them from here."""
    return NodeCaches.for_config(app.loaded.config).snapshots()


def _key_options(f):
    for decorator in reversed([
        click.option("--path", "paths", multiple=True, required=True,
                     type=click.Path(path_type=Path),
                     help="Target directory the command installs into (repeatable)."),
        click.option("--key-file", "key_files", multiple=True,
                     type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="File whose contents determine the result, e.g. a lock file."),
        click.option("--env-var", "env_vars", multiple=True, metavar="NAME",
                     help="Environment variable whose value determines the result."),
        click.argument("command", nargs=-1, required=True),
    ]):
        f = decorator(f)
    return f


def _bytecode_option(f):
    return click.option("--bytecode/--no-bytecode", default=None,
                        help="Compile the captured .py files first (default: config "
                             "snapshot.bytecode, on).")(f)


def _inputs(command, paths, key_files, env_vars) -> KeyInputs:
    return KeyInputs(tuple(command), tuple(key_files), tuple(env_vars), tuple(paths))


@env.command("key")
@_key_options
@click.option("--json", "as_json", is_flag=True, help="Also print what the key is made of.")
def key_cmd(command, paths, key_files, env_vars, as_json: bool) -> None:
    """Print the snapshot key `env run` would use for COMMAND."""
    material = key_material(_inputs(command, paths, key_files, env_vars))
    key = snapshot_key(material)
    click.echo(json.dumps({"key": key, "inputs": material}, indent=2) if as_json else key)


@env.command("run")
@_key_options
@_bytecode_option
@pass_app
def run_cmd(app: AppContext, command, paths, key_files, env_vars, bytecode) -> None:
    """Restore COMMAND's snapshot if there is one, else run it and publish what it changed.

    Example: bootseer env run --path /opt/venv --key-file requirements.lock --
    /opt/venv/bin/pip install -r requirements.lock
    """
    with byte_progress("env", None) as advance:
        outcome = env_run(app.blobs, _inputs(command, paths, key_files, env_vars),
                          environ=os.environ, options=_options(app, bytecode),
                          on_progress=advance, cache=_shard_cache(app))
    click.echo(outcome.key)
    if outcome.restored is not None or outcome.mounted_by_agent or \
            (outcome.capture and outcome.capture.exit_code == 0):
        mark_phase("env_ready")  # for `bootseer report`, when inside a Bootseer start
    if outcome.mounted_by_agent:
        console.print(f"snapshot {outcome.key[:12]} is mounted in this container by the "
                      "node agent; the command was not run")
        return
    if outcome.restored is not None:
        r = outcome.restored
        how = "mounted the node's tree of" if r.mounted else "restored"
        console.print(f"{how} snapshot {r.key[:12]}: {r.files} entries, "
                      f"{format_size(r.bytes)} from {r.shards} shards in {r.seconds:.2f} s; "
                      f"the command was not run")
        return
    assert outcome.capture is not None
    _report_capture(outcome.key, outcome.capture)


def _report_capture(key: str, capture: CaptureOutcome) -> None:
    if capture.manifest is None:
        console.print(f"the command exited with status {capture.exit_code}; nothing was "
                      f"published")
    elif capture.published:
        m = capture.manifest
        console.print(f"published snapshot {key}: {len(m.entries)} entries, "
                      f"{format_size(m.content_bytes)} in {len(m.shards)} shards, "
                      f"{len(m.deleted)} deletions")
    else:
        console.print(f"snapshot {key} was published by another node meanwhile; its copy "
                      f"is kept, this environment is complete as is")
    sys.exit(capture.exit_code)


@env.command("snapshot")
@click.option("--key", "key", required=True,
              help="Name to publish under (letters, digits, '.', '_', '-').")
@click.option("--path", "paths", multiple=True, required=True, type=click.Path(path_type=Path),
              help="Target directory to capture (repeatable).")
@_bytecode_option
@click.argument("command", nargs=-1, required=True)
@pass_app
def snapshot_cmd(app: AppContext, key: str, paths, bytecode, command) -> None:
    """Run COMMAND and publish what it changed under the --path directories as KEY.

    The previous state is the directories just before COMMAND runs, so COMMAND is the whole
    change, e.g. `env snapshot --key torch-2.3 --path /opt/venv -- sh -c '...'`.
    """
    if not _NAME_RE.match(key):
        raise BootseerError(f"invalid snapshot key {key!r}: use letters, digits, '.', '_', '-'")
    with byte_progress("snapshot", None) as advance:
        capture = capture_command(app.blobs, key, list(command), list(paths),
                                  environ=os.environ, options=_options(app, bytecode),
                                  on_progress=advance)
    _report_capture(key, capture)


@env.command("restore")
@click.argument("key")
@click.option("--path", "paths", multiple=True, type=click.Path(path_type=Path),
              help="Where to restore, one per captured target in their order (repeatable; "
                   "default: where it was captured). Elsewhere needs --relocate.")
@click.option("--relocate", is_flag=True,
              help="Restore under the --path directories although the snapshot was "
                   "captured elsewhere, rewriting its absolute paths (shebangs, "
                   "pyvenv.cfg, activate, .pth, ...) to them.")
@pass_app
def restore_cmd(app: AppContext, key: str, paths, relocate: bool) -> None:
    """Restore snapshot KEY where it was captured, or with --relocate under --path."""
    from bootseer.snapshot.mount import mount_prestaged, restore_here
    from bootseer.snapshot.restore import OPEN_AHEAD, FirstShards, load_manifest

    if relocate and not paths:
        raise click.UsageError("--relocate needs the new location: one --path per target "
                               "of the snapshot (see `bootseer env show KEY`)")
    options = _options(app)
    targets = tuple(os.path.abspath(p) for p in paths) or None
    cache = _shard_cache(app)
    r, moved = mount_prestaged(cache, key, options, targets), ""
    if r is None:
        with FirstShards(options.concurrency + OPEN_AHEAD) as first:
            manifest = load_manifest(app.blobs, key, cache, first)
            with byte_progress(f"restoring {key[:12]}", manifest.content_bytes) as advance:
                r = restore_here(app.blobs, manifest, targets=targets, relocate=relocate,
                                 options=options, on_progress=advance, cache=cache,
                                 first=first)
        if r.targets != manifest.targets:
            moved = (f" (relocated from {', '.join(manifest.targets)}; {r.relocated} "
                     f"files rewritten)")
    how = "mounted the node's tree of it at" if r.mounted else "restored"
    console.print(f"{how} {', '.join(r.targets)}{moved}: {r.files} entries, "
                  f"{format_size(r.bytes)} from {r.shards} shards in {r.seconds:.2f} s")


@env.command("unmount")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@pass_app
def unmount_cmd(app: AppContext, paths) -> None:
    """Unmount the environments mounted at PATHS by a restore (their writes are dropped;
    each directory is as it was before)."""
    from bootseer.snapshot.mount import unmount_env

    for path in paths:
        if unmount_env(_shard_cache(app), path):
            console.print(f"unmounted the environment at {os.path.abspath(path)}")
        else:
            console.print(f"{os.path.abspath(path)}: no environment is mounted there")


@env.command("ls")
@pass_app
def ls_cmd(app: AppContext) -> None:
    """List published snapshots: key, entries, bytes, created, host, targets."""
    for name in app.blobs.list_refs(REF_PREFIX):
        ref = app.blobs.get_ref(name)
        meta = ref.meta
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ref.created))
        click.echo("\t".join([name[len(REF_PREFIX):], str(meta.get("files", "?")),
                              str(meta.get("bytes", "?")), created, str(meta.get("host")),
                              ",".join(meta.get("targets") or [])]))


@env.command("show")
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="The whole manifest as JSON.")
@pass_app
def show_cmd(app: AppContext, key: str, as_json: bool) -> None:
    """Show snapshot KEY's manifest: creation info, targets, every path."""
    from dataclasses import asdict

    from bootseer.snapshot.restore import load_manifest

    m = load_manifest(app.blobs, key)
    if as_json:
        click.echo(json.dumps({"key": m.key, "targets": m.targets, "created": m.created,
                               "shards": [asdict(s) for s in m.shards],
                               "deleted": [asdict(d) for d in m.deleted],
                               "entries": [e._asdict() for e in m.entries]}, indent=2))
        return
    created = m.created
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created.get("time", 0)))
    click.echo(f"key       {m.key}\ntargets   {' '.join(m.targets)}\n"
               f"created   {when}"
               f" on {created.get('host')} by bootseer {created.get('bootseer')}\n"
               f"command   {' '.join(created.get('argv') or [])}\n"
               f"entries   {len(m.entries)} ({format_size(m.content_bytes)} of files) in "
               f"{len(m.shards)} shards ({format_size(sum(s.size for s in m.shards))})\n"
               f"deletions {len(m.deleted)}")
    for e in m.entries:
        detail = f" -> {e.link}" if e.link else ""
        click.echo(f"{e.kind:8} {e.mode:04o} {e.size:>10} {m.targets[e.target]}/{e.path}"
                   f"{detail}")
    for d in m.deleted:
        click.echo(f"deleted  {m.targets[d.target]}/{d.path}")


@env.command("rm")
@click.argument("key")
@pass_app
def rm_cmd(app: AppContext, key: str) -> None:
    """Remove snapshot KEY's name; its blobs stay (other snapshots may share them)."""
    app.blobs.delete_ref(REF_PREFIX + key)
    console.print(f"removed snapshot {key}")
