"""The engines of ``helpers.deploy`` compared with the course's protocol: interleaved rounds, a fresh
session per engine per round, the first call apart, agreement with PyTorch eager fp32 on at least
32 inputs, and the verdict, table and result rows of the comparison.
"""

from __future__ import annotations

import gc
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .. import measure, results
from ..measure import Result
from ..tables import Table
from .engines import (DEVICES, ENGINES, EXPORTERS, DeployError, Runner, agreement, eager_devices, eager_runner,
                      export_onnx, onnxruntime_providers, onnxruntime_runner, openvino_devices, openvino_runner,
                      parse_engines)
from .served import ModelSpec, fixed_batch


@dataclass
class EngineResult:
    """One engine's measurement on one fixed batch."""

    name: str
    engine: str
    device: str
    precision: str
    batch: int
    latencies: list[float]
    warmup: list[float]
    export_s: float
    load_s: float
    max_abs_diff: float
    top1_agreement: float
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    agreement_n: int = 0
    rounds: measure.Rounds | None = None

    @property
    def latency_ms(self) -> float:
        """Median over rounds of each round's median call latency, in ms."""
        return 1e3 * statistics.median(self.latencies)

    @property
    def throughput(self) -> float:
        """Images per second at the median latency."""
        return self.batch / statistics.median(self.latencies)

    def throughputs(self) -> list[float]:
        return [self.batch / t for t in self.latencies]

    def as_result(self) -> Result:
        """The latencies as a ``helpers.measure.Result`` (for speed-up tables and plots)."""
        return Result(self.name, list(self.latencies), list(self.warmup),
                      {"images_per_s": self.throughput, "max_abs_diff": self.max_abs_diff,
                       "top1_agreement": 100 * self.top1_agreement},
                      {"engine": self.engine, "device": self.device, "precision": self.precision})


def _targets(engines: list[tuple[str, str | None]], device: str) -> list[tuple[str, str, str | None]]:
    lookup = {"eager": eager_devices, "onnxruntime": onnxruntime_providers, "openvino": openvino_devices}
    return [(engine, target, hint) for engine, hint in engines for target in lookup[engine](device)]


def _variant(engine: str, target: str, hint: str | None) -> str:
    short = target.replace("ExecutionProvider", "")
    suffix = "" if short.lower() == "cpu" else f"@{short}"
    return f"{engine}{f':{hint}' if hint else ''}{suffix}"


AGREEMENT_INPUTS = 32  # agreement is judged on at least this many inputs, never on one sample


