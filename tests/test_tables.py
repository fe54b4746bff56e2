import pytest

from helpers.tables import Table, fmt


def test_fmt():
    assert fmt(1630090) == "1,630,090"
    assert fmt(83.99) == "83.99"
    assert fmt(0.012345) == "0.01235"
    assert fmt(None) == "-" and fmt(float("nan")) == "-"
    assert fmt(True) == "True" and fmt("x") == "x"
    assert "e" in fmt(3e9 + 0.5) and fmt(2122186.0) == "2,122,186" and fmt(148.0) == "148.0"


def test_table_renders(tmp_path):
    t = Table(["name", "value"], [["a", 1.5], ["bb", None]], title="T", note="N")
    text = str(t)
    assert text.splitlines()[0] == "T" and text.endswith("N") and "bb" in text
    assert "<td>1.500</td>" in t._repr_html_()
    assert t.to_markdown().startswith("| name | value |")
    piped = Table(["setup", "ms"], [["pytorch/cuda | rtx 2060", 1.0]]).to_markdown()
    assert piped.splitlines()[2] == "| pytorch/cuda \\| rtx 2060 | 1.000 |"  # still two columns
    assert t._repr_markdown_().startswith("**T**") and t._repr_markdown_().endswith("*N*")
    assert t.to_csv().splitlines() == ["name,value", "a,1.5", "bb,"]
    assert t.column("value") == [1.5, None] and len(t) == 2
    assert t.as_dicts()[0] == {"name": "a", "value": 1.5}
    with pytest.raises(ValueError):
        t.add(1)
