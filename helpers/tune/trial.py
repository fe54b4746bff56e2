"""One tuner trial (``python -m helpers.tune.trial``, a ``helpers.processes`` worker): a fresh seeded copy of the
reader's model (``FILE.py:FUNC``, contract in docs/tools.md) trained with some levers, timed and loss-checked."""

from __future__ import annotations

import importlib.util
import inspect
import math
import statistics
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

if __name__ == "__main__":  # a trial's own process: torch and this module imported frozen (helpers.processes)
    from ..processes import worker_main

    worker_main("helpers.tune.trial")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from .. import devices  # noqa: E402
from ..measure import time_fn  # noqa: E402
from ..seeds import set_seed  # noqa: E402
from ..step import train_step  # noqa: E402

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class TuneError(RuntimeError):
    """Something the reader can fix (a ``FILE.py:FUNC`` that does not load, an unknown device, a failing baseline)."""


@dataclass
class Workload:
    """What ``FUNC()`` returned, checked."""

    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    targets: torch.Tensor
    loss_fn: Callable[..., torch.Tensor]
    make_optimizer: Callable[[Any], torch.optim.Optimizer]

    @property
    def input_dims(self) -> int:
        """Number of dimensions of the first input (4 for an image batch)."""
        return self.inputs[0].dim()

    @property
    def batch_size(self) -> int:
        return int(self.inputs[0].shape[0]) if self.input_dims else 1


_USAGE = ("Name the model as FILE.py:FUNC (e.g. notebooks/examples/tabular_mlp.py:build), where FUNC() returns "
          "(model, inputs, targets, loss_fn) or (model, inputs, targets, loss_fn, make_optimizer).")


def load_function(spec: str) -> Callable[[], Any]:
    """The function named by ``FILE.py:FUNC``; TuneError otherwise."""
    if not isinstance(spec, str) or spec.count(":") < 1:
        raise TuneError(f"{spec!r} has no ':FUNC' part. {_USAGE}")
    where, func_name = spec.rsplit(":", 1)
    if not where or not func_name.isidentifier():
        raise TuneError(f"{spec!r} is not FILE.py:FUNC. {_USAGE}")
    path = Path(where)
    if not path.is_file():
        raise TuneError(f"model file {where!r} does not exist (looked from {Path.cwd().name}/). {_USAGE}")
    mod_name = f"_tune_model_{path.stem}"
    module_spec = importlib.util.spec_from_file_location(mod_name, path)
    if module_spec is None or module_spec.loader is None:
        raise TuneError(f"cannot import {where!r} as Python. {_USAGE}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[mod_name] = module  # dataclasses and pickling look modules up by name
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        raise TuneError(f"importing {where!r} failed: {type(exc).__name__}: {exc}") from exc
    func = getattr(module, func_name, None)
    if not callable(func):
        raise TuneError(f"{where!r} has no function {func_name!r}. {_USAGE}")
    return func


def default_optimizer(params: Any) -> torch.optim.Optimizer:
    """Adam with lr 1e-3: what the tuner uses when FUNC gives no optimizer factory."""
    return torch.optim.Adam(params, lr=1e-3)


def check_workload(returned: Any, spec: str = "FUNC") -> Workload:
    """Check what ``FUNC()`` returned and wrap it; TuneError with what is wrong otherwise."""
    if not isinstance(returned, (tuple, list)) or len(returned) not in (4, 5):
        got = f"a {type(returned).__name__}" + (f" of {len(returned)} items" if isinstance(returned, (tuple, list)) else "")
        raise TuneError(f"{spec}() returned {got}. {_USAGE}")
    model, inputs, targets, loss_fn = returned[:4]
    make_opt = returned[4] if len(returned) == 5 else default_optimizer
    if not isinstance(model, nn.Module):
        raise TuneError(f"{spec}(): item 1 must be a torch.nn.Module, got {type(model).__name__}. {_USAGE}")
    inputs_t = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    if not inputs_t or not all(isinstance(t, torch.Tensor) for t in inputs_t):
        raise TuneError(f"{spec}(): item 2 (inputs) must be a tensor or a tuple of tensors. {_USAGE}")
    if not isinstance(targets, torch.Tensor):
        raise TuneError(f"{spec}(): item 3 (targets) must be a tensor, got {type(targets).__name__}. {_USAGE}")
    if not callable(loss_fn):
        raise TuneError(f"{spec}(): item 4 (loss_fn) must be callable, e.g. torch.nn.CrossEntropyLoss(). {_USAGE}")
    if not callable(make_opt):
        raise TuneError(f"{spec}(): item 5 must be a function params -> optimizer. {_USAGE}")
    return Workload(model, inputs_t, targets, loss_fn, make_opt)


def load_workload(spec: str) -> Workload:
    """Seed (0), call the function named by ``spec`` and check what it returns."""
    func = load_function(spec)
    set_seed(0)
    try:
        returned = func()
    except Exception as exc:
        raise TuneError(f"{spec}() raised {type(exc).__name__}: {exc}") from exc
    return check_workload(returned, spec.rsplit(":", 1)[-1])


def _rebuild_optimizer(opt: torch.optim.Optimizer, kind: str) -> torch.optim.Optimizer:
    """The same optimizer class and settings, with ``foreach=True`` or ``fused=True``."""
    params = [p for group in opt.param_groups for p in group["params"]]
    accepted = inspect.signature(type(opt).__init__).parameters
    defaults = {k: v for k, v in opt.defaults.items() if k in accepted and k not in ("foreach", "fused")}
    extra = {"fused": True} if kind == "fused" else {"foreach": True}
    return type(opt)(params, **defaults, **extra)


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    return time_fn(fn, repeats=1, warmup=0, device=device).samples[0]


def run_trial(spec: str, levers: dict[str, Any], *, device: str = "cpu", guard_steps: int = 10,
              repeats: int = 3, block_s: float = 0.25) -> dict[str, Any]:
    """Train a fresh seeded copy of the model with ``levers``: ``guard_steps`` steps timed as one warm-up block (the
    last loss is the accuracy guard), then ``repeats`` blocks of about ``block_s`` seconds give the step time."""
    dev = devices.get_device(device)
    if levers.get("threads"):
        torch.set_num_threads(int(levers["threads"]))
    work = load_workload(spec)
    k = int(levers.get("batch", 1))
    model = work.model.to(dev)
    inputs = tuple((torch.cat([t] * k) if k > 1 else t).to(dev) for t in work.inputs)
    targets = (torch.cat([work.targets] * k) if k > 1 else work.targets).to(dev)
    if levers.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
        inputs = tuple(t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t for t in inputs)
    model.train()
    opt = work.make_optimizer(model.parameters())
    if levers.get("optimizer"):
        opt = _rebuild_optimizer(opt, levers["optimizer"])
    dtype = AUTOCAST_DTYPES.get(levers.get("autocast", ""))
    step_model = model
    if levers.get("compile"):
        mode = levers["compile"]
        step_model = torch.compile(model, mode=None if mode == "default" else mode)
    scaler = torch.amp.GradScaler(dev.type) if dtype == torch.float16 and dev.type == "cuda" else None

    def step() -> torch.Tensor:  # the course's one training step (helpers.step.train_step)
        return train_step(step_model, opt, work.loss_fn, inputs, targets, autocast_dtype=dtype, scaler=scaler,
                          device_type=dev.type)

    losses: list[float] = []

    def warmup() -> None:
        for i in range(guard_steps):
            loss = step()
            if i in (0, guard_steps - 1):
                losses.append(float(loss.detach().float()))

    warmup_s = _timed(warmup, dev)
    if not all(math.isfinite(v) for v in losses):
        return {"ok": False, "error": f"loss is not finite after {guard_steps} steps ({losses[-1]})",
                "warmup_s": warmup_s}
    one = max(_timed(step, dev), 1e-6)
    n = max(1, min(1000, math.ceil(block_s / one)))

    def block() -> None:
        for _ in range(n):
            step()

    samples = [_timed(block, dev) / n * 1000 for _ in range(repeats)]
    return {"ok": True, "step_ms": statistics.median(samples), "spread_ms": max(samples) - min(samples),
            "samples_ms": samples, "steps_per_block": n, "warmup_s": warmup_s,
            "first_loss": losses[0], "guard_loss": losses[-1], "batch_factor": k,
            "batch_size": work.batch_size * k, "threads": torch.get_num_threads(),
            "optimizer": type(opt).__name__}


def short_error(exc: BaseException) -> str:
    """One line naming an exception (the first line of its message, cut to 300 characters)."""
    exc = getattr(exc, "inner_exception", None) or exc  # torch.compile wraps the real reason
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}".rstrip(": ")


