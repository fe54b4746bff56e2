import subprocess
import sys

import pytest
import torch

from helpers import precision


def test_formats_table():
    rows = {r["format"]: r for r in precision.formats().as_dicts()}
    assert list(rows) == ["FP64", "FP32", "TF32", "FP16", "BF16"]
    assert rows["FP16"]["max"] == 65504.0 and rows["FP16"]["bytes"] == 2
    assert rows["BF16"]["eps"] == 2 ** -7 and rows["TF32"]["eps"] == 2 ** -10
    assert rows["BF16"]["smallest normal"] == rows["FP32"]["smallest normal"]
    assert rows["FP16"]["smallest subnormal"] == pytest.approx(2 ** -24)


def test_underflow_shows_fp16_losing_small_gradients():
    rows = precision.underflow([1e-3, 1e-8]).as_dicts()
    assert rows[0]["as FP16"] != 0
    assert rows[1]["as FP16"] == 0.0                                   # vanished
    assert rows[1]["as BF16"] != 0                                     # bf16 keeps fp32's range
    assert rows[1]["FP16 scaled x65536, unscaled"] == pytest.approx(1e-8, rel=1e-2)


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


def test_pytorch_defaults_put_convolutions_but_not_matmuls_in_tf32():
    # a fresh process: other tests in this one may have changed the process-wide settings
    code = "from helpers import precision; print(precision.tf32_defaults())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str({"matmul": "none", "conv": "tf32"})


def test_tf32_context_switches_both_and_restores():
    before = precision.tf32_defaults()
    with precision.tf32(False):
        assert precision.tf32_defaults() == {"matmul": "ieee", "conv": "ieee"}
    with precision.tf32(True):
        assert precision.tf32_defaults() == {"matmul": "tf32", "conv": "tf32"}
    assert precision.tf32_defaults() == before


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
