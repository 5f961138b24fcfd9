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


def _register_builtin() -> None:
    @register(1)
    def v1_to_v2(row: Row) -> Row:
        """v2 records the code's git commit; v1 rows did not know it (explicit null)."""
        row["software"] = {**row["software"], "tightfit_commit": None}
        return row

    @register(2)
    def v2_to_v3(row: Row) -> Row:
        """v3 records the load-time peak RSS apart from the peak so far (explicit null)."""
        if row.get("results") is not None:
            row["results"] = {**row["results"], "load_peak_rss_mib": None}
        return row

    @register(3)
    def v3_to_v4(row: Row) -> Row:
        """v4 probes the GEMM and copy rates around each run (explicit null before)."""
        row["hardware"] = {**row["hardware"], "probe_matmul_gflops": None,
                           "probe_bandwidth_gbps": None}
        return row

    @register(4)
    def v4_to_v5(row: Row) -> Row:
        """v5 probes a block-format kernel's rate around each run (explicit null before)."""
        row["hardware"] = {**row["hardware"], "probe_kernel_gflops": None}
        return row

    @register(5)
    def v5_to_v6(row: Row) -> Row:
        """v6 probes the copy rate on the run's threads too (explicit null before)."""
        row["hardware"] = {**row["hardware"], "probe_bandwidth_threads_gbps": None}
        return row

    @register(6)
    def v6_to_v7(row: Row) -> Row:
        """v7 probes the kernel's streaming rate too (explicit null before)."""
        row["hardware"] = {**row["hardware"], "probe_kernel_stream_gbps": None}
        return row


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
