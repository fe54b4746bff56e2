import gc
import importlib

import pytest

from helpers import startup


def test_import_frozen_pauses_the_collector_then_freezes_and_restores_it(monkeypatch):
    seen = []
    real = importlib.import_module
    monkeypatch.setattr(startup.importlib, "import_module", lambda name: seen.append((name, gc.isenabled())) or real(name))
    before = gc.get_freeze_count()
    try:
        startup.import_frozen("json", "colorsys")
        assert seen == [("json", False), ("colorsys", False)]  # imported with the collector off
        assert gc.isenabled() and gc.get_freeze_count() > before  # back on, the objects moved out of its reach
    finally:
        gc.unfreeze()


def test_import_frozen_restores_the_collector_after_a_failed_import():
    try:
        with pytest.raises(ModuleNotFoundError):
            startup.import_frozen("no_such_module_for_the_course")
        assert gc.isenabled()
        gc.disable()
        with pytest.raises(ModuleNotFoundError):
            startup.import_frozen("no_such_module_for_the_course")
        assert not gc.isenabled()  # a collector that was off stays off
    finally:
        gc.enable()
        gc.unfreeze()


def test_exit_without_collection_freezes_what_is_left():
    left = [object(), {"a": [1]}]  # objects alive at the exit, tracked by the collector
    assert any(o is left for o in gc.get_objects())
    try:
        startup.exit_without_collection()
        assert not any(o is left for o in gc.get_objects())  # moved out of the collector's reach
    finally:
        gc.unfreeze()
    assert any(o is left for o in gc.get_objects())