def diagnose_workload(spec: str, device: str = "cpu") -> dict[str, Any]:
    """The regime split of one step of a fresh seeded model (``helpers.diagnose``), as plain data."""
    from .. import diagnose  # noqa: PLC0415  (the tuner's one use of it)

    dev = devices.get_device(device)
    work = load_workload(spec)
    model = work.model.to(dev)
    inputs = tuple(t.to(dev) for t in work.inputs)
    found = diagnose.diagnose_step(model, inputs, work.targets.to(dev), work.loss_fn,  # inputs as train_step takes them
                                   work.make_optimizer(model.parameters()), device=str(dev))
    return {"shares": dict(found.shares), "top": found.top, "line": found.line(), "findings": list(found.findings),
            "detail": found.to_dict()}


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """One trial from a request (``run_trial``'s arguments, ``diagnose``); a failure is a result with its error."""
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            settings = {k: request[k] for k in ("device", "guard_steps", "repeats", "block_s") if k in request}
            result = run_trial(request["model"], request.get("levers", {}), **settings)
    except Exception as exc:
        result = {"ok": False, "error": short_error(exc), "trace": traceback.format_exc()[-2000:]}
    result["child_s"] = time.perf_counter() - start
    if request.get("diagnose") and result["ok"]:
        try:
            result["diagnosis"] = diagnose_workload(request["model"], request.get("device", "cpu"))
        except Exception as exc:
            result["diagnosis"] = {"error": f"the diagnosis failed: {short_error(exc)}"}
        result["diagnosis_s"] = time.perf_counter() - start - result["child_s"]
    return result


def worker(argv: list[str]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The worker hook of ``helpers.processes.worker_main``: every request is one trial."""
    return handle
