import pytest

from helpers import profiles


def test_default_profile_is_workshop():
    assert profiles.current_profile() == "workshop"


@pytest.mark.parametrize("name", profiles.PROFILES)
def test_pick_follows_profile(monkeypatch, name):
    monkeypatch.setenv("COURSE_PROFILE", name.upper())
    assert profiles.current_profile() == name
    assert profiles.pick(smoke=1, workshop=2, full=3) == {"smoke": 1, "workshop": 2, "full": 3}[name]


def test_unknown_profile_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "fast")
    with pytest.raises(profiles.ProfileError, match="smoke, workshop, full"):
        profiles.pick(smoke=1, workshop=2, full=3)


def test_data_source_defaults_and_override(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    assert profiles.data_source() == "standin"
    monkeypatch.setenv("COURSE_PROFILE", "full")
    assert profiles.data_source() == "real"
    assert profiles.data_source("smoke") == "standin" and profiles.data_source("Workshop") == "real"
    monkeypatch.setenv("COURSE_DATA", "standin")
    assert profiles.data_source() == "standin" and profiles.data_source("full") == "standin"
    monkeypatch.setenv("COURSE_DATA", "imagenet")
    with pytest.raises(profiles.ProfileError, match="real, standin"):
        profiles.data_source()


def test_describe_labels_standin(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    assert "stand-in" in profiles.describe()
    monkeypatch.setenv("COURSE_DATA", "real")
    assert "stand-in" not in profiles.describe()


@pytest.mark.parametrize("raw,expected", [("SMOKE", "smoke"), (" Workshop ", "workshop"), ("", "workshop"), (None, "workshop")])
def test_normalize_ignores_case_and_spaces(raw, expected):
    assert profiles.normalize(raw) == expected


def test_normalize_rejects_unknown_names():
    with pytest.raises(profiles.ProfileError, match="'Fast'.*smoke, workshop, full"):
        profiles.normalize("Fast")
