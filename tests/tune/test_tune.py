"""helpers.tune: the names chapter 13 reads from the package resolve to their modules, lazily."""

import pytest

import helpers.tune as tune
from helpers.tune import levers, report, search, trial


def test_chapter_names_resolve_to_their_modules():
    assert tune.tune is search.tune and tune.TuneError is trial.TuneError
    assert tune.regime_table is levers.regime_table and tune.rescore is report.rescore
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        tune.nothing
