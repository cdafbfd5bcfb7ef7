"""Configuration precedence, provenance and error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from bootseer.config import load_config
from bootseer.errors import ConfigError


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_defaults(tmp_path: Path) -> None:
    loaded = load_config(files=[], environ={})
    assert loaded.config.log_level == "warning"
    assert loaded.config.hdfs.replication is None
    assert set(loaded.sources.values()) == {"default"}
    assert loaded.config.store.startswith("file://")


def test_precedence_file_env_flag(tmp_path: Path) -> None:
    system = write(tmp_path / "system.toml", 'store = "file:///sys"\nlog_level = "info"\n'
                   '[hdfs]\nreplication = 2\nblock_size = "64m"\n')
    user = write(tmp_path / "user.toml", 'store = "file:///user"\n')
    env = {"BOOTSEER_STORE": "file:///env", "BOOTSEER_HDFS_REPLICATION": "3"}
    loaded = load_config(files=[system, user], environ=env, flags={"store": "file:///flag"})
    c, src = loaded.config, loaded.sources
    assert (c.store, src["store"]) == ("file:///flag", "flag --store")
    assert (c.hdfs.replication, src["hdfs.replication"]) == (3, "env BOOTSEER_HDFS_REPLICATION")
    assert (c.hdfs.block_size, src["hdfs.block_size"]) == (64 << 20, str(system))
    assert (c.log_level, src["log_level"]) == ("info", str(system))
    assert src["hdfs.user"] == "default"
    without_flag = load_config(files=[system, user], environ={})
    assert (without_flag.config.store, without_flag.sources["store"]) == ("file:///user", str(user))


def test_explicit_file_from_environment(tmp_path: Path) -> None:
    extra = write(tmp_path / "extra.toml", "[hdfs]\nkerberos = true\n")
    loaded = load_config(environ={"BOOTSEER_CONFIG": str(extra)})
    assert loaded.config.hdfs.kerberos is True
    assert loaded.sources["hdfs.kerberos"] == str(extra)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(environ={"BOOTSEER_CONFIG": str(tmp_path / "missing.toml")})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[hdfs]\nreplication = 'three'\n", "hdfs.replication: expected an integer"),
        ("[hdfs]\nreplicaton = 3\n", "unknown setting 'hdfs.replicaton'"),
        ("[hdfs]\nblock_size = 'big'\n", "hdfs.block_size: expected a size"),
        ("store = [1]\n", "store: expected a string"),
        ("store = \n", "not valid TOML"),
    ],
)
def test_bad_file_values_name_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path / "c.toml", text)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(files=[path], environ={})
    assert str(path) in str(info.value)


def test_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="env BOOTSEER_HDFS_KERBEROS: hdfs.kerberos"):
        load_config(files=[], environ={"BOOTSEER_HDFS_KERBEROS": "maybe"})


def test_optional_values_can_be_reset_from_the_environment(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", "[hdfs]\nuser = 'alice'\n")
    loaded = load_config(files=[path], environ={"BOOTSEER_HDFS_USER": ""})
    assert loaded.config.hdfs.user is None


def test_lists_and_modes(tmp_path: Path) -> None:
    f = write(tmp_path / "c.toml", '[checkpoint]\nallowed = ["hdfs://nn/ckpt/", "file:///d"]\n'
                                   'mount_mode = "0440"\n[image]\nrecord_images = ["*"]\n')
    c = load_config(files=[f], environ={}).config
    assert c.checkpoint.allowed == ("hdfs://nn/ckpt/", "file:///d")
    assert c.checkpoint.mount_mode == 0o440 and c.image.record_images == ("*",)
    env = load_config(files=[], environ={"BOOTSEER_CHECKPOINT_ALLOWED": "a/, b/",
                                         "BOOTSEER_CHECKPOINT_MOUNT_MODE": "0o400"}).config
    assert env.checkpoint.allowed == ("a/", "b/") and env.checkpoint.mount_mode == 0o400
    assert load_config(files=[], environ={}).config.checkpoint.allowed == ()
    for text, message in (('[checkpoint]\nallowed = "x"\n', None),
                          ("[checkpoint]\nallowed = [1]\n", "expected a list of strings"),
                          ('[checkpoint]\nmount_mode = "0999"\n', "octal permission bits"),
                          ("[checkpoint]\nmount_mode = 0o1777\n", "octal permission bits")):
        path = write(tmp_path / "bad.toml", text)
        if message is None:  # one string is a list of one
            assert load_config(files=[path], environ={}).config.checkpoint.allowed == ("x",)
            continue
        with pytest.raises(ConfigError, match=message):
            load_config(files=[path], environ={})
