"""The tuner (chapter 13, ``make tune``): which levers make a reader's own model train faster here.

* ``levers``: which levers apply to this model and device, and why the others are skipped;
* ``sessions``: how trials run, each in a ``helpers.tune.trial`` child process with a hard timeout;
* ``search``: runs the trials within a budget, combines the winners and confirms the front-runner
  in interleaved rounds (``python -m helpers.tune`` runs it);
* ``trial``: one trial's child process, ``python -m helpers.tune.trial`` (loads the model file,
  applies the levers, times the steps);
* ``report``: what the search shows and writes (table, figure, explanations, result rows).

Nothing is imported here, so a trial's child process starts without loading the search.
"""
