import subprocess
import sys

import pytest
import torch

from helpers import precision


def test_parse_dtype():
    assert precision.parse_dtype("fp32") is None and precision.parse_dtype(None) is None
    assert precision.parse_dtype("BF16") is torch.bfloat16 and precision.parse_dtype("float16") is torch.float16
    assert precision.parse_dtype(torch.bfloat16) is torch.bfloat16
    for name in ("bfloat16", "BFloat16", "torch.bfloat16", " bf16 "):
        assert precision.parse_dtype(name) is torch.bfloat16, name
    for name in ("fp16", "half", "torch.float16"):
        assert precision.parse_dtype(name) is torch.float16, name
    assert precision.parse_dtype("float32") is None and precision.parse_dtype("FP64") is torch.float64
    with pytest.raises(ValueError, match="fp32, bf16, fp16"):
        precision.parse_dtype("int8")


def _tf32_settings():
    return torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision


def test_pytorch_defaults_put_convolutions_but_not_matmuls_in_tf32():
    # a fresh process: other tests in this one may have changed the process-wide settings
    code = "import torch; print(torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["none", "tf32"]


def test_tf32_context_switches_both_and_restores():
    before = _tf32_settings()
    with precision.tf32(False):
        assert _tf32_settings() == ("ieee", "ieee")
    with precision.tf32(True):
        assert _tf32_settings() == ("tf32", "tf32")
    assert _tf32_settings() == before


def test_precision_bits():
    assert precision.precision_bits(torch.float32) == 24
    assert precision.precision_bits(torch.float16) == 11
    assert precision.precision_bits(torch.bfloat16) == 8
    with pytest.raises(ValueError):
        precision.precision_bits(torch.int32)


def test_rounding_error_bf16_is_about_8x_fp16():
    torch.manual_seed(0)
    x = torch.randn(10_000) * 0.05                       # weights-like values, normal in both formats
    e16, e_bf = precision.rounding_error(x, torch.float16), precision.rounding_error(x, torch.bfloat16)
    assert 0 < e16 < 2.0 ** -11 and 0 < e_bf < 2.0 ** -8  # the median is below the worst case
    assert 6 < e_bf / e16 < 10                            # 2**(11 - 8) = 8
    assert precision.rounding_error(torch.tensor([1.0, 0.5, 0.0]), torch.float16) == 0.0  # exact values
    with pytest.raises(ValueError):
        precision.rounding_error(torch.zeros(3), torch.float16)


def test_onednn_formats_answers_for_both_formats():
    found = precision.onednn_formats()
    assert set(found) == {"bf16", "fp16"} and all(v in (True, False, None) for v in found.values())


def test_flush_table_counts_elements_a_format_flushed():
    ref = torch.tensor([1e-8, 0.5, 0.0, 2.0])
    rows = precision.flush_table(ref, {"same": ref.clone(), "fp16": ref.half().float()}, lr=0.1).as_dicts()
    assert rows[0]["flushed to 0"] == 0 and rows[0]["update error vs FP32 %"] == 0.0
    assert rows[1]["non-zero in FP32"] == 3 and rows[1]["flushed to 0"] == 1       # 1e-8 is below FP16's subnormals
    assert rows[1]["flushed %"] == pytest.approx(100 / 3) and rows[1]["weights not updated"] == 1
    with pytest.raises(ValueError):
        precision.flush_table(torch.zeros(2), {})


def test_op_table_names_the_layer_from_the_shapes():
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    ops = {"fp32": {("aten::mm", "a"): (1.0, [[2, 4], [4, 8]])},
           "fp16": {("aten::mm", "a"): (9.0, [[2, 4], [4, 8]]), ("aten::relu", "b"): (1.0, [[2, 4]])}}
    table, keys = precision.op_table(ops, model, top=2)
    rows = table.as_dicts()
    assert keys == [("aten::mm", "a"), ("aten::relu", "b")]
    assert rows[0]["layer (from the shapes)"].endswith("backward: input gradient") and rows[0]["fp16 share %"] == 90.0
    assert rows[1]["fp32 ms"] is None and rows[1]["input shapes"] == "[2, 4]"
    assert precision.shapes_text([[], [3]]) == "[3]" and precision.shapes_text([]) == "-"


def test_vs_published_puts_each_ratio_beside_the_published_one():
    import matplotlib
    matplotlib.use("Agg")
    from types import SimpleNamespace
    from helpers import measure

    slow = SimpleNamespace(ratio=0.5, low=0.4, high=0.6, interval="0.4-0.6", label="slower")
    res = SimpleNamespace(names=["fp32", "bf16", measure.aa_name("fp32")], verdict=lambda name, base: slow)
    rows = precision.vs_published(res, {"fp32": 100.0, "bf16": 50.0}, where="test", source="a book").as_dicts()
    assert [r["variant"] for r in rows] == ["fp32", "bf16"]                  # the A/A arm is left out
    assert rows[1]["published speed-up (x)"] == 2.0 and rows[1]["your speed-up (x)"] == 0.5
    assert rows[1]["verdict"] == "slower" and rows[0]["verdict"] == "baseline"


def test_op_summary_gives_totals_and_the_top_matmul_rate():
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    ops = {"fp32": {("aten::mm", "a"): (1.0, [[2, 4], [4, 8]])},
           "fp16": {("aten::mm", "a"): (4.0, [[2, 4], [4, 8]]), ("aten::_slow_conv2d_forward", "c"): (2.0, [])}}
    lines = precision.op_summary(ops, model, ("aten::mm", "a"))
    assert lines[0] == "all operators: fp32 1 ms, fp16 6 ms; generic FP16 convolutions (aten::_slow_conv2d_*): 2 ms"
    assert lines[1].startswith("top row, 0: Linear(8->4), backward: input gradient: 0 MFLOP")
    assert len(precision.op_summary(ops, model, ("aten::_slow_conv2d_forward", "c"))) == 1


def test_step_round_times_fresh_models_after_a_warm_up():
    batches = [(torch.randn(4, 3), torch.randint(0, 2, (4,))) for _ in range(3)]
    calls = []

    def step(model, opt, scaler, x, y, *, dtype):
        calls.append((id(model), dtype, scaler.is_enabled()))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    one_round = precision.step_round(lambda: torch.nn.Linear(3, 2), step, batches, dtype=None, min_steps=2)
    ms, extra = one_round()
    assert ms > 0 and extra["timed steps"] >= 2 and len(calls) == extra["timed steps"] + 1
    one_round()
    assert not calls[0][2]                                                      # the scaler only for FP16
    with pytest.raises(ValueError):
        precision.step_round(lambda: None, step, batches[:1], dtype=None)


def test_vs_published_draws_a_round_without_an_interval():
    import matplotlib
    matplotlib.use("Agg")
    from types import SimpleNamespace

    one = SimpleNamespace(ratio=0.50000001, low=0.5, high=0.5, interval="none (1 rounds)",
                          label="no measurable difference")
    res = SimpleNamespace(names=["fp32", "bf16"], verdict=lambda name, base: one)
    assert len(precision.vs_published(res, {"fp32": 1.0}, where="smoke", source="-").as_dicts()) == 2
