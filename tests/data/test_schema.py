"""The measurement schema: round trip, explicit nulls, ISO 8601 UTC, strictness, migration."""
from __future__ import annotations

import datetime as dt
import json

import pytest
from pydantic import ValidationError

from tightfit.data import migrate as mig
from tightfit.data.schema import SCHEMA_VERSION, Measurement
from tightfit.data.store import MeasurementStore, flatten, read_measurements
from tightfit.errors import TightfitError


def test_round_trip_is_exact(make_row):
    m = Measurement.model_validate(make_row())
    dumped = json.loads(json.dumps(m.model_dump(mode="json")))
    assert Measurement.model_validate(dumped) == m
    assert dumped == make_row()  # nothing added, nothing dropped, same spelling


def test_nulls_are_explicit_on_write_and_required_on_read(make_row):
    dumped = Measurement.model_validate(make_row()).model_dump(mode="json")
    assert "gpu_name" in dumped["hardware"] and dumped["hardware"]["gpu_name"] is None
    r = make_row()
    del r["hardware"]["gpu_name"]
    with pytest.raises(ValidationError, match="gpu_name"):
        Measurement.model_validate(r)


def test_timestamps_are_iso_utc(make_row):
    m = Measurement.model_validate(make_row(created_at="2026-01-02T05:04:05+02:00"))
    assert m.model_dump(mode="json")["created_at"] == "2026-01-02T03:04:05Z"
    with pytest.raises(ValidationError, match="timezone"):
        Measurement.model_validate(make_row(created_at="2026-01-02T03:04:05"))


def test_unknown_fields_and_bad_values_are_refused(make_row):
    with pytest.raises(ValidationError, match="extra"):
        Measurement.model_validate(make_row(**{"results.tok_s": 1.0}))
    with pytest.raises(ValidationError, match="status"):
        Measurement.model_validate(make_row(status="maybe"))


def test_failed_row_has_null_results(make_row):
    m = Measurement.model_validate(make_row(status="failed", error="boom", results=None))
    assert m.results is None and m.error == "boom"


def test_flatten_uses_dotted_section_keys(make_measurement):
    flat = flatten(make_measurement())
    assert flat["results.ttft_s_p50"] == 0.1
    assert flat["workload.priority_mix"] == {"0": 1.0}
    assert flat["status"] == "ok"


def test_migration_upgrades_old_rows_step_by_step(make_row, monkeypatch):
    def v0_to_v1(row):  # a v0 row called the RSS field peak_rss_mb (decimal MB)
        res = row["results"]
        res["peak_rss_mib"] = res.pop("peak_rss_mb") * 1e6 / 2**20
        return row

    monkeypatch.setitem(mig.MIGRATIONS, 0, v0_to_v1)
    old = make_row(schema_version=0)
    old["results"]["peak_rss_mb"] = old["results"].pop("peak_rss_mib")
    up = mig.migrate(old)
    assert up["schema_version"] == SCHEMA_VERSION == 7
    assert up["results"]["peak_rss_mib"] == pytest.approx(500.0 * 1e6 / 2**20)
    assert up["software"]["tightfit_commit"] is None  # by the real v1 -> v2 step
    assert up["results"]["load_peak_rss_mib"] is None  # by the real v2 -> v3 step
    assert up["hardware"]["probe_matmul_gflops"] is None  # by the real v3 -> v4 step
    assert up["hardware"]["probe_kernel_gflops"] is None  # by the real v4 -> v5 step
    assert up["hardware"]["probe_bandwidth_threads_gbps"] is None  # by the real v5 -> v6 step
    assert up["hardware"]["probe_kernel_stream_gbps"] is None  # by the real v6 -> v7 step
    Measurement.model_validate(up)


def test_version_1_rows_read_as_version_2_with_an_explicit_null_commit(make_row, tmp_path):
    v1 = make_row(schema_version=1)
    del v1["software"]["tightfit_commit"]
    del v1["results"]["load_peak_rss_mib"]
    del v1["hardware"]["probe_matmul_gflops"], v1["hardware"]["probe_bandwidth_gbps"]
    del v1["hardware"]["probe_kernel_gflops"], v1["hardware"]["probe_bandwidth_threads_gbps"]
    del v1["hardware"]["probe_kernel_stream_gbps"]
    with pytest.raises(ValidationError, match="tightfit_commit"):
        Measurement.model_validate(v1)  # not valid as v2 without migrating
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(v1) + "\n")
    (m,) = read_measurements([path]).measurements
    assert m.schema_version == SCHEMA_VERSION and m.software.tightfit_commit is None
    assert m.results.load_peak_rss_mib is None and m.hardware.probe_bandwidth_gbps is None
    assert json.loads(path.read_text()) == v1  # the file itself is never rewritten


def test_migration_refuses_newer_and_unknown_versions(make_row):
    with pytest.raises(TightfitError, match="upgrade tightfit"):
        mig.migrate(make_row(schema_version=SCHEMA_VERSION + 1))
    with pytest.raises(TightfitError, match="no migration from schema_version -1"):
        mig.migrate(make_row(schema_version=-1))
    with pytest.raises(TightfitError, match="no integer schema_version"):
        mig.migrate({"id": "x"})


def test_store_appends_and_reads_back_with_migration(tmp_path, make_row, make_measurement,
                                                     monkeypatch):
    store = MeasurementStore(tmp_path / "runs.jsonl")
    store.append(make_measurement(id="a", run_key="ka"))
    store.append(make_measurement(id="b", run_key="kb", status="failed", error="x", results=None))
    monkeypatch.setitem(mig.MIGRATIONS, 0, lambda r: r)
    with open(store.path, "a") as fh:  # an old row, then a torn write from a killed sweep
        fh.write(json.dumps(make_row(id="c", run_key="kc", schema_version=0)) + "\n")
        fh.write('{"schema_version": 1, "id": "d"')
    result = store.read()
    assert [m.id for m in result.measurements] == ["a", "b", "c"]
    assert len(result.skipped) == 1 and "runs.jsonl:4" in result.skipped[0]
    assert store.run_keys() == {"ka", "kc"}
    assert store.run_keys(include_failed=True) == {"ka", "kb", "kc"}


def test_store_reads_directories_and_rejects_bad_paths(tmp_path, make_measurement):
    MeasurementStore(tmp_path / "x" / "a.jsonl").append(make_measurement(id="1"))
    MeasurementStore(tmp_path / "x" / "b.jsonl").append(make_measurement(id="2"))
    assert [m.id for m in read_measurements([tmp_path]).measurements] == ["1", "2"]
    with pytest.raises(TightfitError, match="no measurements at"):
        read_measurements([tmp_path / "missing"])
    with pytest.raises(TightfitError, match=".jsonl"):
        MeasurementStore(tmp_path / "a.parquet")


def test_created_at_default_helper_is_utc():
    from tightfit.data.schema import utc_now

    assert utc_now().tzinfo == dt.timezone.utc


def test_the_data_package_and_the_bench_parent_import_no_torch():
    import subprocess
    import sys

    code = ("import sys, tightfit.data.quality, tightfit.data.migrate, tightfit.cli.bench, "
            "tightfit.bench.runner, tightfit.bench.sweep, tightfit.bench.report; "
            "print('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
