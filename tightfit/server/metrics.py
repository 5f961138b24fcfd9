"""Prometheus metrics of the server: every name is defined here, once (vLLM-like, `tightfit:`
prefix). Each app gets its own registry, so several servers can live in one process (tests).
Updated by the engine thread and the resource monitor; prometheus-client is thread-safe."""
from __future__ import annotations

from typing import Any, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tightfit.server.monitor import ResourceSnapshot

PREFIX = "tightfit:"
NUM_REQUESTS_RUNNING = PREFIX + "num_requests_running"
NUM_REQUESTS_WAITING = PREFIX + "num_requests_waiting"
KV_CACHE_USAGE = PREFIX + "kv_cache_usage_perc"
KV_CACHE_FREE_BLOCKS = PREFIX + "kv_cache_free_blocks"
NUM_PREEMPTIONS = PREFIX + "num_preemptions"  # counters are exposed as ..._total
NUM_SWAPS = PREFIX + "num_swaps"
KV_EVICTED_BLOCKS = PREFIX + "kv_evicted_blocks"
KV_RECLAIMED_IDLE_BLOCKS = PREFIX + "kv_reclaimed_idle_blocks"
PREFIX_CACHE_HITS = PREFIX + "prefix_cache_hits"
PREFIX_CACHE_QUERIES = PREFIX + "prefix_cache_queries"
PROMPT_TOKENS = PREFIX + "prompt_tokens"  # exposed as ..._total
GENERATION_TOKENS = PREFIX + "generation_tokens"  # exposed as ..._total
REQUEST_SUCCESS = PREFIX + "request_success"  # exposed as ..._total
REQUEST_FAILURE = PREFIX + "request_failure"  # exposed as ..._total
REQUESTS_REJECTED = PREFIX + "requests_rejected"  # exposed as ..._total
TTFT = PREFIX + "time_to_first_token_seconds"
ITL = PREFIX + "inter_token_latency_seconds"
E2E = PREFIX + "e2e_request_latency_seconds"
PROCESS_RSS = PREFIX + "process_resident_memory_bytes"
PROCESS_CPU = PREFIX + "process_cpu_percent"
PROCESS_THREADS = PREFIX + "process_num_threads"
SYSTEM_MEMORY_USED = PREFIX + "system_memory_used_bytes"
SYSTEM_MEMORY_AVAILABLE = PREFIX + "system_memory_available_bytes"
SYSTEM_CPU = PREFIX + "system_cpu_percent"
GPU_MEMORY_USED = PREFIX + "gpu_memory_used_bytes"
GPU_MEMORY_TOTAL = PREFIX + "gpu_memory_total_bytes"
GPU_UTILIZATION = PREFIX + "gpu_utilization_perc"

TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0)
ITL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 10.0, 20.0)
# engine.stats() key -> (counter, help): running totals in the engine, exported as increments.
ENGINE_COUNTERS = {
    "num_preemptions": (NUM_PREEMPTIONS, "Sequences preempted"),
    "num_swaps": (NUM_SWAPS, "Preemptions that swapped KV blocks to a slower tier"),
    "kv_evicted_blocks": (KV_EVICTED_BLOCKS, "Cached KV blocks evicted for new work"),
    "kv_reclaimed_idle_blocks": (KV_RECLAIMED_IDLE_BLOCKS, "Idle cached KV blocks reclaimed"),
    "prefix_hit_tokens": (PREFIX_CACHE_HITS, "Prompt tokens found in the prefix cache"),
    "prefix_query_tokens": (PREFIX_CACHE_QUERIES, "Prompt tokens looked up in the prefix cache"),
}
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)


