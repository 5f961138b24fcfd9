"""Append-only measurement store: one JSON object a line (`*.jsonl`), one file per sweep.

Why JSONL and not Parquet: rows arrive one at a time from long sweeps that may be killed at any
moment; appending a line and fsyncing is crash-safe and diff-friendly in git, and DuckDB reads the
files as they are (`SELECT * FROM read_json_auto('data/measurements/*.jsonl')`). Rows are never
rewritten: older schema versions are migrated on read (`migrate.py`). A torn last line from a
crash is skipped with a note, not fatal.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from pydantic import ValidationError

from tightfit.data.migrate import migrate
from tightfit.data.schema import Measurement
from tightfit.errors import TightfitError


@dataclass
class ReadResult:
    measurements: list[Measurement] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "file:line: why"


class MeasurementStore:
    """One append-only JSONL file of measurements."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.suffix != ".jsonl":
            raise TightfitError(f"measurement store must be a .jsonl file, got {str(self.path)!r}")

    def append(self, measurement: Measurement) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(measurement.model_dump(mode="json"), separators=(",", ":"))
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def read(self) -> ReadResult:
        return read_measurements([self.path]) if self.path.exists() else ReadResult()

    def run_keys(self, include_failed: bool = False) -> set[str]:
        """Keys of runs already stored (ok ones; failed too when asked) — what a resume skips."""
        return {m.run_key for m in self.read().measurements
                if m.status == "ok" or include_failed}


def expand_paths(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Files as given; directories become their `*.jsonl` files, sorted."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(p.rglob("*.jsonl"))
        elif p.is_file():
            out.append(p)
        else:
            raise TightfitError(f"no measurements at {str(p)!r}: give a .jsonl file or a directory")
    return out


def read_measurements(paths: Sequence[str | os.PathLike[str]]) -> ReadResult:
    result = ReadResult()
    for path in expand_paths(paths):
        with open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    _read_line(line, f"{path}:{n}", result)
    return result


def _read_line(line: str, where: str, result: ReadResult) -> None:
    try:
        row = json.loads(line)
        result.measurements.append(Measurement.model_validate(migrate(row)))
    except json.JSONDecodeError as exc:
        result.skipped.append(f"{where}: not JSON ({exc.msg}); a torn write?")
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(map(str, first["loc"]))
        result.skipped.append(f"{where}: {loc}: {first['msg']}")
    except TightfitError as exc:
        result.skipped.append(f"{where}: {exc}")


def flatten(measurement: Measurement) -> dict[str, Any]:
    """One flat dict with dotted keys (`results.ttft_s_p50`), lists and dicts kept as values."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any, model_like: bool) -> None:
        if model_like and isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v, _is_section(prefix, k))
        else:
            out[prefix] = value

    walk("", measurement.model_dump(mode="json"), True)
    return out


_SECTIONS = {"hardware", "software", "model", "config", "workload", "results"}


def _is_section(prefix: str, name: str) -> bool:
    return prefix == "" and name in _SECTIONS
