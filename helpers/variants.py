"""Training variants measured with the course protocol: ``run_variant`` (a fresh seeded model per repeat, first
epoch apart), ``fresh_process_rounds`` (a new process per arm and round, started untimed before the round) and
``fresh_rounds`` (the book's CNN under per-arm environments; ``python -m helpers.variants`` is its worker)."""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from typing import Any, Callable, Iterable, Mapping, Sequence

if __name__ == "__main__":  # a variant's worker process (helpers.processes)
    from .processes import worker_main

    worker_main("helpers.variants")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from .measure import Result, Rounds, interleaved  # noqa: E402
from .processes import Children  # noqa: E402
from .seeds import set_seed  # noqa: E402
from .training import LossFn, evaluate, train  # noqa: E402

FRESH_PROCESS_OPTIONS = ("name", "dataset", "epochs", "repeats", "batch_size", "lr", "train_size", "test_size",
                         "threads", "no_bias", "seed")


def run_variant(name: str, build_model: Callable[[], nn.Module], train_loader: Iterable,
                test_loader: Iterable | None, *, epochs: int, repeats: int = 3,
                make_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None,
                loss_fn: LossFn | None = None, device: torch.device | str = "cpu", seed: int = 0,
                settings: dict[str, Any] | None = None, **train_kwargs: Any) -> Result:
    """Train a fresh seeded model ``repeats`` times: warm-up = each first epoch, sample = the median of the rest;
    metrics (median over repeats): accuracy, loss, ``total_s``, ``steps`` and ``data_wait_s`` per epoch."""
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


