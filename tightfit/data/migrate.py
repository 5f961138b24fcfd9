"""Schema migration: rows written under an older `schema_version` are upgraded step by step
(v -> v+1) when read, so the append-only files never need rewriting.

To change the schema: bump `SCHEMA_VERSION` in schema.py and register one function here that
turns a version-(N-1) row dict into a version-N row dict (rename, split, fill explicit nulls).
Rows from a newer tightfit than this one are refused with a clear message, never guessed at.
"""
from __future__ import annotations

from typing import Any, Callable

from tightfit.data.schema import SCHEMA_VERSION
from tightfit.errors import TightfitError

Row = dict[str, Any]
# from_version -> function producing a row of from_version + 1.
MIGRATIONS: dict[int, Callable[[Row], Row]] = {}


def _adds_nulls(section: str, *fields: str) -> Callable[[Row], Row]:
    """A step that adds `fields` to a row's `section` as explicit nulls: what an older row did
    not record (a section the row lacks, such as a failed run's results, stays absent)."""
    def step(row: Row) -> Row:
        if row.get(section) is not None:
            row[section] = {**row[section], **dict.fromkeys(fields)}
        return row
    return step


def _register_builtin() -> None:
    # v2 records the code's git commit
    register(1)(_adds_nulls("software", "tightfit_commit"))
    # v3 records the load-time peak RSS apart from the peak so far
    register(2)(_adds_nulls("results", "load_peak_rss_mib"))
    # v4 probes the GEMM and copy rates around each run
    register(3)(_adds_nulls("hardware", "probe_matmul_gflops", "probe_bandwidth_gbps"))
    # v5 probes a block-format kernel's rate around each run
    register(4)(_adds_nulls("hardware", "probe_kernel_gflops"))
    # v6 probes the copy rate on the run's threads too
    register(5)(_adds_nulls("hardware", "probe_bandwidth_threads_gbps"))
    # v7 probes the kernel's streaming rate too
    register(6)(_adds_nulls("hardware", "probe_kernel_stream_gbps"))


def register(from_version: int) -> Callable[[Callable[[Row], Row]], Callable[[Row], Row]]:
    def deco(fn: Callable[[Row], Row]) -> Callable[[Row], Row]:
        MIGRATIONS[from_version] = fn
        return fn
    return deco


def migrate(row: Row, target: int = SCHEMA_VERSION) -> Row:
    """Returns `row` upgraded to `target`; raises TightfitError when no path exists."""
    version = row.get("schema_version")
    if not isinstance(version, int):
        raise TightfitError(
            f"row has no integer schema_version (got {version!r}); not a measurement")
    if version > target:
        raise TightfitError(
            f"row has schema_version {version} but this tightfit reads up to {target}: "
            "upgrade tightfit")
    while version < target:
        step = MIGRATIONS.get(version)
        if step is None:
            raise TightfitError(f"no migration from schema_version {version} to {version + 1}")
        row = step(dict(row))
        version += 1
        row["schema_version"] = version
    return row


_register_builtin()
