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


def _fake_torch_devices(monkeypatch, present):
    """Fake the device layer of torch itself (not helpers.devices): which accelerators it reports."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: "cuda" in present)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: "xpu" in present)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: "mps" in present)


@pytest.mark.parametrize("present, expected", [
    ({"cuda", "xpu", "mps"}, "cuda"),   # an NVIDIA machine picks CUDA even with an Intel GPU beside it
    ({"cuda"}, "cuda"),
    ({"xpu", "mps"}, "xpu"),
    ({"mps"}, "mps"),
    (set(), "cpu"),
])
def test_auto_prefers_cuda_then_xpu_then_mps_then_cpu(monkeypatch, present, expected):
    _fake_torch_devices(monkeypatch, present)
    assert devices.get_device("auto") == torch.device(expected)
    assert devices.available_devices()[0] == expected and devices.available_devices()[-1] == "cpu"


def _chapter_12_device_line():
    import json
    from pathlib import Path

    nb = Path(__file__).resolve().parent.parent / "notebooks" / "12_intel_arc_xpu.ipynb"
    cells = json.loads(nb.read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"
            and "solution" not in c["metadata"].get("tags", [])]
    lines = [line for cell in code for line in cell.splitlines() if line.startswith("device = ")]
    assert len(lines) == 1, f"chapter 12 should choose its device once, found {lines}"
    return lines[0].split("#")[0].strip()


@pytest.mark.parametrize("present, expected", [({"cuda"}, "cuda"), ({"cuda", "xpu"}, "cuda"), ({"xpu"}, "xpu"),
                                               ({"mps"}, "mps"), (set(), "cpu")])
def test_chapter_12_picks_cuda_on_an_nvidia_machine(monkeypatch, present, expected):
    """The chapter's own device line, run with torch's device layer faked."""
    _fake_torch_devices(monkeypatch, present)
    from helpers import lab

    scope = {"devices": devices, "lab": lab, "torch": torch}  # the chapter reads devices through lab
    exec(_chapter_12_device_line(), scope)
    assert scope["device"] == torch.device(expected)


def test_low_precision_dtype(monkeypatch):
    assert devices.low_precision_dtype("cpu") is torch.bfloat16
    native = {"flag": True}
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: native["flag"] or including_emulation)
    assert devices.low_precision_dtype("cuda") is torch.bfloat16
    native["flag"] = False  # e.g. a Turing GPU: bf16 only emulated
    assert devices.low_precision_dtype("cuda") is torch.float16
    monkeypatch.setattr(torch.xpu, "is_bf16_supported", lambda *a, **k: True)
    assert devices.low_precision_dtype("xpu") is torch.bfloat16
    monkeypatch.setattr(torch.xpu, "is_bf16_supported", lambda *a, **k: False)
    assert devices.low_precision_dtype("xpu") is torch.float16
    assert devices.low_precision_dtype("mps") is torch.float16


def test_cuda_missing_reason_names_the_installed_build(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.8.0+cpu")
    monkeypatch.setattr(torch.version, "cuda", None)
    assert devices.cuda_missing_reason() == (
        "this PyTorch (2.8.0+cpu) is a CPU-only build: install a CUDA build (see pytorch.org) on a machine with an "
        "NVIDIA GPU and its driver")
    monkeypatch.setattr(torch, "__version__", "2.8.0+cu128")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    reason = devices.cuda_missing_reason()
    assert reason.startswith("this PyTorch (2.8.0+cu128) is built for CUDA 12.8, but it finds no NVIDIA GPU")
    assert "nvidia-smi" in reason and reason.endswith("run on a GPU machine")
