"""Measuring training variants with the course protocol.

``run_variant`` trains a fresh, identically seeded model per repeat, keeps the first epoch
apart as warm-up and reports the median of the rest with accuracy beside it;
``run_in_fresh_process`` does the same in a new Python process (``python -m
helpers.variants``), for settings such as OpenMP's that are read only at start-up, and
``run_in_fresh_processes`` runs several such variants one after another, their start-ups
side by side;
``overhead_vs_bare_loop`` checks what the training helper itself costs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from typing import Any, Callable, Iterable

if __name__ == "__main__":  # a variant's own process (python -m helpers.variants), not an import
    from .startup import import_frozen

    import_frozen("torch")  # starts sooner (see helpers.startup)

import torch  # noqa: E402
from torch import nn  # noqa: E402

from . import devices
from .measure import Result
from .seeds import set_seed
from .training import LossFn, set_loader_epoch, train, evaluate


def run_variant(name: str, build_model: Callable[[], nn.Module], train_loader: Iterable,
                test_loader: Iterable | None, *, epochs: int, repeats: int = 3,
                make_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None,
                loss_fn: LossFn | None = None, device: torch.device | str = "cpu", seed: int = 0,
                settings: dict[str, Any] | None = None, **train_kwargs: Any) -> Result:
    """Measure one training variant with the course protocol.

    Every repeat builds a fresh model with the same seed, trains ``epochs`` epochs and
    evaluates it. The first epoch of each repeat is reported as warm-up; the timed sample
    is the median time of the remaining epochs. Metrics: accuracy and loss (median over
    repeats), total training time, optimizer steps and the steady-state seconds per epoch
    spent waiting for data (``data_wait_s``).
    """
    if epochs < 2:
        raise ValueError("run_variant needs epochs >= 2 to keep the first (warm-up) epoch apart")
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    make_optimizer = make_optimizer or (lambda params: torch.optim.Adam(params, lr=1e-3))
    samples, warm, accs, losses, totals, waits = [], [], [], [], [], []
    steps = 0
    for r in range(repeats):
        set_seed(seed)
        model = build_model().to(device)
        opt = make_optimizer(model.parameters())
        res = train(model, train_loader, opt, loss_fn, epochs=epochs, device=device,
                    desc=f"{name} {r + 1}/{repeats}", **train_kwargs)
        warm.append(res.epoch_times[0])
        samples.append(statistics.median(res.epoch_times[1:]))
        totals.append(res.total_time)
        waits.append(statistics.median(res.data_wait[1:]))
        steps = res.steps
        if test_loader is not None:
            ev = evaluate(model, test_loader, loss_fn, device=device,
                          autocast_dtype=train_kwargs.get("autocast_dtype"))
            accs.append(ev["accuracy"])
            losses.append(ev["loss"])
        else:
            losses.append(res.epoch_losses[-1])
    metrics = {"total_s": statistics.median(totals), "steps": float(steps),
               "loss": statistics.median(losses), "data_wait_s": statistics.median(waits)}
    if accs:
        metrics["accuracy"] = statistics.median(accs)
    return Result(name=name, samples=samples, warmup=warm, metrics=metrics, settings=dict(settings or {}))


def overhead_vs_bare_loop(model_fn: Callable[[], nn.Module], loader: Iterable, *, epochs: int = 2,
                          repeats: int = 3, device: torch.device | str = "cpu", seed: int = 0) -> dict[str, float]:
    """Time ``train`` against a minimal hand-written loop on the same model and data.

    Returns both medians (seconds per run) and ``ratio`` = helper / bare (1.0 = no overhead).
    Runs alternate between the two so machine noise hits both alike.
    """
    device = torch.device(device)
    loss_fn = nn.CrossEntropyLoss()

    def bare() -> float:
        set_seed(seed)
        model = model_fn().to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        devices.synchronize(device)
        t = time.perf_counter()
        for epoch in range(epochs):
            set_loader_epoch(loader, epoch, 0)
            model.train()
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                loss = loss_fn(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        devices.synchronize(device)
        return time.perf_counter() - t

    def helper() -> float:
        set_seed(seed)
        model = model_fn().to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        t = time.perf_counter()
        train(model, loader, opt, loss_fn, epochs=epochs, device=device, progress=False)
        return time.perf_counter() - t

    bare(), helper()  # warm-up both
    b, h = [], []
    for _ in range(repeats):
        b.append(bare())
        h.append(helper())
    mb, mh = statistics.median(b), statistics.median(h)
    return {"bare_s": mb, "helper_s": mh, "ratio": mh / mb}


# ----------------------------------------------------------------------------------------
# One training variant in a fresh process: OpenMP and friends read their settings at start.
# ----------------------------------------------------------------------------------------

def _variant_from_args(args: argparse.Namespace) -> dict[str, Any]:
    from . import data, models, system

    if args.threads:
        torch.set_num_threads(args.threads)
    train_ds = data.take(data.load_dataset(args.dataset, train=True), args.train_size, seed=1)
    test_ds = data.take(data.load_dataset(args.dataset, train=False), args.test_size, seed=2)
    train_loader = data.make_loader(train_ds, args.batch_size, train=True, seed=args.seed)
    test_loader = data.make_loader(test_ds, 256, train=False)
    ready = None
    if args.wait_for_go:
        # torch.optim loads its compiler hooks on the first optimizer call (most of a second): do that
        # now, while the other variants start too, then wait until the parent says it is our turn.
        torch.optim.Adam([torch.zeros(1, requires_grad=True)]).zero_grad()
        ready = time.time()
        print(READY, flush=True)
        if sys.stdin.readline().strip() != GO:
            raise SystemExit("stopped before training (the parent did not say go)")
    started = time.time()
    res = run_variant(
        args.name, lambda: models.book_cnn(args.dataset, bias=not args.no_bias), train_loader, test_loader,
        epochs=args.epochs, repeats=args.repeats, seed=args.seed, progress=False,
        make_optimizer=lambda p: torch.optim.Adam(p, lr=args.lr),
    )
    return {
        "result": asdict(res),
        "torch_threads": torch.get_num_threads(),
        "openmp": system.openmp_runtimes(),
        "standin": data.is_standin(train_ds),
        "ready": ready or started,  # wall clock: start-up done (imports, data), waiting for its turn
        "trained": [started, time.time()],  # wall clock: when this process trained (and evaluated)
    }


# The options of the fresh-process command line (``run_in_fresh_process`` checks against these).
FRESH_PROCESS_OPTIONS = ("name", "dataset", "epochs", "repeats", "batch_size", "lr", "train_size", "test_size",
                         "threads", "no_bias", "seed")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m helpers.variants",
                                description="Train the book's CNN once per repeat and print a JSON result.")
    p.add_argument("--name", default="variant")
    p.add_argument("--dataset", default="fashionmnist", choices=["fashionmnist", "cifar10"])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--train-size", type=int, default=None)
    p.add_argument("--test-size", type=int, default=None)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave to OpenMP)")
    p.add_argument("--no-bias", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--wait-for-go", action="store_true",
                   help=f"start up, print {READY!r}, then train only after reading {GO!r} on stdin")
    return p


READY, GO = "variant-ready", "go"   # the start-up handshake of ``run_in_fresh_processes``


def _fresh_argv(options: dict[str, Any]) -> list[str]:
    argv = [sys.executable, "-m", "helpers.variants"]
    for key, value in options.items():
        if key not in FRESH_PROCESS_OPTIONS:
            raise ValueError(f"unknown option {key!r}; known: {', '.join(sorted(FRESH_PROCESS_OPTIONS))}")
        if isinstance(value, bool):
            if value:
                argv.append("--" + key.replace("_", "-"))
        elif value is not None:
            argv += ["--" + key.replace("_", "-"), str(value)]
    return argv


def _failed(name: str, code: int | None, stderr: str) -> RuntimeError:
    tail = "\n".join(stderr.strip().splitlines()[-5:])
    return RuntimeError(f"variant {name!r}: the training process failed (exit {code}):\n{tail}")


def run_in_fresh_process(env: dict[str, str] | None = None, timeout: float = 3600, **options: Any) -> dict[str, Any]:
    """Run one variant via ``python -m helpers.variants`` in a new process with ``env`` added.

    ``options`` are the command-line options with underscores (``name="x"``, ``epochs=2``,
    ``batch_size=64``, ``train_size=2000`` ...). Returns the child's JSON: the Result as a
    dict, its torch thread count and the OpenMP runtimes it had loaded.
    """
    name = str(options.pop("name", "variant"))
    return run_in_fresh_processes({name: env}, timeout=timeout, **options)[name]


def run_in_fresh_processes(envs: dict[str, dict[str, str] | None], timeout: float = 3600,
                           **options: Any) -> dict[str, dict[str, Any]]:
    """One fresh process per variant (``{name: env}``), trained one after another.

    Like calling ``run_in_fresh_process(env, name=name, **options)`` for each variant in turn,
    with the same payloads, only sooner: all processes start at once and import PyTorch and
    build their data side by side (none of that is timed), then each waits until the one before
    it has finished training and evaluating. No training ever runs beside another one.
    """
    if "name" in options:
        raise ValueError("the variants are named by the keys of envs, not by a name option")
    argvs = {name: _fresh_argv({"name": name, **options}) + ["--wait-for-go"] for name in envs}
    procs: dict[str, subprocess.Popen[str]] = {}
    logs = {name: tempfile.TemporaryFile("w+") for name in envs}
    deadline = time.monotonic() + timeout
    try:
        for name, env in envs.items():
            procs[name] = subprocess.Popen(argvs[name], env={**os.environ, **(env or {}), "TQDM_DISABLE": "1"},
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logs[name],
                                           text=True)
        for name, proc in procs.items():  # every process has started up before the first one trains
            if not _wait_for_line(proc, READY, deadline):
                proc.kill()
                proc.wait()
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"variant {name!r}: its process did not start within {timeout} s")
                raise _failed(name, proc.returncode, _read(logs[name]))
        payloads = {}
        for name, proc in procs.items():
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(GO + "\n")
            proc.stdin.close()
            timer = threading.Timer(max(0.0, deadline - time.monotonic()), proc.kill)
            timer.start()
            try:
                out = proc.stdout.read()
                code = proc.wait()
            finally:
                timer.cancel()
            if code != 0 or not out.strip():
                raise _failed(name, code, _read(logs[name]))
            payloads[name] = json.loads(out.strip().splitlines()[-1])
            payloads[name]["stderr"] = _read(logs[name])
        return payloads
    finally:
        for proc in procs.values():  # an error or Ctrl-C: nobody is left waiting
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs.values():
            log.close()


def _wait_for_line(proc: subprocess.Popen[str], line: str, deadline: float) -> bool:
    """Read the process's stdout until ``line`` (True), or its end (False); killed at ``deadline``."""
    assert proc.stdout is not None
    timer = threading.Timer(max(0.0, deadline - time.monotonic()), proc.kill)
    timer.start()
    try:
        return any(got.strip() == line for got in iter(proc.stdout.readline, ""))
    finally:
        timer.cancel()


def _read(log: Any) -> str:
    log.seek(0)
    return log.read()


def result_from_payload(payload: dict[str, Any]) -> Result:
    """The measure.Result inside a ``run_in_fresh_process`` payload."""
    r = payload["result"]
    return Result(r["name"], r["samples"], r["warmup"], r["metrics"], r["settings"])


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    print(json.dumps(_variant_from_args(args), default=str))


if __name__ == "__main__":
    from .startup import exit_without_collection

    main()
    exit_without_collection()
