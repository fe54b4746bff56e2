"""Shared fixtures (a clean profile environment, tiny stand-in loaders, a model file for the
tuner's tests) and the skip policy.

Skip policy, in one place: a test that needs hardware CI does not have carries
``@pytest.mark.requires_gpu`` or ``@pytest.mark.requires_xpu`` and is skipped where that
device is absent. Any other skip (a missing ``mpirun``, fewer than two cores, IPEX not
installed ...) is something CI should have: with ``CI=true`` (set by CI services and by
``.ci/run``) such a skip fails the run. Every run prints how many tests were skipped and why.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

HARDWARE_MARKERS = {"requires_gpu": ("cuda", "an NVIDIA GPU (CUDA)"), "requires_xpu": ("xpu", "an Intel GPU (XPU)")}
_SKIPS: list[tuple[str, str, bool]] = []  # (test id, reason, for absent hardware?) of this run


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def pytest_configure(config):
    for name, (_, what) in HARDWARE_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: needs {what}; skipped where absent (the only skip CI allows)")
    _SKIPS.clear()


def pytest_runtest_setup(item):
    from helpers import devices

    for name, (kind, what) in HARDWARE_MARKERS.items():
        if item.get_closest_marker(name) and not devices.is_available(kind):
            pytest.skip(f"needs {what}, absent here")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and any(item.get_closest_marker(name) for name in HARDWARE_MARKERS):
        report.user_properties.append(("hardware_skip", True))  # travels to the xdist controller


def pytest_runtest_logreport(report):
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    hardware = ("hardware_skip", True) in report.user_properties
    _SKIPS.append((report.nodeid, reason.removeprefix("Skipped: "), hardware))


def _not_allowed() -> list[tuple[str, str, bool]]:
    return [s for s in _SKIPS if not s[2]]


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller decides
    if in_ci() and _not_allowed() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput"):
        return
    skips, bad = _SKIPS, _not_allowed()
    terminalreporter.write_line(
        f"skipped: {len(skips)} test(s), {len(skips) - len(bad)} for absent GPU/XPU hardware, "
        f"{len(bad)} for other reasons")
    if bad and in_ci():
        terminalreporter.write_line("CI=true: these skips fail the run (CI must provide what they need):", red=True)
        for nodeid, reason, _ in bad:
            terminalreporter.write_line(f"  {nodeid}: {reason}", red=True)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ("COURSE_PROFILE", "COURSE_DATA", "COURSE_DATA_DIR", "COURSE_OPTIONAL"):
        monkeypatch.delenv(var, raising=False)
    torch.manual_seed(0)


@pytest.fixture
def tiny_loaders():
    from helpers import data

    train = data.load_dataset("fashionmnist", train=True, source="standin", standin_length=256)
    test = data.load_dataset("fashionmnist", train=False, source="standin", standin_length=128)
    return data.make_loader(train, 32, train=True, seed=3), data.make_loader(test, 64, train=False)


# A reader's model file for helpers.tune and its trial and report modules (tests/tune/): one
# non-image model (``build``), an image model, and functions that are wrong in each way the
# tuner must name (a 3-tuple, no Module, a function that never returns).
SEQ_MODEL = '''
import torch
from torch import nn

class Tiny(nn.Module):  # sequences (batch, time, features): not an image model
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16:
            raise RuntimeError("Tiny does not support bf16")
        return self.head(torch.relu(self.proj(x)).mean(dim=1))

def build():
    x = torch.randn(32, 5, 6)
    y = torch.randint(0, 3, (32,))
    return Tiny(), x, y, nn.CrossEntropyLoss()

def image():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    return model, torch.randn(4, 3, 8, 8), torch.randint(0, 2, (4,)), nn.CrossEntropyLoss()

def three():
    return nn.Linear(2, 2), torch.randn(2, 2), torch.zeros(2)

def not_a_model():
    return "model", torch.randn(2, 2), torch.zeros(2), nn.MSELoss()

def slow():
    import time
    time.sleep(60)
'''


@pytest.fixture()
def model_file(tmp_path: Path) -> Path:
    """SEQ_MODEL written to a file: name its functions as ``f"{model_file}:build"``."""
    path = tmp_path / "seq_model.py"
    path.write_text(SEQ_MODEL)
    return path


FAKE_FINGERPRINT = {"cpu_model": "Fake CPU", "physical_cores": 4, "versions": {"torch": "2.8.0"},
                    "bf16": {"avx2": True, "avx512": True, "native_bf16": False, "amx": False}}


@pytest.fixture
def fake_fingerprint() -> dict:
    """A made-up machine (4 cores, AVX-512) for result rows."""
    return dict(FAKE_FINGERPRINT)


@pytest.fixture
def sample_rows(fake_fingerprint) -> list:
    """Four result rows of chapter 02's batch experiment on that machine: two timings (with published values), two
    accuracies."""
    from helpers import results

    common = dict(fingerprint=fake_fingerprint, profile="smoke", data="standin", baseline="b32")
    out = results.make_rows("02", "batch", {"b32": [2.0, 2.2, 1.8], "b256": [1.0, 1.1, 0.9]}, metric="epoch_time",
                            unit="s", published={"b32": 10.0, "b256": 4.0}, published_source="book", **common)
    return out + results.make_rows("02", "batch", {"b32": [80.0], "b256": [70.0]}, metric="accuracy", unit="%",
                                   lower_is_better=False, **common)
