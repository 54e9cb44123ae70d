"""config.toml editing keeps invariant S5: re-read, atomic, keeps what it does not own,
refuses a malformed file untouched."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import tomlkit

from runnerctl.errors import ConfigError
from runnerctl.runner_config import (
    RunnerConfigFile,
    raise_concurrent,
    replace_owned_entries,
    restore_concurrent,
)

ORIGINAL = """\
# managed partly by hand: keep this comment
concurrent = 4
check_interval = 3
log_level = "info"  # inline comment too

[session_server]
  session_timeout = 1800

[[runners]]
  name = "someone-elses-runner"
  url = "https://gitlab.example.com"
  token = "glrt-not-ours"
  executor = "shell"

[[runners]]
  name = "runnerctl/h/gpu0"
  url = "https://gitlab.example.com"
  id = 11
  token = "glrt-ours"
  executor = "custom"
  pre_build_script = "echo set by hand"
"""


def _file(tmp_path: Path, text: str = ORIGINAL) -> RunnerConfigFile:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return RunnerConfigFile(path)


def test_edit_keeps_comments_unknown_keys_and_foreign_entries(tmp_path: Path) -> None:
    config = _file(tmp_path)
    config.edit(lambda doc: replace_owned_entries(
        doc, {"runnerctl/h/gpu0": {"name": "runnerctl/h/gpu0", "limit": 1},
              "runnerctl/h/gpu1": {"name": "runnerctl/h/gpu1", "executor": "custom"}},
        retire=set()))
    text = config.path.read_text()
    assert "# managed partly by hand: keep this comment" in text
    assert "# inline comment too" in text
    assert "session_timeout = 1800" in text
    assert 'token = "glrt-not-ours"' in text
    assert 'pre_build_script = "echo set by hand"' in text  # key inside our entry we do not own
    assert 'token = "glrt-ours"' in text
    owned = config.owned_entries()
    assert set(owned) == {"runnerctl/h/gpu0", "runnerctl/h/gpu1"}
    assert owned["runnerctl/h/gpu0"]["limit"] == 1


def test_retire_removes_only_that_entry(tmp_path: Path) -> None:
    config = _file(tmp_path)
    config.edit(lambda doc: replace_owned_entries(doc, {}, retire={"runnerctl/h/gpu0"}))
    text = config.path.read_text()
    assert "runnerctl/h/gpu0" not in text
    assert "someone-elses-runner" in text and "# managed partly by hand" in text


def test_written_atomically_with_mode_0600_and_no_temp_left(tmp_path: Path) -> None:
    config = _file(tmp_path)
    os.chmod(config.path, 0o644)
    inode_before = config.path.stat().st_ino
    config.edit(lambda doc: doc.__setitem__("concurrent", 8))
    assert stat.S_IMODE(config.path.stat().st_mode) == 0o600
    assert config.path.stat().st_ino != inode_before  # a rename, not an in-place rewrite
    assert [p.name for p in tmp_path.iterdir()] == ["config.toml"]


def test_no_change_leaves_file_alone(tmp_path: Path) -> None:
    config = _file(tmp_path)
    before = config.path.stat()
    config.edit(lambda doc: None)
    after = config.path.stat()
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)


def test_rewrite_by_gitlab_runner_between_read_and_write_is_not_lost(tmp_path: Path) -> None:
    """gitlab-runner rotates a token while we edit: our change is applied to its version."""
    config = _file(tmp_path)
    calls = 0

    def change(doc: tomlkit.TOMLDocument) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:  # the "other writer" strikes after our read, before our rename
            config.path.write_text(ORIGINAL.replace("glrt-ours", "glrt-rotated"))
        doc["concurrent"] = 16

    config.edit(change)
    text = config.path.read_text()
    assert calls == 2
    assert 'token = "glrt-rotated"' in text and "concurrent = 16" in text


def test_file_that_never_settles_is_refused(tmp_path: Path) -> None:
    config = _file(tmp_path)
    counter = iter(range(100))

    def change(doc: tomlkit.TOMLDocument) -> None:
        config.path.write_text(ORIGINAL + f"\n# rewrite {next(counter)}\n")
        doc["concurrent"] = 9

    with pytest.raises(ConfigError, match="kept changing"):
        config.edit(change)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("concurrent = \n", "not valid TOML"),
        ("[[runners]\nname='x'\n", "not valid TOML"),
        ("concurrent = 0\n", "positive integer"),
        ("runners = 3\n", "array of tables"),
        ("runners = [1, 2]\n", "must be a table"),
    ],
)
def test_malformed_file_is_refused_and_left_byte_for_byte(
    tmp_path: Path, text: str, needle: str
) -> None:
    config = _file(tmp_path, text)
    before = config.path.read_bytes()
    with pytest.raises(ConfigError, match=needle):
        config.edit(lambda doc: doc.__setitem__("concurrent", 2))
    assert config.path.read_bytes() == before


def test_two_entries_of_one_name_are_refused_by_init_but_read_by_the_others(tmp_path: Path) -> None:
    """gitlab-runner would poll both: the second job on those GPUs waits on the first's
    lease (found by a review as a lab admin). init refuses to write on it; serve and
    uninstall, which only read or remove, go on."""
    config = _file(tmp_path, ORIGINAL + '[[runners]]\n  name = "runnerctl/h/gpu0"\n  token = "glrt-ours"\n')
    before = config.path.read_bytes()
    with pytest.raises(ConfigError, match=r"two \[\[runners\]\] entries are named runnerctl/h/gpu0"):
        config.edit(lambda doc: replace_owned_entries(doc, {"runnerctl/h/gpu0": {"limit": 1}}, retire=set()))
    assert config.path.read_bytes() == before
    assert set(config.owned_entries()) == {"runnerctl/h/gpu0"}
    assert config.repeated_names() == ["runnerctl/h/gpu0"]  # what doctor and serve say
    config.edit(lambda doc: replace_owned_entries(doc, {}, retire={"runnerctl/h/gpu0"}))  # uninstall
    assert config.owned_entries() == {}


def test_a_linked_file_is_edited_in_place_and_a_bom_is_read(tmp_path: Path) -> None:
    """Found by a review as a lab admin: a config.toml that links to the lab's managed copy
    was replaced by a plain file (the copy unchanged, nothing said), and a file an editor
    saved with a BOM, which gitlab-runner reads, was "not valid TOML"."""
    real = tmp_path / "managed" / "config.toml"
    real.parent.mkdir()
    real.write_bytes(b"\xef\xbb\xbf" + ORIGINAL.encode())
    link = tmp_path / "config.toml"
    link.symlink_to(real)
    config = RunnerConfigFile(link)
    assert set(config.owned_entries()) == {"runnerctl/h/gpu0"}
    config.edit(lambda doc: doc.__setitem__("concurrent", 9))
    assert link.is_symlink() and tomlkit.parse(real.read_text())["concurrent"] == 9
    assert "# managed partly by hand: keep this comment" in real.read_text()


def test_missing_file_is_created(tmp_path: Path) -> None:
    config = RunnerConfigFile(tmp_path / "sub" / "config.toml")
    assert config.owned_entries() == {}
    config.edit(lambda doc: doc.__setitem__("concurrent", 3))
    assert tomlkit.parse(config.path.read_text())["concurrent"] == 3


@pytest.mark.parametrize(("before", "after_raise", "restored", "said"), [
    ("concurrent = 4  # the lab's limit\ncheck_interval = 3\n",
     "concurrent = 15 # runnerctl init raised it from 4 to 15; the lab's limit\ncheck_interval = 3\n",
     "concurrent = 4 # the lab's limit\ncheck_interval = 3\n", "set concurrent back to 4"),
    ("check_interval = 3\n",
     "check_interval = 3\nconcurrent = 15 # runnerctl init set it, absent before, to 15\n",
     "check_interval = 3\n", "remove concurrent = 15"),
])
def test_concurrent_raised_by_init_goes_back_to_the_labs_value(before: str, after_raise: str, restored: str,
                                                                said: str) -> None:
    doc = tomlkit.parse(before)
    raise_concurrent(doc, 8)
    raise_concurrent(doc, 15)  # init again with more slots: the first origin is kept
    assert tomlkit.dumps(doc) == after_raise
    doc = tomlkit.parse(after_raise)
    raise_concurrent(doc, 10)  # enough already: untouched
    assert tomlkit.dumps(doc) == after_raise
    answer = restore_concurrent(doc)
    assert answer is not None and answer.startswith(said) and tomlkit.dumps(doc) == restored
    assert restore_concurrent(doc) is None  # nothing of init's left


def test_concurrent_changed_since_init_is_kept_and_one_never_raised_is_left_alone() -> None:
    doc = tomlkit.parse("concurrent = 20 # runnerctl init raised it from 4 to 15; the lab's limit\n")
    assert restore_concurrent(doc) == "keep concurrent = 20 (changed since runnerctl init set it to 15)"
    assert tomlkit.dumps(doc) == "concurrent = 20 # the lab's limit\n"
    doc = tomlkit.parse("concurrent = 40  # mine\n")
    assert restore_concurrent(doc) is None and tomlkit.dumps(doc) == "concurrent = 40  # mine\n"