def worker(argv: list[str]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The worker: build the data once, then train a fresh model for every request (one round)."""
    from . import data, models, system

    args = _parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    train_ds = data.take(data.load_dataset(args.dataset, train=True), args.train_size, seed=1)
    test_ds = data.take(data.load_dataset(args.dataset, train=False), args.test_size, seed=2)
    train_loader = data.make_loader(train_ds, args.batch_size, train=True, seed=args.seed)
    test_loader = data.make_loader(test_ds, 256, train=False)
    torch.optim.Adam([torch.zeros(1, requires_grad=True)]).zero_grad()  # its hooks load now, not in a round

    def one_round(request: dict[str, Any]) -> dict[str, Any]:
        started = time.time()
        res = run_variant(
            args.name, lambda: models.book_cnn(args.dataset, bias=not args.no_bias), train_loader, test_loader,
            epochs=args.epochs, repeats=int(request.get("repeats", args.repeats)), seed=args.seed, progress=False,
            make_optimizer=lambda p: torch.optim.Adam(p, lr=args.lr))
        return {"result": asdict(res), "torch_threads": torch.get_num_threads(),
                "openmp": system.openmp_runtimes(), "standin": data.is_standin(train_ds),
                "trained": [started, time.time()]}  # wall clock: when this process trained (and evaluated)

    return one_round


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m helpers.variants",
                                description="Train the book's CNN in a child process of helpers.processes: "
                                            "one fresh model per request line, one JSON result line each.")
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
    return p


def fresh_argv(options: dict[str, Any]) -> list[str]:
    """The command line of one variant process (``options`` with underscores, e.g. ``batch_size=64``)."""
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


def fresh_process_rounds(commands: Mapping[str, tuple[Sequence[str], Mapping[str, str] | None]],
                         request: Mapping[str, Any] | None = None, rounds: int | None = None, *,
                         value: Callable[[dict[str, Any]], Any] | None = None, timeout: float = 3600,
                         progress: bool = True, max_reruns: int | None = None, fresh_cache: bool = False,
                         desc: str = "fresh-process rounds", requests: Mapping[str, Mapping[str, Any]] | None = None,
                         attempts: int | None = None) -> tuple[Rounds, dict[str, Any]]:
    """Workers ``{name: (argv, env)}`` (``helpers.processes``) in ``interleaved`` rounds, a NEW process per arm and
    round, asked ``requests[name]`` (else ``request``); ``value(payload)`` is the timed value (default: its Result).
    ``fresh_cache``: each process gets its own empty Inductor (and Triton) cache, removed after its round."""
    facts: dict[str, Any] = {}
    live: dict[str, Any] = {}
    value = value or result_from_payload

    def start(order: list[str]) -> None:
        cmds = {}
        for name in order:
            argv, env = commands[name]
            env = {**(env or {}), "TQDM_DISABLE": "1"}
            if fresh_cache:
                live.setdefault("caches", []).append(tempfile.mkdtemp(prefix="inductor-"))
                env.update(TORCHINDUCTOR_CACHE_DIR=live["caches"][-1], TRITON_CACHE_DIR=live["caches"][-1] + "/triton")
            cmds[name] = (argv, env)
        live["kids"] = Children(cmds, startup_timeout=timeout)
        try:
            live["kids"].start()
        except BaseException:
            stop()
            raise

    def stop() -> None:
        kids = live.pop("kids", None)
        if kids is not None:
            kids.close()
        for folder in live.pop("caches", []):
            shutil.rmtree(folder, ignore_errors=True)

    def runner(name: str) -> Callable[[], Any]:
        def run() -> Any:
            payload = live["kids"].ask(name, dict((requests or {}).get(name, request) or {}), timeout=timeout)
            facts[name] = {k: v for k, v in payload.items() if k != "result"}
            return value(payload)
        return run

    try:
        res = interleaved({name: runner(name) for name in commands}, rounds, progress=progress,
                          max_reruns=max_reruns, desc=desc, attempts=attempts, before_round=start, after_round=stop)
    finally:
        stop()
    return res, facts


def fresh_rounds(envs: dict[str, dict[str, str] | None], rounds: int | None = None, *, timeout: float = 3600,
                 progress: bool = True, max_reruns: int | None = None, **options: Any) -> tuple[Rounds, dict[str, Any]]:
    """The book's CNN under per-arm environments ``{name: extra env}`` (``options``: ``epochs``, ``batch_size``,
    ``train_size``, ...) in ``fresh_process_rounds``; returns the Rounds (seconds per epoch after the
    warm-up epoch) and each arm's last process facts (``torch_threads``, ``openmp``, ``standin``)."""
    if "name" in options:
        raise ValueError("the variants are named by the keys of envs, not by a name option")
    commands = {name: (fresh_argv({"name": name, **options}), env) for name, env in envs.items()}
    return fresh_process_rounds(commands, {}, rounds, timeout=timeout, progress=progress, max_reruns=max_reruns)


def decoded(dataset: str, train: bool, n: int | None, seed: int) -> torch.utils.data.TensorDataset:
    """A seeded subset of ``n`` samples (``None``: all) of ``dataset`` decoded once into tensors, so that timed
    rounds time the model, not the decoding of images (chapter 05)."""
    from .data import load_dataset, take

    subset = take(load_dataset(dataset, train=train), n, seed=seed)
    images, labels = zip(*(subset[i] for i in range(len(subset))))
    return torch.utils.data.TensorDataset(torch.stack(images), torch.tensor(labels))


def diagnose_levers(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, *, channels_last: bool = False,
                    adam: Mapping[str, Any] | None = None, lr: float = 1e-3, **options: Any) -> Any:
    """One Adam training step of ``model`` on this batch with chapter 02's levers (``channels_last`` for the model and
    the batch, ``adam``: e.g. ``{"fused": True}``), placed on this device's roofs: ``helpers.diagnose.diagnose_step``'s
    Diagnosis (``.line()`` for one line). ``options`` go to ``diagnose_step`` (``roofs``, ``steps``, ``device``)."""
    from .diagnose import diagnose_step

    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, **dict(adam or {}))
    return diagnose_step(model, (inputs,), targets, nn.CrossEntropyLoss(), optimizer, **options)


def result_from_payload(payload: dict[str, Any]) -> Result:
    """The measure.Result inside a fresh-process payload."""
    r = payload["result"]
    return Result(r["name"], r["samples"], r["warmup"], r["metrics"], r["settings"])

