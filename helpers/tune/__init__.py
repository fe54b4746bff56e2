"""The tuner (chapter 13, ``make tune``): which levers make a reader's own model train faster here.

``levers`` (which apply, the regime each attacks), ``sessions`` (a new process per trial), ``trial`` (one
trial's process), ``search`` (the budgeted search, ``python -m helpers.tune``), ``confirm`` (interleaved
rounds decide), ``advice`` and ``report`` (what it says and writes). Nothing is imported here."""
