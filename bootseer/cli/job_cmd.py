"""``bootseer job``: what a whole job's restart needs of the store, before and after.

``fanout`` raises the replication of what every node of the job reads (its image's
manifest and hot pack, its snapshots' shards, its checkpoints) in proportion to the nodes
that will read it, bounded by the DataNodes there are; ``restore`` lowers it again once the
job is up (:mod:`bootseer.agents.fanout`). Both are the scheduler's (or the operator's) to
run, as the same user on the same host: what ``fanout`` changed is recorded in that user's
own state, never in the store, where anyone could forge it. They change only what HDFS
keeps, never the bytes.
"""

from __future__ import annotations

import click

from bootseer.cli import AppContext, pass_app
from bootseer.errors import BootseerError
from bootseer.prefetch.hotlist import DEFAULT_WORKLOAD
from bootseer.progress import console


@click.group()
def job() -> None:
    """Prepare the store for a whole job's restart, and undo it."""


def _job_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """NAME as a job's name must be (it names a record), or a usage error naming why."""
    from bootseer.agents import fields

    try:
        return fields.name(value, "job", fields.JOB)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@job.command("fanout")
@click.argument("name", callback=_job_name)
@click.option("--nodes", type=click.IntRange(min=1), required=True,
              help="Nodes that will restart at once and read these objects.")
@click.option("--image", "images", multiple=True, help="A lazy image the job runs.")
@click.option("--workload", default=DEFAULT_WORKLOAD, show_default=True,
              help="Whose hot pack (the image's hot list of this workload).")
@click.option("--env", "envs", multiple=True, help="A snapshot key the job restores.")
@click.option("--checkpoint", "checkpoints", multiple=True,
              help="A checkpoint file or directory every data-parallel group reads.")
@click.option("--readers-per-replica", type=click.IntRange(min=1), default=4,
              show_default=True, help="Nodes one replica serves at once.")
@click.option("--max-replicas", type=click.IntRange(min=1, max=512), required=True,
              help="At most this many replicas: the DataNodes that can hold one.")
@pass_app
def fanout(app: AppContext, name: str, nodes: int, images: tuple[str, ...], workload: str,
           envs: tuple[str, ...], checkpoints: tuple[str, ...], readers_per_replica: int,
           max_replicas: int) -> None:
    """Give what every node of job NAME reads more replicas before its restart."""
    from bootseer.agents import fanout as plan
    from bootseer.stripedfs.files import CheckpointSource

    if not (images or envs or checkpoints):
        raise click.UsageError("name what the job reads: --image, --env or --checkpoint")
    replicas = plan.replicas_for(nodes, readers_per_replica, max_replicas)
    source = CheckpointSource(app.loaded.config)
    wanted = [plan.image_objects(app.blobs, image, workload) for image in images]
    wanted += [plan.snapshot_objects(app.blobs, key) for key in envs]
    wanted += [plan.checkpoint_objects(source, url) for url in checkpoints]
    changes = plan.fan_out(wanted, replicas)
    plan.save(app.store.url, name, (app.store.url, *checkpoints), changes)
    objects = sum(len(w.keys) for w in wanted)
    console.print(f"job {name}: {len(changes)} of {objects} objects now kept {replicas}-fold "
                  f"for {nodes} nodes (the rest had as many, or their store has no "
                  f"replication); undo with `bootseer job restore {name}`")


@job.command("restore")
@click.argument("name", callback=_job_name)
@pass_app
def restore(app: AppContext, name: str) -> None:
    """Put back the replication a fan-out of job NAME raised (run it as the user, and on
    the host, that ran the fan-out: the record is theirs)."""
    from bootseer.agents import fanout as plan
    from bootseer.stripedfs.files import CheckpointSource

    record = plan.load(app.store.url, name)
    if record is None:
        raise BootseerError(f"job {name} has no fan-out to restore with the store "
                            f"{app.store.url} (records: {plan.record_dir()})")
    source = CheckpointSource(app.loaded.config)
    restored = plan.restore(record, source.store)
    plan.forget(app.store.url, name)
    console.print(f"job {name}: {restored} of {len(record.changes)} objects back to their "
                  f"replication")
