import math

import pytest

from helpers import published

TABLES = ("book", "arc_blog", "dlprimitives")
# The unit every metric must carry (a wrong unit would make a "published vs yours" ratio lie).
UNITS = {"time": {"s"}, "first_epoch": {"s"}, "median_epoch": {"s"}, "accuracy": {"%"}, "share": {"%"},
         "params": {"count"}, "throughput": {"fps", "it/s"}, "slowdown": {"%"}, "max_batch": {"images"}}
DLPRIMITIVES_MODELS = ("alexnet", "resnet18", "resnet50", "vgg16", "mobilenet")


def test_the_shipped_tables_are_found():
    assert sorted(p.name for p in published.CHECKOUT_DATA.glob("*.csv")) == sorted(f"{t}.csv" for t in TABLES)


@pytest.mark.parametrize("name", TABLES)
def test_every_row_is_a_sourced_number_with_its_unit(name):
    rows = published.load(name)
    assert rows
    keys = [(r.experiment, r.variant, r.metric) for r in rows]
    assert len(keys) == len(set(keys)), "one value per experiment/variant/metric"
    for r in rows:
        assert r.source and r.hardware and r.experiment and r.variant, r
        assert math.isfinite(r.value) and r.value >= 0, r
        allowed = {"ms"} if r.metric.startswith("step_time_") else UNITS.get(r.metric)
        assert allowed is not None and r.unit in allowed, f"{r.metric} in {r.unit!r}: {r}"
        assert 1 <= r.chapter <= 14


def test_book_numbers_match_the_reference():
    rows = published.load("book")
    v = lambda exp, var, metric: published.value(rows, exp, var, metric)  # noqa: E731
    assert (v("fashion_cnn_10ep", "baseline_bs64", "time"), v("fashion_cnn_10ep", "baseline_bs64", "accuracy")) == (148, 83.99)
    assert v("fashion_cnn_10ep", "batch256", "time") == 76
    assert (v("cifar_cnn_10ep", "unpruned", "params"), v("cifar_cnn_10ep", "pruned_50", "params")) == (2_122_186, 1_059_306)
    assert {r.chapter for r in rows} >= {2, 3, 4, 5, 6, 7, 9, 10, 11}
    shares = published.select(rows, experiment="fashion_cnn_forward_profile", metric="share")
    assert 90 <= sum(r.value for r in shares) <= 100
    sweep = published.select(rows, experiment="cifar_cnn_sparsity_sweep", metric="time")
    assert [r.variant for r in sweep] == [f"sparsity_{p}" for p in range(10, 90, 10)]
    times = [r.value for r in sweep]
    assert times == sorted(times, reverse=True) and (times[0], times[-1]) == (118, 76)


def test_dlprimitives_table_is_complete():
    rows = published.load("dlprimitives")
    grid = published.select(rows, experiment="train_step_batch16_224")
    setups = {r.variant for r in grid}
    assert len(setups) == 10  # 4 frameworks on 3 GPUs, as published
    for setup in setups:
        assert sorted(r.metric for r in grid if r.variant == setup) == sorted(f"step_time_{m}" for m in DLPRIMITIVES_MODELS)
    assert published.value(rows, "train_step_batch16_224", "pytorch/cuda | Nvidia rtx 2060s", "step_time_resnet50") == 114.074
    assert published.value(rows, "train_step_batch16_224", "dlprimitives | AMD rx 6600xt", "step_time_alexnet") == 36.954
    infer = published.select(rows, experiment="inference_alexnet_batch16")
    assert sorted(r.value for r in infer) == [15.317, 22.932]


def test_arc_blog_numbers():
    rows = published.load("arc_blog")
    sd = {r.variant: r.value for r in published.select(rows, experiment="stable_diffusion_2_1_512")}
    assert sd["arc_a770_fp16"] == 5.97 and sd["titan_rtx_eager"] == 15.76 and sd["arc_a770_bf16_ipex_2_0_110"] == 7.45
    assert sd["titan_rtx_eager"] < sd["titan_rtx_compile_default"] < sd["titan_rtx_compile_max_autotune"]


def test_missing_table_lists_available(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="book"):
        published.load("nope")
    with pytest.raises(KeyError):
        published.value(published.load(), "fashion_cnn_10ep", "nope", "time")
    (tmp_path / "mine.csv").write_text("source,chapter,experiment,variant,metric,value,unit,hardware,note\n"
                                       "me,2,e,v,time,1.5,s,laptop,\n")
    monkeypatch.setattr(published, "_data_dir", lambda: tmp_path)
    assert published.load("mine")[0] == published.Number("me", 2, "e", "v", "time", 1.5, "s", "laptop", "")
    with pytest.raises(FileNotFoundError, match="available: mine"):
        published.load("book")


def test_a_checkout_on_pythonpath_reads_the_data_folder(monkeypatch, tmp_path):
    def not_installed(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(published.resources, "files", not_installed)
    assert published._data_dir() == published.CHECKOUT_DATA
    assert published.load("book")   # the same rows, read from data/published
    monkeypatch.setattr(published, "CHECKOUT_DATA", tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="make setup"):
        published._data_dir()
