"""The tuner (chapter 13, ``make tune``): which levers make a reader's own model train faster here.

``levers`` (which apply, the regime each attacks), ``search`` (the budgeted search and its confirmation,
``python -m helpers.tune``), ``trial`` (one trial's worker process), ``report`` (what it says and writes)."""

import importlib

_HOMES = {"tune": "search", "TuneError": "trial", "NO_LEVER": "levers", "regime_table": "levers",
          **{n: "report" for n in ("result_rows", "summary", "figure", "rescore", "break_even_steps", "table",
                                   "recommendation_line", "verdict_of")}}


def __getattr__(name: str):
    """The names chapter 13 uses, from their modules on first use (a trial's worker imports none of them)."""
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
