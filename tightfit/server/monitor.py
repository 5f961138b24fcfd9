"""The monitoring agent: a background thread that samples process and machine resources (psutil;
GPU memory and utilisation through NVML when `pynvml` is importable and a driver answers) and
keeps the latest `ResourceSnapshot` for the metrics and for any scheduler that wants it.
Does not act on what it sees; sampling costs well under a millisecond."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import psutil

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuSnapshot:
    index: int
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_perc: float


@dataclass(frozen=True)
class ResourceSnapshot:
    time: float  # time.time() of the sample
    rss_bytes: int
    cpu_percent: float  # this process; 100 = one core busy
    num_threads: int
    system_memory_used_bytes: int
    system_memory_available_bytes: int
    system_memory_total_bytes: int
    system_cpu_percent: float  # 100 = every core busy
    gpus: tuple[GpuSnapshot, ...] = ()


class _Nvml:
    """NVML through pynvml (package nvidia-ml-py), if importable and a driver answers."""

    def __init__(self) -> None:
        self.lib: Any = None
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self.count = pynvml.nvmlDeviceGetCount()
            self.lib = pynvml
        except Exception:  # no package, no driver, no device: no GPU metrics
            self.count = 0

    def sample(self) -> tuple[GpuSnapshot, ...]:
        if self.lib is None:
            return ()
        out = []
        for i in range(self.count):
            try:
                h = self.lib.nvmlDeviceGetHandleByIndex(i)
                mem = self.lib.nvmlDeviceGetMemoryInfo(h)
                util = self.lib.nvmlDeviceGetUtilizationRates(h)
                out.append(GpuSnapshot(i, int(mem.used), int(mem.total), float(util.gpu)))
            except Exception as exc:  # a device that stops answering is skipped, not fatal
                log.debug("NVML sample of GPU %d failed: %s", i, exc)
        return tuple(out)


class ResourceMonitor:
    def __init__(self, interval_s: float = 1.0,
                 on_sample: Callable[[ResourceSnapshot], None] | None = None) -> None:
        self.interval_s = interval_s
        self.on_sample = on_sample
        self._proc = psutil.Process()
        self._proc.cpu_percent(None)  # the first reading primes the counters
        psutil.cpu_percent(None)
        self._nvml = _Nvml()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._latest = self.sample()

    def sample(self) -> ResourceSnapshot:
        """Takes one sample now (also updates `snapshot()`)."""
        vm = psutil.virtual_memory()
        with self._proc.oneshot():
            snap = ResourceSnapshot(
                time=time.time(), rss_bytes=self._proc.memory_info().rss,
                cpu_percent=self._proc.cpu_percent(None), num_threads=self._proc.num_threads(),
                system_memory_used_bytes=vm.total - vm.available,
                system_memory_available_bytes=vm.available, system_memory_total_bytes=vm.total,
                system_cpu_percent=psutil.cpu_percent(None), gpus=self._nvml.sample())
        self._latest = snap
        return snap

    def snapshot(self) -> ResourceSnapshot:
        """The latest sample (thread-safe: snapshots are immutable and replaced whole)."""
        return self._latest

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tightfit-monitor",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        while True:
            try:
                snap = self.sample()
                if self.on_sample is not None:
                    self.on_sample(snap)
            except Exception:  # keep sampling; one bad reading is not worth a dead monitor
                log.exception("resource sample failed")
            if self._stop.wait(self.interval_s):
                return
