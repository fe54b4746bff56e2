import dataclasses

import pytest

from helpers import report_rows, results

FP = {"cpu_model": "Fake CPU", "physical_cores": 4, "bf16": {"avx2": True, "avx512": True, "native_bf16": False,
                                                             "amx": False}, "versions": {"torch": "2.8.0"}}


def rows():
    out = results.make_rows("02", "batch", {"b32": [2.0, 2.2, 1.8], "b256": [1.0, 1.1, 0.9]}, metric="epoch_time",
                            unit="s", baseline="b32", published={"b32": 10.0, "b256": 4.0}, published_source="book",
                            fingerprint=FP, profile="smoke", data="standin")
    out += results.make_rows("02", "batch", {"b32": [80.0], "b256": [70.0]}, metric="accuracy", unit="%",
                             baseline="b32", lower_is_better=False, fingerprint=FP, profile="smoke", data="standin")
    return out


def test_tables_rendered_from_rows_carry_units_scope_and_data(tmp_path):
    assert report_rows.metric_label("epoch_time", "s") == "s per epoch"
    assert report_rows.metric_label("step_time", "ms") == "ms per step"
    assert report_rows.metric_label("compile_time", "s") == "s per run"
    assert report_rows.metric_label("throughput", "images/s") == "images/s"
    r = rows()
    t = report_rows.rows_table(r[:2])
    assert t.columns[1] == "epoch_time median (s per epoch)" and "min (s per epoch)" in t.columns
    assert all("(" in c for c in t.columns[1:4] + t.columns[5:8])
    acc = report_rows.rows_table(r[2:])
    assert acc.column("accuracy median (%)") == ["80.00 (stand-in)", "70.00 (stand-in)"]
    assert "stand-in" in acc.note
    with pytest.raises(ValueError, match="one metric"):
        report_rows.rows_table(r[1:3])
    md = report_rows.render_markdown(r)
    assert md.count("### 02 / batch") == 2 and "(stand-in)" in md
    csv_text = report_rows.render_csv(r, tmp_path / "rows.csv")
    lines = csv_text.splitlines()
    assert lines[0].startswith("chapter,experiment,variant,metric,unit,median") and len(lines) == 5
    assert (tmp_path / "rows.csv").read_bytes() == csv_text.encode() and "CPU 4 cores" in lines[1]


def test_quality_rows_value_format_and_grouping():
    r = rows()
    assert [report_rows.is_quality(x) for x in r] == [False, False, True, True]
    for metric in ("val_loss", "Top1", "max_abs_diff", "error_rate"):
        assert report_rows.is_quality(dataclasses.replace(r[0], metric=metric))
    assert [report_rows.fmt_value(v) for v in (2.0, 0.975, 1234.0, 1.234e-4)] == ["2.000", "0.975", "1,234", "1.2340e-04"]
    other = results.make_rows("01", "loader", {"w0": [1.0]}, metric="epoch_time", unit="s", fingerprint=FP,
                              profile="smoke", data="none")
    groups = report_rows.group_rows([r[0], other[0], r[2], r[1], r[3]])
    assert list(groups) == [("02", "batch", "epoch_time", "s"), ("01", "loader", "epoch_time", "s"),
                            ("02", "batch", "accuracy", "%")]  # in the order they first appear
    assert [x.variant for x in groups[("02", "batch", "epoch_time", "s")]] == ["b32", "b256"]
