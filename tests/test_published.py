import pytest

from helpers import published


def test_book_numbers_load():
    rows = published.load("book")
    assert published.value(rows, "fashion_cnn_10ep", "baseline_bs64", "time") == 148
    assert published.value(rows, "cifar_cnn_10ep", "pruned_50", "params") == 1_059_306
    assert all(r.source for r in rows)
    assert {r.chapter for r in rows} >= {2, 3, 4, 5, 6, 7, 9, 10, 11}
    assert len(published.load("dlprimitives")) == 52 and published.load("arc_blog")


def test_missing_table_lists_available():
    with pytest.raises(FileNotFoundError, match="book"):
        published.load("nope")
    with pytest.raises(KeyError):
        published.value(published.load(), "fashion_cnn_10ep", "nope", "time")


def test_table_and_compare():
    rows = published.load()
    t = published.table(rows, "fashion_cnn_10ep")
    assert t.column("variant")[0] == "baseline_bs64" and "Alves" in t.note
    cmp = published.compare(rows, "fashion_cnn_10ep", "time", "baseline",
                             {"baseline": 10.0, "bs256": 5.0}, mapping={"baseline": "baseline_bs64", "bs256": "batch256"})
    r = cmp.as_dicts()
    assert r[1]["published speed-up"] == pytest.approx(148 / 76)
    assert r[1]["your speed-up"] == pytest.approx(2.0)
    acc = published.compare(rows, "fashion_cnn_10ep", "accuracy", "baseline_bs64",
                            {"baseline_bs64": 80.0, "batch256": 60.0}, lower_is_better=False)
    assert acc.as_dicts()[1]["your ratio"] == pytest.approx(0.75)
    with pytest.raises(KeyError):
        published.compare(rows, "fashion_cnn_10ep", "time", "baseline_bs64", {"x": 1.0})
    with pytest.raises(KeyError):
        published.table(rows, "nothing")
