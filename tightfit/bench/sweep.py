"""Sweeps: a small YAML file -> the list of bench tasks (Cartesian product per block, minus
exclusions and combinations a backend cannot run) -> runs, appended to the sweep's store.

Resumable: a task whose run key is already stored as `ok` is skipped, so an interrupted sweep
picks up where it stopped (failed runs are retried unless `skip_failed`). Paths in the file are
relative to the file. The format is documented in docs/measurements.md.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tightfit.bench.backends import canonical
from tightfit.bench.backends.base import BackendOptions
from tightfit.bench.runner import Task
from tightfit.bench.workloads import Overrides, get_scenario
from tightfit.errors import TightfitError

OPTION_KEYS = ("model", "quant", "threads", "max_num_seqs", "block_size", "kv_cache_memory",
               "kv_dtype", "memory_budget", "prefix_caching", "max_model_len", "extra")
OVERRIDE_KEYS = ("num_requests", "prompt_tokens", "output_tokens", "concurrency", "rate_rps")
AXIS_KEYS = ("backend", "scenario", "seed", *OPTION_KEYS, *OVERRIDE_KEYS)
# Knobs that only tightfit's engine has: dropped for other backends so duplicates collapse.
ENGINE_ONLY = ("block_size", "kv_cache_memory", "kv_dtype", "memory_budget", "prefix_caching")
BACKEND_FORMATS = {"hf": ("fp32",), "llamacpp": ("native",)}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Block(_Strict):
    name: str | None = None
    axes: dict[str, list[Any]] = Field(min_length=1)
    exclude: list[dict[str, Any]] = []
    repeats: int | None = Field(default=None, ge=1)  # this block's runs; default: the file's


class SweepFile(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    store: str | None = None  # default: <file dir>/../measurements/<name>.jsonl
    seed: int = 0
    repeats: int = Field(default=1, ge=1)
    timeout_s: float | None = Field(default=None, gt=0)
    defaults: dict[str, Any] = {}
    blocks: list[Block] = Field(min_length=1)


@dataclass
class Plan:
    tasks: list[Task] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # combinations not run, and why


@dataclass(frozen=True)
class Sweep:
    spec: SweepFile
    path: Path

    @property
    def store_path(self) -> Path:
        rel = self.spec.store or f"../measurements/{self.spec.name}.jsonl"
        return (self.path.parent / rel).resolve()


def load_sweep(path: str | Path) -> Sweep:
    p = Path(path)
    if not p.is_file():
        raise TightfitError(f"sweep file {str(p)!r} not found")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise TightfitError(f"sweep file {p}: not valid YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise TightfitError(f"sweep file {p}: expected a mapping with name and blocks")
    try:
        spec = SweepFile.model_validate(raw)
    except ValidationError as exc:
        e = exc.errors()[0]
        raise TightfitError(f"sweep file {p}: {'.'.join(map(str, e['loc']))}: {e['msg']}") from None
    for where, keys in [("defaults", spec.defaults)] + [
            (f"blocks.{i}.axes", b.axes) for i, b in enumerate(spec.blocks)]:
        unknown = sorted(set(keys) - set(AXIS_KEYS))
        if unknown:
            raise TightfitError(f"sweep file {p}: {where}: unknown key(s) {', '.join(unknown)}; "
                                f"valid: {', '.join(AXIS_KEYS)}")
    sweep = Sweep(spec, p)
    plan(sweep)  # surfaces unknown backends / scenarios / formats now, not mid-sweep
    return sweep


def plan(sweep: Sweep) -> Plan:
    out, seen = Plan(), set()
    for block in sweep.spec.blocks:
        names = list(block.axes)
        for values in itertools.product(*(block.axes[n] for n in names)):
            point = {**sweep.spec.defaults, **dict(zip(names, values))}
            if any(all(point.get(k) == v for k, v in ex.items()) for ex in block.exclude):
                continue
            for repeat in range(block.repeats or sweep.spec.repeats):
                task = _task(point, sweep, repeat, out)
                if task is not None and task.run_key not in seen:
                    seen.add(task.run_key)
                    out.tasks.append(task)
    return out


def _task(point: dict[str, Any], sweep: Sweep, repeat: int, out: Plan) -> Task | None:
    where = f"sweep file {sweep.path}"
    if "backend" not in point or "scenario" not in point:
        raise TightfitError(f"{where}: every run needs a backend and a scenario (axes or defaults)")
    backend = canonical(str(point["backend"]))
    get_scenario(str(point["scenario"]))
    opts = {k: point[k] for k in OPTION_KEYS if k in point}
    _check_format(str(opts.get("quant", "fp32")), where)
    allowed = BACKEND_FORMATS.get(backend)
    if allowed and opts.get("quant", "fp32") not in allowed:
        out.skipped.append(f"{backend} cannot run weight format {opts.get('quant')!r} "
                           f"(only {', '.join(allowed)})")
        return None
    if backend != "tightfit":
        opts = {k: v for k, v in opts.items() if k not in ENGINE_ONLY}
    try:
        options = BackendOptions(**opts)
        overrides = Overrides(**{k: point[k] for k in OVERRIDE_KEYS if k in point})
    except TypeError as exc:
        raise TightfitError(f"{where}: {exc}") from None
    return Task(backend, options, str(point["scenario"]), overrides,
                int(point.get("seed", sweep.spec.seed)), repeat, sweep.spec.name,
                sweep.spec.timeout_s)


def _check_format(quant: str, where: str) -> None:
    try:
        from tightfit.engine.quant.formats import parse_weight_format
    except ImportError:  # formats module not present in this checkout: accept the base names
        if quant not in ("fp32", "native"):
            raise TightfitError(f"{where}: unknown weight format {quant!r}") from None
        return
    try:
        parse_weight_format(quant)
    except TightfitError as exc:
        raise TightfitError(f"{where}: {exc}") from None
