import pytest

from helpers import run_sizes


def test_default_profile_is_workshop():
    assert run_sizes.current_profile() == "workshop"


@pytest.mark.parametrize("name", run_sizes.PROFILES)
def test_pick_follows_profile(monkeypatch, name):
    monkeypatch.setenv("COURSE_PROFILE", name.upper())
    assert run_sizes.current_profile() == name
    assert run_sizes.pick(smoke=1, workshop=2, full=3) == {"smoke": 1, "workshop": 2, "full": 3}[name]


def test_unknown_profile_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "fast")
    with pytest.raises(run_sizes.ProfileError, match="smoke, workshop, full"):
        run_sizes.pick(smoke=1, workshop=2, full=3)


def test_data_source_defaults_and_override(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    assert run_sizes.data_source() == "standin"
    monkeypatch.setenv("COURSE_PROFILE", "full")
    assert run_sizes.data_source() == "real"
    assert run_sizes.data_source("smoke") == "standin" and run_sizes.data_source("Workshop") == "real"
    monkeypatch.setenv("COURSE_DATA", "standin")
    assert run_sizes.data_source() == "standin" and run_sizes.data_source("full") == "standin"
    monkeypatch.setenv("COURSE_DATA", "imagenet")
    with pytest.raises(run_sizes.ProfileError, match="real, standin"):
        run_sizes.data_source()


def test_describe_labels_standin(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    assert "stand-in" in run_sizes.describe()
    monkeypatch.setenv("COURSE_DATA", "real")
    assert "stand-in" not in run_sizes.describe()


@pytest.mark.parametrize("raw,expected", [("SMOKE", "smoke"), (" Workshop ", "workshop"), ("", "workshop"), (None, "workshop")])
def test_normalize_ignores_case_and_spaces(raw, expected):
    assert run_sizes.normalize(raw) == expected


def test_normalize_rejects_unknown_names():
    with pytest.raises(run_sizes.ProfileError, match="'Fast'.*smoke, workshop, full"):
        run_sizes.normalize("Fast")


def test_optional_parts_default_on_and_switch_off(monkeypatch):
    monkeypatch.delenv("COURSE_OPTIONAL", raising=False)
    assert run_sizes.optional_parts() is True
    assert "optional parts=off" not in run_sizes.describe()
    for value, expected in [("0", False), (" OFF ", False), ("no", False), ("1", True), ("yes", True), ("", True)]:
        monkeypatch.setenv("COURSE_OPTIONAL", value)
        assert run_sizes.optional_parts() is expected, value
    monkeypatch.setenv("COURSE_OPTIONAL", "0")
    assert run_sizes.describe().endswith("optional parts=off")
    monkeypatch.setenv("COURSE_OPTIONAL", "sometimes")
    with pytest.raises(run_sizes.ProfileError, match="COURSE_OPTIONAL='sometimes'.*Use 1"):
        run_sizes.optional_parts()


@pytest.mark.parametrize("value, off", [("", False), ("1", True), ("true", True), (" YES ", True), ("0", False)])
def test_bars_off_follows_tqdm_disable_and_the_caller(monkeypatch, value, off):
    monkeypatch.setenv("TQDM_DISABLE", value)
    assert run_sizes.bars_off() is off
    assert run_sizes.bars_off(show=False) is True
