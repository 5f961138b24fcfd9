"""Measure this machine (memory bandwidth by a numpy copy, matmul rate by a numpy fp32 GEMM, the
rate of a block-format SIMD kernel as a share of it) and write a device profile that `predict`
uses for hardware "local"/"this". The short engine run is done by the CLI (`tightfit
calibrate`, which may import torch) and stored here as `engine_runs`.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict
from pathlib import Path

from tightfit.predictor.hardware import DeviceSpec, measured_cpu


def _best_of(fn: object, repeats: int, min_time_s: float = 0.25) -> float:
    """Fastest of at least `repeats` calls, going on until `min_time_s` has passed: on a busy
    machine a multi-threaded BLAS call can stall on a descheduled peer thread, and five tries of
    a small product all stalled (a 128^3 GEMM read 0 GFLOP/s once while another job ran)."""
    best = float("inf")
    start = time.perf_counter()
    done = 0
    while done < repeats or (time.perf_counter() - start < min_time_s and done < 10_000):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - t0)
        done += 1
    return best


def matmul_tflops(n: int = 1024, repeats: int = 5) -> float:
    """fp32 GEMM rate (2 n^3 FLOPs per product), best of `repeats`."""
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    t = _best_of(lambda: a @ b, repeats)
    return 2 * n**3 / t / 1e12


def total_memory_gb() -> float:
    import psutil

    return psutil.virtual_memory().total / 2**30


def physical_cores() -> int:
    """This machine's physical cores: the threads llama.cpp runs by default, and what the
    thread-count terms of the base (llama.cpp's barriers, roofline._layer_overhead_s) count."""
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def probe_ratios(threads: int, rounds: int = 3
                 ) -> tuple[float | None, float, float | None]:
    """Three ratios from the bench's run probe (`tightfit.bench.fingerprint.probe_in_child`) on
    `threads` threads, each the median over `rounds` probes (those that did not fail):
    - the block-format kernel's rate as a share of the fp32 GEMM rate (a 512^3 GEMM and the
      lite runtime's Q4_0 kernel, medians: the method hardware.KERNEL_SHARE_OF_GEMM was measured
      by); None where the kernel cannot be built. The share, not the rate, is kept: on a VM both
      rates move with the host's load and their share stays (0.22-0.25 on the Xeon of
      docs/predictor.md while its GEMM read 86-141 GFLOP/s). With another process on one of two
      cores a single probe's 2-thread GEMM can stall while the kernel does not, and one such
      share put a calibrated lite prediction 4x too fast: hence the median;
    - what a copy split over the threads streams over a one-thread copy (256 MiB each), within
      [1, threads]: a copy that fits in the caches (calibrate's `--size-mb 16`, on a VM with
      300 MiB of L3) measures the caches and read 0.2-3x, so this one is never smaller. 1.84 on
      the 2-core Xeon VM; the engines' bandwidth priors were set on a machine whose one-thread
      copy is taken as the whole;
    - the rate at which the lite kernel streams a matrix larger than the caches as a share of
      the copy split over the same threads (None where the kernel cannot be built): 0.34 on
      the Xeon VM, 0.98 on the EPYC VM (hardware.KERNEL_STREAM_SHARE_OF_COPY)."""
    import statistics

    from tightfit.bench.fingerprint import probe_in_child

    # each in a fresh process, as the bench takes them: in this one, numpy's BLAS threads and
    # the kernel's OpenMP threads, both just used, spin on the same two cores, and three
    # calibrations in a row read shares of 0.175, 0.246 and 0.375 (0.24-0.275 apart)
    got = [p for p in (probe_in_child(threads) for _ in range(rounds)) if p]
    if not got:
        return None, 1.0, None

    def median_ratio(num: str, den: str) -> float | None:
        pairs = [(p[num], p[den]) for p in got]
        return statistics.median(a / b for a, b in pairs) if all(a and b for a, b in pairs) \
            else None

    gain = statistics.median((p["bandwidth_threads_gbps"] or 0.0) / (p["bandwidth_gbps"] or 1.0)
                             for p in got)
    return (median_ratio("kernel_gflops", "matmul_gflops"), max(1.0, min(float(threads), gain)),
            median_ratio("kernel_stream_gbps", "bandwidth_threads_gbps"))


def measure(mb: int = 256, n: int = 1024) -> DeviceSpec:
    """A DeviceSpec for this machine's CPU from quick measurements (a few seconds); its
    bandwidth is the rated equivalent of a one-thread copy (hardware.COPY_OF_PEAK), streamed
    `probe_ratios`' gain faster on its physical cores, its kernel rate the GEMM rate x
    `probe_ratios`' share, and the kernel's streaming share as `probe_ratios` reads it."""
    from tightfit.bench.fingerprint import cpu_model_and_flags, measure_bandwidth_gbps

    cores = physical_cores()
    bw = measure_bandwidth_gbps(mib=mb)  # the bench fingerprint's copy: a profile and a row agree
    gflops = round(matmul_tflops(n) * 1000.0, 1)
    share, gain, stream = probe_ratios(cores)
    # the CPU's own name where the OS gives it: a prediction reads the vendor from it
    # (DeviceSpec.amd_cpu: MKL keeps torch's fp32 products on one thread on an AMD CPU)
    model, _ = cpu_model_and_flags()
    name = f"local {model or platform.machine()} {cores}-core"
    return measured_cpu(name, round(total_memory_gb(), 2), round(bw, 2), gflops, cores,
                        None if share is None else round(gflops * share, 1), round(gain, 3),
                        None if stream is None else round(stream, 3))


def save_profile(spec: DeviceSpec, path: Path,
                 engine_runs: list[dict[str, object]] | None = None) -> dict[str, object]:
    payload = {"device": asdict(spec), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "method": {"bandwidth": "numpy copyto, read+write bytes",
                          "threads_bandwidth_gain": "copy split over the physical cores / "
                                                    "one-thread copy",
                          "matmul": "numpy fp32 GEMM",
                          "kernel": "fp32 GEMM x (lite Q4_0 kernel / 512^3 GEMM, same threads)",
                          "kernel_stream_share": "lite Q8_0 kernel on a 143 MB matrix, GB/s / "
                                                 "copy split over the same threads"},
               "engine_runs": engine_runs or []}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))
    return payload
