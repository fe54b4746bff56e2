import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from helpers import plots  # noqa: E402
from helpers.measure import Result, Rounds  # noqa: E402


def test_speedup_bars():
    res = [Result("a", [2.0, 2.2]), Result("b", [1.0, 1.1])]
    fig = plots.speedup_bars(res, baseline="a", published={"b": 1.5})
    ax = fig.axes[0]
    assert len(ax.patches) == 4  # two of yours, two published
    assert ax.patches[1].get_height() == pytest.approx(2.0)  # paired rounds: the verdict's median ratio
    assert "95% interval" in ax.get_legend().get_texts()[0].get_text()
    with pytest.raises(ValueError, match="paired rounds"):
        plots.speedup_bars([Result("a", [2.0, 2.2]), Result("b", [1.0, 1.1, 1.2])])
    with pytest.raises(ValueError):
        plots.speedup_bars([])


def test_speedup_bars_from_rounds_marks_a_failed_aa():
    n = 8
    r = Rounds(["a", "A/A: a again", "b"], {"a": [2.0] * n, "A/A: a again": [1.0] * n, "b": [1.0] * n},
               {k: [{}] * n for k in ("a", "A/A: a again", "b")}, aa_failed=True)
    ax = plots.speedup_bars(r).axes[0]
    assert "DISTURBED" in ax.get_title()
    assert "no verdict" in ax.get_legend().get_texts()[0].get_text()
    assert ax.patches[0].get_hatch() == "//"
    r.aa_failed = False
    ok = plots.speedup_bars(r).axes[0]
    assert "DISTURBED" not in ok.get_title() and ok.patches[0].get_hatch() is None
    assert ok.patches[2].get_height() == pytest.approx(2.0)


def _rounds(base, variant):
    n = len(base)
    return Rounds(["a", "b"], {"a": list(base), "b": list(variant)}, {"a": [{}] * n, "b": [{}] * n})


def test_round_ratios_dots_line_and_band():
    fig = plots.round_ratios(_rounds([2.0] * 8, [1.0] * 8))
    ax = fig.axes[0]
    assert [y for _, y in ax.collections[0].get_offsets()] == [2.0] * 8  # one dot per round: a/b
    assert len(ax.patches) == 1  # the interval band
    assert "faster" in ax.get_legend().get_texts()[0].get_text()


def test_round_ratios_no_band_with_too_few_rounds_and_clear_errors():
    fig = plots.round_ratios(_rounds([1.0, 1.1, 0.9], [1.0, 1.0, 1.0]))
    assert len(fig.axes[0].patches) == 0 and len(fig.axes[0].collections[0].get_offsets()) == 3
    with pytest.raises(ValueError, match="baseline"):
        plots.round_ratios(_rounds([1.0], [1.0]), baseline="c")
    with pytest.raises(ValueError, match="not usable"):
        plots.round_ratios(_rounds([1.0], [1.0]), variants=["a"])
