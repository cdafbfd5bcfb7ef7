"""The operator's policy: checkpoint URLs normalised, then matched by whole components;
recording granted per image; and who may read what a store holds (readable_bits)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bootseer.agents.policy import CheckpointPolicy, PolicyError, RecordingPolicy, normalise
from bootseer.errors import ConfigError
from bootseer.store.base import Perm, readable_bits

POLICY = CheckpointPolicy(("hdfs://NN:8020/ckpt/", "webhdfs://nn/models"))


@pytest.mark.parametrize("url, allowed_as", [
    ("hdfs://nn:8020/ckpt/step1", "hdfs://nn:8020/ckpt/step1"),
    ("HDFS://nn/ckpt//step1/./x", "hdfs://nn:8020/ckpt/step1/x"),  # default port, case, //
    ("hdfs://nn:8020/ckpt", "hdfs://nn:8020/ckpt"),
    ("webhdfs://nn:9870/models/a", "webhdfs://nn:9870/models/a"),
])
def test_allowed_urls_come_back_in_their_one_spelling(url, allowed_as) -> None:
    assert POLICY.check(url) == allowed_as


@pytest.mark.parametrize("url, why", [
    ("hdfs://nn:8020/ckpt2/x", "not under a prefix"),  # whole components only
    ("hdfs://nn:8021/ckpt/x", "not under a prefix"),  # another port is another cluster
    ("hdfs://other:8020/ckpt/x", "not under a prefix"),
    ("webhdfs://nn/models/../etc", "'..' is not accepted"),
    ("hdfs://nn:8020/ckpt/%2e%2e/etc", "percent-encoding"),
    ("hdfs://nn:8020/ckpt/x?op=OPEN", "query"),
    ("hdfs://nn:8020/ckpt/x#f", "query or fragment"),
    ("hdfs://u@nn:8020/ckpt/x", "carries no user"),
    ("hdfs://nn:8020/ckpt/x\n", "control characters"),
    ("hdfs://nn:8020/ckpt\\x", "backslashes"),
    ("hdfs://nn:port/ckpt/x", "port is not a number"),
    ("hdfs:///ckpt/x", "names no host"),
    ("file:///etc", "not under a prefix"),
    ("/etc", "not under a prefix"),
    ("", "non-empty"),
])
def test_everything_else_is_refused_naming_the_setting(url, why) -> None:
    with pytest.raises(PolicyError, match=why) as refused:
        POLICY.check(url)
    assert "checkpoint.allowed" in str(refused.value)


def test_file_urls_are_judged_where_their_symlinks_lead(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    (allowed / "step").mkdir(parents=True)
    (allowed / "out").symlink_to("/etc")
    (tmp_path / "alias").symlink_to(allowed)
    policy = CheckpointPolicy((f"file://{tmp_path}/alias/",))  # the prefix resolves too
    assert policy.check(f"file://{allowed}/step") == f"file://{allowed}/step"
    assert policy.check(f"{allowed}/step") == f"file://{allowed}/step"  # a plain path
    with pytest.raises(PolicyError, match="not under"):
        policy.check(f"file://{allowed}/out/shadow")
    with pytest.raises(PolicyError, match="names no host"):
        policy.check(f"file://somehost{allowed}/step")


def test_a_malformed_prefix_is_the_operators_error() -> None:
    with pytest.raises(ConfigError, match="checkpoint.allowed: .*'..'"):
        CheckpointPolicy(("hdfs://nn/ckpt/../",))
    assert CheckpointPolicy(()).prefixes == []


def test_recording_is_granted_per_image_prefix() -> None:
    policy = RecordingPolicy(("team-a/", "trainer"))
    assert policy.effective("team-a/x:1", "always") == "always"
    assert policy.effective("trainer-v2", "auto") == "auto"
    assert policy.effective("team-b/x", "always") == "never"
    assert RecordingPolicy(("*",)).effective("anything", "auto") == "auto"
    assert RecordingPolicy(()).effective("anything", "auto") == "never"


def test_normalise_keeps_the_root_of_a_file_system() -> None:
    assert normalise("hdfs://nn/").url == "hdfs://nn:8020/"
    assert normalise("file:/").url == "file:///"


R, X = 0o444, 0o111  # read bits; search bits


@pytest.mark.parametrize("target, parents, bits", [
    (Perm(1, 1, 0o644), [Perm(0, 0, 0o755)], 0o444),
    (Perm(1, 1, 0o600), [Perm(0, 0, 0o755)], 0o400),
    (Perm(1, 1, 0o644), [Perm(0, 0, 0o700)], 0),  # nobody but root gets through
    (Perm(1, 1, 0o644), [Perm(1, 0, 0o700)], 0o400),  # the owner's own directory
    (Perm(1, 1, 0o644), [Perm(0, 1, 0o750)], 0o040),  # the group's directory: not others
    (Perm(1, 1, 0o204), [Perm(0, 0, 0o755)], 0o004),  # POSIX: the owner is not "other"
    (Perm(1, 1, 0o644), [Perm(2, 2, 0o705)], 0),  # anyone may be in group 2, shut out
    (Perm("alice", "ml", 0o640), [Perm("hdfs", "supergroup", 0o755)], 0o440),
])
def test_readable_bits_never_exceed_who_can_read_the_source(target, parents, bits) -> None:
    assert readable_bits(target, parents) == bits


def test_local_access_follows_the_directories_above(tmp_path: Path) -> None:
    from bootseer.store.local import LocalStore

    store = LocalStore(str(tmp_path))
    store.put("a/f", b"x")
    (tmp_path / "a" / "f").chmod(0o644)
    (tmp_path / "a").chmod(0o750)  # the group may search it, others may not
    assert store.access("a/f").mode & 0o004 == 0
    (tmp_path / "a").chmod(0o700)
    assert store.access("a/f").mode & 0o044 == 0
    assert store.access("a/f").uid == os.getuid()


def test_a_container_joins_only_the_jobs_the_operator_grants() -> None:
    from bootseer.agents.policy import JobPolicy

    closed = JobPolicy(())
    assert closed.effective("tenant-b-train") is None  # by default, none
    assert closed.effective("j", "bootseer-image-run") == "j"  # the operator's own start
    assert closed.effective(None) is None
    granted = JobPolicy(("team-a/", "train-"))
    assert granted.effective("train-7") == "train-7"
    assert granted.effective("tenant-b-train") is None
    assert JobPolicy(("*",)).effective("anything") == "anything"
