"""The tuner (chapter 13, ``make tune``): which levers make a reader's own model train faster here.

``levers`` (which apply, the regime each attacks), ``search`` (the budgeted search and its confirmation,
``python -m helpers.tune``), ``trial`` (one trial's worker process), ``report`` (what it says and writes)."""
