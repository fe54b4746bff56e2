"""Tests of helpers.files: atomic writes -- the whole new file or the old one, never a part, and no
temporary file left behind, whether the write succeeds, raises or is interrupted."""

import os

import pytest

from helpers import files


def test_atomic_write_creates_folders_and_returns_the_path(tmp_path):
    target = tmp_path / "a" / "b" / "out.bin"
    got = files.atomic_write(str(target), lambda f: f.write(b"\x00\x01payload"))
    assert got == target and target.read_bytes() == b"\x00\x01payload"
    assert list(target.parent.iterdir()) == [target]  # no temporary file left


def test_readers_see_the_old_file_until_the_new_one_is_complete(tmp_path):
    target = tmp_path / "state.json"
    target.write_text("old")
    seen = {}

    def write(f):
        f.write(b"new, first half ")
        seen["during"] = target.read_text()  # what a reader sees while the writer is half-way
        seen["temp"] = os.path.dirname(f.name)
        f.write(b"and second half")

    files.atomic_write(target, write)
    assert seen["during"] == "old" and target.read_text() == "new, first half and second half"
    assert seen["temp"] == str(tmp_path)  # beside the target: the rename stays on one file system


@pytest.mark.parametrize("failure", [OSError("disk full"), KeyboardInterrupt()])
def test_a_failed_or_interrupted_write_leaves_the_old_file_and_no_partial_one(tmp_path, failure):
    target = tmp_path / "rows.jsonl"
    target.write_text("complete old content\n")

    def write(f):
        f.write(b"half a line")
        raise failure

    with pytest.raises(type(failure)):
        files.atomic_write(target, write)
    assert target.read_text() == "complete old content\n" and list(tmp_path.iterdir()) == [target]
    with pytest.raises(type(failure)):
        files.atomic_write(tmp_path / "new.txt", write)  # no old file: nothing is left at all
    assert list(tmp_path.iterdir()) == [target]


def test_the_data_is_on_disk_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: events.append("fsync") or real_fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: events.append("replace") or real_replace(a, b))
    files.atomic_write(tmp_path / "x", lambda f: f.write(b"x"))
    assert events == ["fsync", "replace"]


def test_atomic_write_text_writes_utf8_and_replaces(tmp_path):
    target = tmp_path / "t.md"
    assert files.atomic_write_text(target, "first") == target
    assert files.atomic_write_text(target, "héllo ✓ 温度\n") == target
    assert target.read_bytes() == "héllo ✓ 温度\n".encode("utf-8")
    assert list(tmp_path.iterdir()) == [target]
