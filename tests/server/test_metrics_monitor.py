"""Metrics bookkeeping and the monitoring agent, without a model (milliseconds)."""
from __future__ import annotations

import sys
import time
from types import SimpleNamespace
from typing import Any

from tightfit.server import metrics as M
from tightfit.server.metrics import ServerMetrics
from tightfit.server.monitor import GpuSnapshot, ResourceMonitor, ResourceSnapshot


def sample(m: ServerMetrics, name: str, labels: dict[str, str] | None = None) -> float | None:
    return m.registry.get_sample_value(name, labels or {})


def test_priority_labels_come_and_go() -> None:
    m = ServerMetrics()
    m.set_queues({0: 2, 5: 1}, {-3: 4})
    assert sample(m, M.NUM_REQUESTS_RUNNING, {"priority": "5"}) == 1
    assert sample(m, M.NUM_REQUESTS_WAITING, {"priority": "-3"}) == 4
    m.set_queues({5: 1}, {})
    assert sample(m, M.NUM_REQUESTS_RUNNING, {"priority": "0"}) is None
    assert sample(m, M.NUM_REQUESTS_WAITING, {"priority": "-3"}) is None
    assert sample(m, M.NUM_REQUESTS_WAITING, {"priority": "0"}) == 0  # idle stays visible


def test_engine_stats_become_tiers_and_counter_increments() -> None:
    m = ServerMetrics()
    m.set_engine_stats({"kv_usage": 0.25, "num_preemptions": 3, "prefix_hit_tokens": 32}, 10)
    assert sample(m, M.KV_CACHE_USAGE, {"tier": "all"}) == 0.25
    m.set_engine_stats({"kv_usage": 0.5, "kv_usage_by_tier": {"short": 0.5, "long": 0.1},
                        "num_preemptions": 5, "prefix_hit_tokens": 32}, 4)
    assert sample(m, M.KV_CACHE_USAGE, {"tier": "all"}) is None
    assert sample(m, M.KV_CACHE_USAGE, {"tier": "long"}) == 0.1
    assert sample(m, M.NUM_PREEMPTIONS + "_total") == 5
    assert sample(m, M.PREFIX_CACHE_HITS + "_total") == 32
    assert sample(m, M.NUM_SWAPS + "_total") == 0
    assert sample(m, M.KV_CACHE_FREE_BLOCKS) == 4


def test_every_metric_name_has_the_prefix() -> None:
    text = ServerMetrics().render().decode()
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert names and all(n.startswith("tightfit:") for n in names)
    assert {M.TTFT, M.ITL, M.PROCESS_RSS, M.KV_CACHE_USAGE} <= names


def test_monitor_samples_in_the_background() -> None:
    seen: list[ResourceSnapshot] = []
    m = ServerMetrics()
    mon = ResourceMonitor(0.05, on_sample=lambda s: (seen.append(s), m.set_resources(s)))
    mon.start()
    try:
        deadline = time.monotonic() + 5
        while len(seen) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        mon.stop()
    snap = mon.snapshot()
    assert snap.rss_bytes > 10 * 2**20 and snap.num_threads >= 1
    assert 0 < snap.system_memory_available_bytes <= snap.system_memory_total_bytes
    assert sample(m, M.PROCESS_RSS) == seen[-1].rss_bytes
    count = len(seen)
    time.sleep(0.2)
    assert len(seen) == count  # stopped means stopped


def test_gpu_metrics_through_nvml_when_importable(monkeypatch: Any) -> None:
    fake = SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=3 * 2**30, total=8 * 2**30),
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=42))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    m = ServerMetrics()
    snap = ResourceMonitor(1.0).sample()
    m.set_resources(snap)
    assert snap.gpus == (GpuSnapshot(0, 3 * 2**30, 8 * 2**30, 42.0),)
    assert sample(m, M.GPU_MEMORY_USED, {"gpu": "0"}) == 3 * 2**30
    assert sample(m, M.GPU_UTILIZATION, {"gpu": "0"}) == 42


def test_no_gpu_metrics_without_nvml(monkeypatch: Any) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert ResourceMonitor(1.0).sample().gpus == ()
