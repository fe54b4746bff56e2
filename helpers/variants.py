"""Training variants under the course protocol: ``run_variant``, ``fresh_process_rounds`` and ``fresh_rounds``."""

from __future__ import annotations

import argparse
import contextlib
import functools
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
from .training import evaluate, train  # noqa: E402


def run_variant(name: str, build_model: Callable[[], nn.Module], train_loader: Iterable,
                test_loader: Iterable | None, *, epochs: int, repeats: int = 3,
                make_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None,
                device: torch.device | str = "cpu", seed: int = 0, **train_kwargs: Any) -> Result:
    """Train a fresh seeded model ``repeats`` times: warm-up = each first epoch, sample = the median of the rest."""
    if epochs < 2 or repeats < 1:
        raise ValueError("run_variant needs epochs >= 2 (the first is warm-up, kept apart) and repeats >= 1")
    loss_fn = nn.CrossEntropyLoss()
    make_optimizer = make_optimizer or (lambda params: torch.optim.Adam(params, lr=1e-3))
    samples, warm, each = [], [], []  # each: every repeat's metrics
    for r in range(repeats):
        set_seed(seed)
        model = build_model().to(device)
        opt = make_optimizer(model.parameters())
        res = train(model, train_loader, opt, loss_fn, epochs=epochs, device=device,
                    desc=f"{name} {r + 1}/{repeats}", **train_kwargs)
        warm.append(res.epoch_times[0])
        samples.append(statistics.median(res.epoch_times[1:]))
        each.append({"total_s": res.total_time, "steps": float(res.steps), "loss": res.epoch_losses[-1],
                     "data_wait_s": statistics.median(res.data_wait[1:])})
        if test_loader is not None:
            ev = evaluate(model, test_loader, loss_fn, device=device, autocast_dtype=train_kwargs.get("autocast_dtype"))
            each[-1].update(loss=ev["loss"], accuracy=ev["accuracy"])
    metrics = {k: statistics.median(m[k] for m in each) for k in each[0]}
    return Result(name=name, samples=samples, warmup=warm, metrics=metrics)


def worker(argv: list[str]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The worker: build the data once, then train a fresh model for every request (one round)."""
    from . import data, models, system

    args = _parser().parse_args(argv)
    train_ds = data.take(data.load_dataset(args.dataset, train=True), args.train_size, seed=1)
    test_ds = data.take(data.load_dataset(args.dataset, train=False), args.test_size, seed=2)
    train_loader = data.make_loader(train_ds, args.batch_size, train=True, seed=args.seed)
    test_loader = data.make_loader(test_ds, 256, train=False)
    torch.optim.Adam([torch.zeros(1, requires_grad=True)]).zero_grad()  # its hooks load now, not in a round

    def one_round(request: dict[str, Any]) -> dict[str, Any]:
        started = time.time()
        res = run_variant(args.name, lambda: models.book_cnn(args.dataset), train_loader, test_loader,
                          epochs=args.epochs, repeats=1, seed=args.seed, progress=False,
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
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--train-size", type=int, default=None)
    p.add_argument("--test-size", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    return p


def fresh_process_rounds(commands: Mapping[str, tuple[Sequence[str], Mapping[str, str] | None]],
                         request: Mapping[str, Any] | None = None, rounds: int | None = None, *,
                         value: Callable[[dict[str, Any]], Any] | None = None, timeout: float = 3600,
                         progress: bool = True, fresh_cache: bool = False, desc: str = "fresh-process rounds",
                         requests: Mapping[str, Mapping[str, Any]] | None = None,
                         attempts: int | None = None) -> tuple[Rounds, dict[str, Any]]:
    """Workers ``{name: (argv, env)}`` in ``interleaved`` rounds, a NEW process (``fresh_cache``: and cache) per arm
    and round, asked ``requests[name]`` (else ``request``); ``value(payload)``: the timed value (default: Result)."""
    facts: dict[str, Any] = {}
    live, kids = contextlib.ExitStack(), None  # this round's caches and processes, closed after the round
    value = value or (lambda payload: Result(**payload["result"]))

    def start(order: list[str]) -> None:
        nonlocal kids
        cmds = {}
        for name in order:
            argv, env = commands[name]
            env = {**(env or {}), "TQDM_DISABLE": "1"}
            if fresh_cache:
                cache = live.enter_context(tempfile.TemporaryDirectory(prefix="inductor-", ignore_cleanup_errors=True))
                env.update(TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=cache + "/triton")
            cmds[name] = (argv, env)
        kids = live.enter_context(Children(cmds, startup_timeout=timeout))

    def ask(name: str) -> Any:
        payload = kids.ask(name, dict((requests or {}).get(name, request) or {}), timeout=timeout)
        facts[name] = {k: v for k, v in payload.items() if k != "result"}
        return value(payload)

    with live:
        res = interleaved({name: functools.partial(ask, name) for name in commands}, rounds, progress=progress,
                          desc=desc, attempts=attempts, before_round=start, after_round=live.close)
    return res, facts


def fresh_rounds(envs: dict[str, dict[str, str] | None], rounds: int | None = None, *, progress: bool = True,
                 **options: Any) -> tuple[Rounds, dict[str, Any]]:
    """The book's CNN under per-arm environments ``{name: extra env}`` in fresh processes; ``options``: its flags
    with underscores (``batch_size=64``; None: the default)."""
    known = set(vars(_parser().parse_args([]))) - {"name"}
    if unknown := sorted(set(options) - known):
        raise ValueError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))} "
                         "(the variants are named by the keys of envs)")
    flags = [arg for key, value in options.items() if value is not None
             for arg in ("--" + key.replace("_", "-"), str(value))]
    commands = {name: ([sys.executable, "-m", "helpers.variants", "--name", name, *flags], env)
                for name, env in envs.items()}
    return fresh_process_rounds(commands, {}, rounds, progress=progress)


def decoded(dataset: str, train: bool, n: int | None, seed: int) -> torch.utils.data.TensorDataset:
    """A seeded subset of ``n`` samples (``None``: all) of ``dataset`` decoded once into tensors (chapter 05)."""
    from .data import load_dataset, take

    subset = take(load_dataset(dataset, train=train), n, seed=seed)
    images, labels = zip(*(subset[i] for i in range(len(subset))))
    return torch.utils.data.TensorDataset(torch.stack(images), torch.tensor(labels))


def diagnose_levers(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, *, channels_last: bool = False,
                    adam: Mapping[str, Any] | None = None, lr: float = 1e-3, **options: Any) -> Any:
    """One Adam step of ``model`` with chapter 02's levers, placed on the roofs (``helpers.diagnose.diagnose_step``)."""
    from .diagnose import diagnose_step

    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, **dict(adam or {}))
    return diagnose_step(model, (inputs,), targets, nn.CrossEntropyLoss(), optimizer, **options)
