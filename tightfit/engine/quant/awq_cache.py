"""The AWQ result cache: searched scales and ranges, keyed by the weights' content, the plan
and the calibration settings, under awq/ in tightfit's cache (`TIGHTFIT_CACHE`, else
~/.cache/tightfit; the older `TIGHTFIT_CACHE_DIR` first).
A damaged or stale file is only a lost speed-up: it is ignored and recomputed."""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tightfit.engine.quant.plan import PrecisionPlan

if TYPE_CHECKING:
    from tightfit.engine.quant.awq_model import CalibrationSettings

log = logging.getLogger("tightfit.awq")

# Bump when the search or its folding changes, so stale cache files are not reused.
CACHE_VERSION = 3

def weights_digest(weights: dict[str, Any]) -> str:
    """sha256 over every tensor's name, type, shape and stored bytes (the model's identity,
    whichever file or directory it came from)."""
    h = hashlib.sha256()
    for name in sorted(weights):
        w = dict.__getitem__(weights, name)  # LazyWeights: the stored form, not materialised
        if isinstance(w, torch.Tensor):
            kind, shape, data = str(w.dtype), tuple(w.shape), w.contiguous().numpy()
        else:
            kind, shape, data = w.qtype_name, tuple(w.tensor.shape), w.tensor.data
        h.update(f"{name}|{kind}|{shape}|".encode())
        h.update(memoryview(np.ascontiguousarray(data)).cast("B"))
    return h.hexdigest()


def plan_spec(plan: PrecisionPlan) -> str:
    """The plan's content (not its file name) as canonical JSON."""
    return json.dumps({"default": plan.default.name,
                       "rules": [[p, f.name] for p, f in plan.rules]}, sort_keys=True)


def cache_key(weights: dict[str, Any], plan: PrecisionPlan, settings: CalibrationSettings
               ) -> dict[str, Any]:
    return {"version": CACHE_VERSION, "weights_sha256": weights_digest(weights),
            "plan": plan_spec(plan), "calibration": asdict(settings)}


def cache_dir() -> Path:
    """awq/ in tightfit's cache (`TIGHTFIT_CACHE`, else ~/.cache/tightfit); the older
    `TIGHTFIT_CACHE_DIR` is still read first."""
    from tightfit.buildcache import cache_root

    root = os.environ.get("TIGHTFIT_CACHE_DIR")
    return (Path(root) if root else cache_root()) / "awq"


def cache_path(key: dict[str, Any], plan: PrecisionPlan) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    slug = plan.default.name if not plan.rules else "plan"
    return cache_dir() / f"{key['weights_sha256'][:16]}-{slug}-{digest}.pt"


def read_cache(path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = torch.load(path, weights_only=True)
    except Exception as exc:  # a damaged cache is only a lost speed-up: recompute
        log.warning("ignoring unreadable AWQ cache %s: %s", path, exc)
        return None
    if not isinstance(data, dict) or data.get("key") != key:
        return None
    return data


def write_cache(path: Path, data: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(data, tmp)
        os.replace(tmp, path)  # atomic: a concurrent reader never sees half a file
    except OSError as exc:
        log.warning("could not write the AWQ cache %s: %s", path, exc)
