"""What the chapters share, in one namespace (``lab.interleaved``): each name re-exported from its core module, but
``start`` and ``record``; helpers/README.md is the map."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from . import results, run_sizes, system
from .accuracy import Accuracies, above_chance, accuracy_of, compare as compare_accuracy
from .checkpoints import load_checkpoint
from .data import (IMAGENET_MEAN, IMAGENET_STD, StandInImages, heavy_pipeline, is_standin, load_dataset,
                   loading_pass, make_loader, spec as dataset_spec, take)
from .devices import (available_devices, describe as describe_device, get_device, grad_scaler_supported,
                      is_available as device_available, low_precision_dtype, synchronize)
from .diagnose import REGIME_LEVERS, diagnose_step, loader_wait, phase_times, training_step_flops
from .measure import (AA_PREFIX, DISTURBED, Result, Rounds, aa_name, aa_passes, interleaved, reading,
                      sample_long_enough, time_fn, with_aa)
from .models import book_cnn, count_parameters, torchvision_model
from .plots import round_ratios, speedup_bars
from .processes import Children, Job
from .profiling import profile_fn
from .published import load as load_published, select as select_published, value as published_value
from .results import ROWS_FILE, append_rows, results_dir
from .roofs import cached_roofs, measure_roofs
from .run_sizes import current_profile, data_source, optional_parts, pick
from .seeds import set_seed
from .step import train_step
from .system import LogicalCPU, Topology, cpu_bf16_support, env_report, topology
from .tables import Table
from .training import evaluate, set_loader_epoch, train
from .variants import decoded, diagnose_levers, fresh_process_rounds, fresh_rounds, run_variant
from .verdict import MIN_ROUNDS, ROUNDS, detectable, log_noise, verdict


def start() -> float:
    """Print the machine line and the run-size line, as every chapter opens; return the chapter's clock."""
    clock = time.perf_counter()
    print(system.env_report())
    print(run_sizes.describe())
    return clock


def record(measured: Rounds | Iterable[Result] | Mapping[str, Sequence[float]], chapter: str, experiment: str,
           **options: Any) -> Path:
    """Append a comparison's rows (Rounds, Results, or variant -> values with ``metric=``, ``unit=``) to rows.jsonl."""
    if isinstance(measured, Rounds):
        measured = [measured.result(name) for name in measured.names]
    if isinstance(measured, Mapping):
        rows = results.make_rows(chapter, experiment, dict(measured), **options)
    else:
        rows = results.rows_from_results(chapter, experiment, measured, **options)
    return results.append_rows(rows)
