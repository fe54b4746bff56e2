import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from helpers import plots  # noqa: E402
from helpers.measure import Result  # noqa: E402


def test_speedup_bars():
    res = [Result("a", [2.0, 2.2]), Result("b", [1.0, 1.1])]
    fig = plots.speedup_bars(res, baseline="a", published={"b": 1.5})
    ax = fig.axes[0]
    assert len(ax.patches) == 4  # two of yours, two published
    assert ax.patches[1].get_height() == pytest.approx(2.1 / 1.05)
    with pytest.raises(ValueError):
        plots.speedup_bars([])


def test_tradeoff_and_phases():
    fig = plots.tradeoff([1, 2], [3, 4], ["x", "y"], xlabel="t", ylabel="acc", reference=([1], [2]))
    assert len(fig.axes[0].lines) == 2
    with pytest.raises(ValueError):
        plots.tradeoff([1], [1, 2], ["a"], xlabel="", ylabel="")
    fig = plots.phase_bars({"forward": 1.0, "backward": 3.0})
    assert [round(p.get_width()) for p in fig.axes[0].patches] == [25, 75]
    with pytest.raises(ValueError):
        plots.phase_bars({})
