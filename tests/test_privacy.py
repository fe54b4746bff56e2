"""Tests of helpers.privacy: the salted machine id, this machine's private names, and redaction of
user, host, home folder and paths."""

from pathlib import Path

from helpers import privacy


def test_private_names_and_cache_dir(monkeypatch, tmp_path):
    names = privacy.private_names()
    assert names["home"] == str(Path.home()) and names["host"]
    monkeypatch.setenv("HOME", str(tmp_path))
    assert privacy.cache_dir() == tmp_path / ".cache" / "accelerate-course"
    ident = privacy.machine_id()
    assert (privacy.cache_dir() / "machine-salt").exists() and privacy.machine_id() == ident


def test_redact_text_with_this_machines_names():
    names = privacy.private_names()
    text = f"{names['home']}/course ran on {names['host']}"
    out = privacy.redact_text(text)
    assert names["home"] not in out and "<path>" in out
    if len(names["host"]) >= 2:
        assert "<host>" in out
    assert privacy.redact_text(text, all_paths=False).startswith("~/course")


def test_machine_id_is_stable_per_salt(tmp_path):
    a = privacy.machine_id(tmp_path / "one")
    assert a == privacy.machine_id(tmp_path / "one") and len(a) == 16
    assert privacy.machine_id(tmp_path / "two") != a  # another salt, another id
    (tmp_path / "three").mkdir()
    (tmp_path / "three" / "machine-salt").write_text("fixed\n")
    assert privacy.machine_id(tmp_path / "three") == privacy.machine_id(tmp_path / "three")


def test_redact_removes_user_host_home_and_paths():
    names = {"home": "/home/alice", "user": "alice", "host": "alice-laptop.lan", "host_short": "alice-laptop"}
    text = "alice ran /home/alice/course/x.py on alice-laptop in /tmp/run, 256 images/s, ratio 1/2, ~/data"
    red = privacy.redact_text(text, names)
    for secret in ("alice", "/home", "/tmp", "~/data"):
        assert secret not in red
    assert "images/s" in red and "1/2" in red and "<user> ran <path>" in red and "<host>" in red
    local = privacy.redact_text("/home/alice/.cache/x and /usr/lib/libjemalloc.so", names, all_paths=False)
    assert local == "~/.cache/x and /usr/lib/libjemalloc.so"
    nested = privacy.redact({"a": ["alice", ("/home/alice",)], "alice": 3}, names)
    assert nested == {"a": ["<user>", ["<path>"]], "<user>": 3}
    assert privacy.redact_text("malice and alices", names) == "malice and alices"  # whole words only


def test_machine_id_is_a_hash_of_salt_machine_and_host(tmp_path, monkeypatch):
    import hashlib

    (tmp_path / "machine-salt").write_text("pepper\n")
    monkeypatch.setattr(privacy, "_machine_identity", lambda: "machine-1")
    monkeypatch.setattr(privacy.socket, "gethostname", lambda: "node01")
    assert privacy.machine_id(tmp_path) == hashlib.sha256(b"pepper|machine-1|node01").hexdigest()[:16]
    monkeypatch.setattr(privacy.socket, "gethostname", lambda: "node02")  # a cluster's nodes share a home folder
    assert privacy.machine_id(tmp_path) == hashlib.sha256(b"pepper|machine-1|node02").hexdigest()[:16]
    unwritable = tmp_path / "a-file"
    unwritable.write_text("")  # the cache 'folder' is a file: no salt can be kept, the id still works
    assert len(privacy.machine_id(unwritable)) == 16 and unwritable.read_text() == ""


def test_private_names_without_a_user_name(monkeypatch):
    def no_user():
        raise KeyError("uid not in the password database")  # a container started with an arbitrary uid

    monkeypatch.setattr(privacy.getpass, "getuser", no_user)
    monkeypatch.setattr(privacy.socket, "gethostname", lambda: "gpu7.cluster.example.org")
    names = privacy.private_names()
    assert "user" not in names and names["host"] == "gpu7.cluster.example.org" and names["host_short"] == "gpu7"