def _agreement_set(x: np.ndarray, seed: int = 1) -> np.ndarray:
    """The timed batch plus seeded random inputs, at least ``AGREEMENT_INPUTS`` rows, a multiple of the batch
    (a static export accepts only its own batch size)."""
    batch = x.shape[0]
    chunks = max(1, -(-AGREEMENT_INPUTS // batch))
    extra = fixed_batch(x.shape[1:], batch * (chunks - 1), seed=seed) if chunks > 1 else x[:0]
    return np.concatenate([x, extra])


def _run_chunked(run: Runner, inputs: np.ndarray, batch: int) -> np.ndarray:
    return np.concatenate([run(inputs[i:i + batch]) for i in range(0, len(inputs), batch)])


AA_FROM_ARMS = 3  # a comparison of this many engine variants or more carries an A/A arm (DESIGN.md)


def _spec_of(st: dict[str, Any]) -> tuple[str, str, str | None, bool]:
    """The (engine, target, hint, dynamic) a variant's state was built from."""
    return st["engine"], st["target"], st["hint"], st["dyn"]


def compare(spec: ModelSpec, *, batch: int = 1, engines: str | Sequence[str] = ENGINES, device: str = "cpu",
            precision: str | None = None, repeats: int = 5, warmup: int = 3, workdir: str | Path | None = None,
            dynamic_batch: bool = False, inputs: np.ndarray | None = None, rounds: int | None = None,
            also_dynamic: bool = False, progress: bool = True, exporter: str = "dynamo") -> list[EngineResult]:
    """Export ``spec.model`` once, then time every engine on the same fixed batch, in interleaved rounds.

    The export is ``torch.onnx.export`` with ``exporter`` ("dynamo", its default since torch 2.9, or
    "torchscript", the older ``dynamo=False``), see ``engines.export_onnx``.

    Each round (``rounds``, default ``measure.ROUNDS``) every engine, in a Williams-design order, builds a
    fresh session, makes one first call (timed apart: lazy set-up), ``warmup`` untimed calls and
    ``repeats`` timed calls; the round's value is their median. Agreement with PyTorch eager fp32
    is measured once per engine on at least ``AGREEMENT_INPUTS`` inputs. ``also_dynamic`` adds,
    for every ONNX engine, a variant exported with a dynamic batch axis, in the same rounds.

    With three or more variants the comparison carries an A/A arm (``helpers.measure.with_aa``): the
    first variant (the baseline) timed a second time, with its own fresh session every round, as a
    result named ``measure.aa_name(baseline)`` (the last one). When it gets a verdict, the rounds are
    measured again (``measure.interleaved``) and, if it still does, ``verdict`` and ``results_table``
    give every other engine the word ``measure.DISTURBED``.
    """
    if device not in DEVICES:
        raise DeployError(f"Unknown --device {device!r}; choose from {', '.join(DEVICES)}.")
    if exporter not in EXPORTERS:
        raise DeployError(f"Unknown exporter {exporter!r}; choose from {', '.join(EXPORTERS)}.")
    if batch < 1 or repeats < 1 or warmup < 0 or (rounds is not None and rounds < 1):
        raise DeployError("batch, repeats and rounds must be >= 1 and warmup >= 0")
    chosen = [(e, h or (precision if e == "openvino" else None)) for e, h in parse_engines(engines)]
    targets = [(e, t, h, dynamic_batch) for e, t, h in _targets(chosen, device)]
    if also_dynamic:
        targets += [(e, t, h, not dynamic_batch) for e, t, h, _ in targets if e != "eager"]
    x = inputs if inputs is not None else fixed_batch(spec.input_shape, batch)
    batch = x.shape[0]
    check = _agreement_set(x)
    reference = _run_chunked(eager_runner(spec.model, "cpu", None)[0], check, batch)
    exports: dict[bool, tuple[Path, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(workdir or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for dyn in sorted({d for e, _, _, d in targets if e != "eager"}):
            path = folder / f"{spec.name.replace(':', '_')}{'_dynamic' if dyn else ''}.onnx"
            exports[dyn] = (path, export_onnx(spec.model, torch.from_numpy(x), path, dynamic_batch=dyn,
                                                exporter=exporter))
        state: dict[str, dict[str, Any]] = {}

        def variant(name: str, engine: str, target: str, hint: str | None, dyn: bool) -> Callable[[], tuple[float, dict]]:
            st = state.setdefault(name, {"engine": engine, "target": target, "hint": hint, "dyn": dyn, "load": [],
                                         "first": []})

            def one_round() -> tuple[float, dict]:
                start = time.perf_counter()
                if engine == "eager":
                    run, used = eager_runner(spec.model, target, hint)
                elif engine == "onnxruntime":
                    run, used = onnxruntime_runner(exports[dyn][0], target)
                else:
                    run, used = openvino_runner(exports[dyn][0], target, hint)
                st["load"].append(time.perf_counter() - start)
                sync = target if engine == "eager" else "cpu"
                st["first"].append(measure.time_fn(lambda: run(x), repeats=1, warmup=0, device=sync).samples[0])
                st["precision"] = used
                if "diff" not in st:
                    st["diff"], st["top1"] = agreement(_run_chunked(run, check, batch), reference)
                timed = measure.time_fn(lambda: run(x), repeats=repeats, warmup=warmup, device=sync)
                del run  # one engine's thread pool at a time: an idle pool can still compete for the cores
                gc.collect()
                return statistics.median(timed.samples), {}
            return one_round

        calls = {}
        for engine, target, hint, dyn in targets:
            name = _variant(engine, target, hint) + (" (dynamic batch)" if also_dynamic and dyn else "")
            calls[name] = variant(name, engine, target, hint, dyn)
        if len(calls) >= AA_FROM_ARMS:  # the baseline again, as its own arm with its own sessions
            base = next(iter(calls))
            calls = measure.with_aa(calls, base, again=variant(measure.aa_name(base), *_spec_of(state[base])))
        got = measure.interleaved(calls, rounds, progress=progress, desc="engine rounds")
        spec.model.to("cpu")
    out = []
    for name, st in state.items():
        export_s = 0.0 if st["engine"] == "eager" else exports[st["dyn"]][1]
        out.append(EngineResult(name, st["engine"], st["target"], st["precision"], batch, got.samples[name],
                                st["first"], export_s, statistics.median(st["load"]), st["diff"], st["top1"],
                                extra={"other_cores": [round(i.cores, 3) for i in got.interference],
                                       "reruns": got.reruns, "dynamic_batch": st["dyn"],
                                       "exporter": None if st["engine"] == "eager" else exporter},
                                agreement_n=len(check), rounds=got))
    return out


def verdict(found: Sequence[EngineResult], name: str, baseline: str | None = None) -> measure.Verdict:
    """The verdict of engine ``name`` against ``baseline`` (default: the first), by latency.

    Results measured in one ``compare`` share their ``measure.Rounds``; its ``verdict`` is used, so an A/A arm
    that got a verdict turns every other engine's word into ``measure.DISTURBED``. Results without shared
    rounds get ``helpers.measure.verdict`` of their latencies.
    """
    by = {r.name: r for r in found}
    if baseline is not None and baseline not in by:
        raise DeployError(f"no engine {baseline!r} among {', '.join(by)}")
    if name not in by:
        raise DeployError(f"no engine {name!r} among {', '.join(by)}")
    base = by[baseline] if baseline else found[0]
    return _verdict(base, by[name])


def _verdict(base: EngineResult, r: EngineResult) -> measure.Verdict:
    rounds = base.rounds
    if rounds is not None and r.rounds is rounds and {base.name, r.name} <= set(rounds.names):
        return rounds.verdict(r.name, base.name)
    return measure.verdict(base.latencies, r.latencies)


def results_table(found: Sequence[EngineResult], baseline: str | None = None, title: str = "") -> Table:
    """One row per engine (the A/A arm, when there is one, last): throughput, latency median/min/max over rounds,
    speed-up with interval and verdict (``verdict``: DISTURBED for every engine when the A/A arm got a verdict),
    export/load/first-call times, agreement and precision."""
    if not found:
        raise DeployError("no engine results to tabulate")
    base = next((r for r in found if r.name == baseline), found[0])
    table = Table(["engine", "precision", "images/s", "latency ms", "min ms", "max ms", "speed-up vs " + base.name + " (x)",
                   "95% interval (x)", "verdict", "export s", "load/compile s", "first call s", "max |diff|",
                   "top-1 agree %"], title=title)
    for r in found:
        if r is base:
            cells: list[Any] = [1.0, "-", "baseline"]
        else:
            v = _verdict(base, r)
            cells = [v.ratio, v.interval, measure.aa_word(v) if r.name.startswith(measure.AA_PREFIX) else v.label]
        table.add(r.name, r.precision, r.throughput, r.latency_ms, 1e3 * min(r.latencies), 1e3 * max(r.latencies),
                  *cells, r.export_s, r.load_s, statistics.median(r.warmup) if r.warmup else None,
                  r.max_abs_diff, 100 * r.top1_agreement)
    rounds = found[0].rounds
    n = found[0].agreement_n
    table.note = ((rounds.note() + " " if rounds is not None else "")
                  + "Latency: median of each round's timed calls (fresh session, first call apart). "
                    f"Agreement: with PyTorch eager fp32 on {n} inputs.")
    return table


def to_rows(found: Sequence[EngineResult], *, chapter: str = "14", experiment: str, baseline: str | None = None,
            data: str = "none", label: str = "") -> list[results.Row]:
    """Result rows (helpers.results): throughput (images/s) and latency (ms) per engine, details in ``extra``."""
    base = baseline or found[0].name
    extra = {r.name: {"engine": r.engine, "device": r.device, "precision": r.precision, "batch": r.batch,
                      "export_s": r.export_s, "load_s": r.load_s,
                      "first_call_s": statistics.median(r.warmup) if r.warmup else None,
                      "max_abs_diff": r.max_abs_diff, "top1_agreement": r.top1_agreement, "model": label, **r.extra}
             for r in found}
    rows = results.make_rows(chapter, experiment, {r.name: r.throughputs() for r in found}, metric="throughput",
                             unit="images/s", baseline=base, lower_is_better=False, data=data, extra=extra)
    ctx = {"fingerprint": rows[0].fingerprint, "profile": rows[0].profile, "data": data}
    rows += results.make_rows(chapter, experiment, {r.name: [1e3 * t for t in r.latencies] for r in found},
                              metric="latency", unit="ms", baseline=base, extra=extra, **ctx)
    return rows
