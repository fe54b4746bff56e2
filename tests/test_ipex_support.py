import pytest
import torch

from helpers import ipex_support, models


def test_status_reports_versions():
    st = ipex_support.status()
    assert st["torch"] == torch.__version__ and isinstance(st["message"], str)


def test_mismatch_is_refused_before_import(monkeypatch):
    monkeypatch.setattr(ipex_support.metadata, "version", lambda name: "2.3.0+cpu")
    st = ipex_support.status()
    assert st["compatible"] is False and "would end this Python process" in st["message"]
    with pytest.raises(ipex_support.IPEXUnavailable, match="needs torch 2.3"):
        ipex_support.load()


def test_missing_ipex(monkeypatch):
    def missing(name):
        raise ipex_support.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(ipex_support.metadata, "version", missing)
    with pytest.raises(ipex_support.IPEXUnavailable, match="not installed"):
        ipex_support.load()


def test_bf16_refused_without_cpu_support(monkeypatch):
    monkeypatch.setattr(ipex_support, "bf16_prepack_supported", lambda: False)
    model = models.book_cnn()
    with pytest.raises(ipex_support.IPEXUnavailable, match="AVX-512"):
        ipex_support.optimize(model, torch.optim.Adam(model.parameters()), dtype=torch.bfloat16)


def test_eval_mode_is_refused():
    model = models.book_cnn().eval()
    with pytest.raises(ValueError, match="train"):
        ipex_support.optimize(model, torch.optim.Adam(model.parameters()))


@pytest.mark.skipif(not ipex_support.status()["compatible"], reason="IPEX not installed or incompatible")
def test_fp32_optimize_trains():
    torch.manual_seed(0)
    model = models.book_cnn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, opt = ipex_support.optimize(model, opt)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    losses = []
    for _ in range(5):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]


def test_advisory_says_archived_insecure_and_optional(monkeypatch):
    text = ipex_support.advisory()
    assert "archived" in text and "security" in text and "runs without it" in text
    monkeypatch.setattr(ipex_support.metadata, "version", lambda name: "2.3.0+cpu")
    assert ipex_support.advisory().startswith("IPEX 2.3.0+cpu is installed but does not match torch")

    def missing(name):
        raise ipex_support.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(ipex_support.metadata, "version", missing)
    assert ipex_support.advisory().startswith("IPEX is not installed.")
