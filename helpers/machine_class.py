"""Machine classes from a fingerprint: which machines' results belong side by side.

A result row (``helpers.results``) carries the fingerprint of the machine that measured it
(``helpers.system.fingerprint()``). From it, ``isa_class`` names the CPU instruction sets that
decide the course's CPU results, ``hardware_class`` puts machines that should give similar
ratios into one class (same accelerators, or same physical cores and ISA), and ``machine_key``
tells one machine from another (its private ``machine_id``, else a hash of its hardware).

Plain data: no torch.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def isa_class(fingerprint: dict[str, Any]) -> str:
    """The instruction sets that decide the course's CPU results, as one label."""
    bf16 = fingerprint.get("bf16") or {}
    if bf16.get("amx"):
        return "AMX"
    if bf16.get("native_bf16"):
        return "AVX512-BF16"
    if bf16.get("avx512"):
        return "AVX-512"
    if bf16.get("avx2"):
        return "AVX2"
    return "no AVX2" if bf16 else "unknown ISA"


def hardware_class(fingerprint: dict[str, Any]) -> str:
    """Machines that should give similar ratios: accelerator, else physical cores and ISA."""
    accel = fingerprint.get("accelerators") or []
    if accel:
        names = sorted(set(accel))
        return f"{len(accel)}x {names[0]}" if len(names) == 1 else " + ".join(names)
    cores = fingerprint.get("physical_cores", "?")
    return f"CPU {cores} cores, {isa_class(fingerprint)}"


def machine_key(fingerprint: dict[str, Any]) -> str:
    """``machine_id`` when the fingerprint has one, else a hash of its hardware fields."""
    if fingerprint.get("machine_id"):
        return str(fingerprint["machine_id"])
    hardware = {k: fingerprint.get(k) for k in ("cpu_model", "sockets", "physical_cores", "logical_cores",
                                                 "numa_nodes", "bf16", "accelerators")}
    return "hw-" + hashlib.sha256(json.dumps(hardware, sort_keys=True, default=str).encode()).hexdigest()[:12]
