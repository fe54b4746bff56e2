import torch

from helpers import models, profiling


def test_operator_shares_of_book_cnn():
    model = models.book_cnn()
    x = torch.randn(16, 1, 28, 28)
    with torch.no_grad():
        prof = profiling.profile_fn(lambda: model(x), warmup=1, steps=2)
    table = profiling.operator_shares(prof, top=20)
    names = table.column("operator")
    assert any("conv" in n for n in names) and any("max_pool" in n for n in names)
    shares = table.column("share %")
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 100.0001
    assert 0 < profiling.share_of(table, "conv") <= 100
    assert profiling.share_of(table, "no-such-op") == 0


def test_quiet_kineto_is_scoped(monkeypatch):
    import os

    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    with profiling.quiet_kineto():
        assert os.environ["KINETO_LOG_LEVEL"] == "5"
    assert "KINETO_LOG_LEVEL" not in os.environ
    monkeypatch.setenv("KINETO_LOG_LEVEL", "2")  # the user's own choice wins and stays
    with profiling.quiet_kineto():
        assert os.environ["KINETO_LOG_LEVEL"] == "2"
    assert os.environ["KINETO_LOG_LEVEL"] == "2"
