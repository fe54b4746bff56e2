import pytest
import torch

from helpers import devices


def test_cpu_always_available_and_last():
    found = devices.available_devices()
    assert found[-1] == "cpu"
    assert devices.get_device("cpu") == torch.device("cpu")


def test_auto_picks_first_available(monkeypatch):
    monkeypatch.setattr(devices, "is_available", lambda kind: kind in ("xpu", "cpu"))
    assert devices.get_device("auto").type == "xpu"
    monkeypatch.setattr(devices, "is_available", lambda kind: kind == "cpu")
    assert devices.get_device(None).type == "cpu"


def test_unknown_device_is_a_clear_error():
    with pytest.raises(devices.DeviceError, match="Unknown device 'tpu'"):
        devices.get_device("tpu")


def test_absent_device_says_what_to_do(monkeypatch):
    monkeypatch.setattr(devices, "is_available", lambda kind: kind == "cpu")
    with pytest.raises(devices.DeviceError, match="xpu wheel index"):
        devices.get_device("xpu")
    with pytest.raises(devices.DeviceError, match="not available"):
        devices.get_device("cuda:0")


def test_cpu_helpers():
    devices.synchronize("cpu")  # no-op, must not raise
    devices.reset_peak_memory("cpu")
    assert devices.memory_stats("cpu") == {}
    assert devices.autocast_dtypes("cpu") == [torch.bfloat16, torch.float16]
    assert devices.grad_scaler_supported("cpu")
    assert devices.describe("cpu") == "cpu"
    assert devices.is_available("cpu") and not devices.is_available("abacus")


def test_cuda_message_matches_the_installed_build(monkeypatch):
    monkeypatch.setattr(devices, "is_available", lambda kind: kind == "cpu")
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(devices.DeviceError, match="CPU-only build: install a CUDA build"):
        devices.get_device("cuda")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    with pytest.raises(devices.DeviceError, match="built for CUDA 12.8, but it finds no NVIDIA GPU") as err:
        devices.get_device("cuda")
    assert "install a CUDA build" not in str(err.value)