class ServerMetrics:
    """The server's metric objects on one registry, with small update methods."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.running = Gauge(NUM_REQUESTS_RUNNING, "Sequences in the running batch, by priority",
                             ["priority"], registry=r)
        self.waiting = Gauge(NUM_REQUESTS_WAITING, "Sequences waiting to run, by priority",
                             ["priority"], registry=r)
        self.kv_usage = Gauge(KV_CACHE_USAGE, "Fraction of KV blocks held by live sequences "
                              "(0..1), by tier", ["tier"], registry=r)
        self.kv_free = Gauge(KV_CACHE_FREE_BLOCKS, "Free KV blocks", registry=r)
        self.engine_counters = {key: Counter(name, doc, registry=r)
                                for key, (name, doc) in ENGINE_COUNTERS.items()}
        self._engine_seen: dict[str, float] = {}
        self.prompt_tokens = Counter(PROMPT_TOKENS, "Prompt tokens of started requests",
                                     registry=r)
        self.generation_tokens = Counter(GENERATION_TOKENS, "Generated tokens", registry=r)
        self.success = Counter(REQUEST_SUCCESS, "Sequences finished, by finish reason",
                               ["finished_reason"], registry=r)
        self.failure = Counter(REQUEST_FAILURE, "Sequences failed by an internal error",
                               registry=r)
        self.rejected = Counter(REQUESTS_REJECTED, "HTTP requests refused before reaching the "
                                "engine, by reason", ["reason"], registry=r)
        self.ttft = Histogram(TTFT, "Arrival to first token", buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(ITL, "Time between consecutive tokens of a sequence",
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram(E2E, "Arrival to last token", buckets=E2E_BUCKETS, registry=r)
        self._init_resource_gauges(r)
        self._priorities: dict[str, set[str]] = {"running": set(), "waiting": set()}
        self._tiers: set[str] = set()

    def _init_resource_gauges(self, r: CollectorRegistry) -> None:
        self.rss = Gauge(PROCESS_RSS, "Resident memory of the server process", registry=r)
        self.cpu = Gauge(PROCESS_CPU, "CPU use of the server process (100 = one core)",
                         registry=r)
        self.threads = Gauge(PROCESS_THREADS, "Threads of the server process", registry=r)
        self.sys_mem_used = Gauge(SYSTEM_MEMORY_USED, "Memory in use on the machine", registry=r)
        self.sys_mem_avail = Gauge(SYSTEM_MEMORY_AVAILABLE, "Memory available on the machine",
                                   registry=r)
        self.sys_cpu = Gauge(SYSTEM_CPU, "CPU use of the machine (100 = all cores)", registry=r)
        self.gpu_mem_used = Gauge(GPU_MEMORY_USED, "GPU memory in use", ["gpu"], registry=r)
        self.gpu_mem_total = Gauge(GPU_MEMORY_TOTAL, "GPU memory in total", ["gpu"], registry=r)
        self.gpu_util = Gauge(GPU_UTILIZATION, "GPU utilisation (0..100)", ["gpu"], registry=r)

    # -- engine side (called from the engine thread) ------------------------------------------

    def set_queues(self, running: Mapping[int, int], waiting: Mapping[int, int]) -> None:
        """Sequence counts by priority; label values that have no sequences are removed, so a
        client sending many distinct priorities cannot grow the label set without bound."""
        self._set_by_priority(self.running, "running", running)
        self._set_by_priority(self.waiting, "waiting", waiting)

    def _set_by_priority(self, gauge: Gauge, kind: str, counts: Mapping[int, int]) -> None:
        live = {str(p): n for p, n in counts.items() if n}
        for stale in self._priorities[kind] - live.keys():
            gauge.remove(stale)
        for label, n in live.items():
            gauge.labels(label).set(n)
        if not live:  # keep one sample so that the series is visible while idle
            gauge.labels("0").set(0)
            live["0"] = 0
        self._priorities[kind] = set(live)

    def set_engine_stats(self, stats: Mapping[str, Any], free_blocks: int) -> None:
        """KV usage by tier (the whole pool as tier "all" if the engine has no tiers), free
        blocks, and the increments of the engine's running totals."""
        self._set_kv(stats.get("kv_usage_by_tier") or {"all": stats["kv_usage"]}, free_blocks)
        for key, counter in self.engine_counters.items():
            value = stats.get(key)
            if value is None:
                continue
            delta = value - self._engine_seen.get(key, 0)
            if delta > 0:
                counter.inc(delta)
            self._engine_seen[key] = value

    def _set_kv(self, usage_by_tier: Mapping[str, float], free_blocks: int) -> None:
        for stale in self._tiers - usage_by_tier.keys():
            self.kv_usage.remove(stale)
        for tier, usage in usage_by_tier.items():
            self.kv_usage.labels(tier).set(usage)
        self._tiers = set(usage_by_tier)
        self.kv_free.set(free_blocks)

    # -- resources (called from the monitor thread) -------------------------------------------

    def set_resources(self, snap: ResourceSnapshot) -> None:
        self.rss.set(snap.rss_bytes)
        self.cpu.set(snap.cpu_percent)
        self.threads.set(snap.num_threads)
        self.sys_mem_used.set(snap.system_memory_used_bytes)
        self.sys_mem_avail.set(snap.system_memory_available_bytes)
        self.sys_cpu.set(snap.system_cpu_percent)
        for gpu in snap.gpus:
            self.gpu_mem_used.labels(str(gpu.index)).set(gpu.memory_used_bytes)
            self.gpu_mem_total.labels(str(gpu.index)).set(gpu.memory_total_bytes)
            self.gpu_util.labels(str(gpu.index)).set(gpu.utilization_perc)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
