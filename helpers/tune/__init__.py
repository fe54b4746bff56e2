"""The tuner (chapter 13, ``make tune``): which levers make a reader's own model train faster here.

* ``levers``: which levers apply to this model and device, and why the others are skipped;
* ``sessions``: how trials run, each in a ``helpers.tune.trial`` child process with a hard timeout;
* ``search``: runs the trials within a budget and combines the winners (``python -m helpers.tune``
  runs it);
* ``confirm``: measures every lever that was 2% faster in the search, the combination and the near
  misses again in interleaved rounds, and recommends only what they call "faster" (a bigger batch: a hint);
* ``trial``: one trial's child process, ``python -m helpers.tune.trial`` (loads the model file,
  applies the levers, times the steps);
* ``advice``: what the tuner tells the reader (the confirmation, the recommendation, hints, a line per trial);
* ``report``: what the search shows and writes (table, figure, summary, result rows, tune.json).

Nothing is imported here, so a trial's child process starts without loading the search.
"""
