"""Hardware and software fingerprint recorded with every run: CPU model and flags, cores, memory,
measured copy bandwidth and fp32 matmul rate (short numpy micro-benchmarks, cached per machine in
`~/.cache/tightfit/fingerprint-<machine_id>.json`), GPU through NVML when present, library
versions, the load average (contention) at the time of the run, and a short probe of the GEMM and
copy rates on the run's own threads taken just before and after it (`probe`: a VM's cores are not
always as fast as when the cached figures were taken).

The micro-benchmarks measure what numpy sees with all cores; under contention they read low, so
the load average at the time they ran is kept next to them (`--refresh-fingerprint` re-measures).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import psutil

from tightfit.buildcache import cache_root
from tightfit.config import default_threads

# ISA features that decide which kernels run fast (x86 and Arm spellings).
FLAGS_OF_INTEREST = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni",
                     "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "neon", "asimd",
                     "asimddp", "sve", "i8mm", "bf16")
LIBRARIES = {"torch": "torch", "transformers": "transformers", "numpy": "numpy",
             "llama_cpp_python": "llama-cpp-python"}


def cache_dir() -> Path:
    return cache_root()


def cpu_model_and_flags() -> tuple[str | None, list[str]]:
    model, flags = None, set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or None, []
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name in ("model name", "hardware", "cpu model") and model is None:
            model = value.strip()
        elif name in ("flags", "features"):
            flags.update(value.split())
    return model, sorted(f for f in flags if f in FLAGS_OF_INTEREST)


def logical_cpus() -> int:
    return default_threads()


def machine_id(cpu_model: str | None, cores: int | None, mem_bytes: int) -> str:
    raw = f"{cpu_model}|{cores}|{logical_cpus()}|{round(mem_bytes / 2**30)}|{platform.node()}"
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


def load_avg_1m() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def split(n: int, parts: int) -> list[slice]:
    """`parts` contiguous slices covering range(n) once, as even as integers allow."""
    edges = [n * i // parts for i in range(parts + 1)]
    return [slice(a, b) for a, b in zip(edges, edges[1:])]


def measure_bandwidth_gbps(mib: int = 256, repeats: int = 5, threads: int = 1) -> float:
    """Best-of copy rate of a `mib` MiB float32 array, counting read + write bytes; with
    `threads` > 1 the copy is split into that many slices copied at once (numpy releases the
    GIL while it copies). One core does not always reach what the machine streams: on the 2-core
    Xeon VM a one-thread copy read 19-22 GB/s and a two-thread one 35-40 (docs/predictor.md,
    "Bandwidth at the run's threads")."""
    return measure_bandwidths_gbps((threads,), mib, repeats)[0]


def measure_bandwidths_gbps(thread_counts: tuple[int, ...], mib: int = 256,
                            repeats: int = 5) -> tuple[float, ...]:
    """`measure_bandwidth_gbps` at each of `thread_counts`, in order, on one pair of arrays (the
    run probe takes one thread's copy and the run's threads' copy: one allocation, and one
    round of first-touch page faults, not two)."""
    import numpy as np
    from concurrent.futures import ThreadPoolExecutor

    src = np.ones(mib * 2**20 // 4, dtype=np.float32)
    dst = np.empty_like(src)
    rates = []
    for threads in thread_counts:
        if threads <= 1:
            best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats))
        else:
            parts = [(dst[part], src[part]) for part in split(len(src), threads)]
            with ThreadPoolExecutor(threads) as pool:
                def copy() -> None:
                    list(pool.map(lambda p: np.copyto(*p), parts))
                copy()  # the pool's threads start
                best = min(_timed(copy) for _ in range(repeats))
        rates.append(round(2 * src.nbytes / best / 1e9, 2))
    return tuple(rates)


def measure_matmul_gflops(n: int = 1024, repeats: int = 3) -> float:
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b  # first call pays thread start-up
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return round(2 * n**3 / best / 1e9, 1)


KERNEL_PROBE_ROWS = 4096  # a 4096 x 4096 Q4_0 matrix: 9 MiB, within most CPUs' L3 cache, so
# the kernel's arithmetic and not DRAM sets the rate (a smaller L3 gives a lower figure)
# A 16384 x 8192 Q8_0 matrix: 143 MB, beyond the caches (the Xeon VM's kernel streamed 71, 143
# and 285 MB matrices at the same 5.7-5.8 GB/s at one thread, an 18 MB one at 13.8), and about
# the size of the default model's Q8_0 weights (145 MB).
STREAM_PROBE_SHAPE = (16384, 8192)
_BLOCK_BYTES = {2: 18, 8: 34}  # GGML Q4_0, Q8_0: f16 scale + 16 nibble / 32 int8 bytes


def _lite_kernels(march: str | None) -> Any:
    """The lite runtime's library where its block kernels are SIMD code, else None (no C
    compiler; no AVX-512 VNNI, where they are plain C, ~10x slower than llama.cpp's AVX2 or
    NEON kernels, and would describe nothing the engines run)."""
    from tightfit.errors import TightfitError
    from tightfit.lite.runtime import SIMD, library

    try:
        lib = library(march)
    except TightfitError:
        return None
    return lib if SIMD[lib.tf_simd()] == "avx512-vnni" else None


def _time_lite_linear(lib: Any, kind: int, rows: int, cols: int, threads: int,
                      seconds: float) -> tuple[float, int]:
    """Median seconds of one token through the lite runtime's `tf_linear` against a
    `rows` x `cols` matrix of GGML type `kind` on `threads` threads, and the matrix's bytes."""
    import ctypes

    import numpy as np

    from tightfit.errors import TightfitError

    rng = np.random.default_rng(0)
    width = _BLOCK_BYTES[kind]
    blocks = np.empty((rows * cols // 32, width), dtype=np.uint8)
    # every block alike: the kernel's time does not depend on the values (integer dot products)
    blocks[:] = rng.integers(0, 127, size=width, dtype=np.uint8)
    blocks[:, :2] = np.array([0.01], dtype=np.float16).view(np.uint8)
    x = rng.standard_normal((1, cols)).astype(np.float32)
    y = np.empty((1, rows), dtype=np.float32)
    fp = ctypes.POINTER(ctypes.c_float)
    xp, yp = x.ctypes.data_as(fp), y.ctypes.data_as(fp)
    threads = max(1, threads)

    def call() -> None:
        if lib.tf_linear(kind, rows, cols, blocks.ctypes.data, 1, xp, yp, threads) != 0:
            raise TightfitError("the lite kernel probe's call was refused")

    call()  # thread pool start-up, first touch of the matrix
    return _median_time(call, seconds), blocks.nbytes


def measure_kernel_gflops(threads: int = 1, seconds: float = 0.1,
                          march: str | None = None) -> float | None:
    """This CPU's rate on a hand-written SIMD block-format kernel: the lite runtime's Q4_0
    matrix-vector product (`tf_linear`, one token against a 4096 x 4096 matrix, activations
    rounded to int8 as in decode) on `threads` threads, GFLOP/s, median over `seconds`. None
    where the library cannot be built or its block kernels are not SIMD code (`_lite_kernels`).

    Why it is measured apart from the fp32 GEMM: two 2-core VMs in tightfit's dataset differ in
    it by 2.2x at one thread (an AMD EPYC 52.1 GFLOP/s, an Intel Xeon 23.4) while their numpy
    GEMM rates are 101.8 and 123.6, and llama.cpp's and the lite runtime's decode follow the
    kernel (docs/predictor.md, "A kernel probe")."""
    lib = _lite_kernels(march)
    if lib is None:
        return None
    n = KERNEL_PROBE_ROWS
    took, _ = _time_lite_linear(lib, 2, n, n, threads, seconds)
    return 2.0 * n * n / took / 1e9


def measure_kernel_stream_gbps(threads: int = 1, seconds: float = 0.1,
                               march: str | None = None) -> float | None:
    """The rate at which the same hand-written kernel streams weights from memory: the lite
    runtime's Q8_0 matrix-vector product against a matrix larger than the caches
    (STREAM_PROBE_SHAPE) on `threads` threads, GB/s of matrix bytes read, median over
    `seconds`. None where `measure_kernel_gflops` is None.

    Why apart from the copy rate: on the Xeon VM this kernel streams 5.8 GB/s at one thread
    and 11.5 at two, 0.31-0.35 of a copy on the same threads (18.9 / 32.9 GB/s read +
    write), where the EPYC VM's two threads streamed 25 GB/s against its 25.6 GB/s copy; and
    the Xeon's llama.cpp and lite decode stream their F16 and Q8_0 weights at the kernel's
    rate, not the copy's (docs/predictor.md, "A streaming probe")."""
    lib = _lite_kernels(march)
    if lib is None:
        return None
    rows, cols = STREAM_PROBE_SHAPE
    took, nbytes = _time_lite_linear(lib, 8, rows, cols, threads, seconds)
    return nbytes / took / 1e9


PROBE_SECONDS = 0.12  # GEMM timing per probe; taken before and after each run
# what `probe` returns; rows keep them as probe_* (kernel_gflops: None where it cannot be built)
PROBED = ("matmul_gflops", "bandwidth_gbps", "kernel_gflops", "bandwidth_threads_gbps",
          "kernel_stream_gbps")


def probe(threads: int, seconds: float = PROBE_SECONDS) -> dict[str, float | None]:
    """The machine's state around one run: the median rate of a 512^3 fp32 numpy GEMM on the
    run's own thread count over `seconds`; the copy rate as the cached fingerprint takes it
    (`measure_bandwidths_gbps`, best of 3: one thread, and again split over the run's threads,
    on the same arrays);
    and the rate of a hand-written block-format kernel on the same threads
    (`measure_kernel_gflops`: the lite runtime's Q4_0 matrix-vector product; None
    where it cannot be built or is not SIMD code), and the rate at which that kernel streams a
    matrix larger than the caches (`measure_kernel_stream_gbps`, Q8_0, 143 MB). Two CPUs can
    order the GEMM and the kernel differently, and the kernel's streaming and a copy
    (docs/predictor.md, "A kernel probe", "A streaming probe"). On a VM the cached figures are not the
    whole story: here a 2-thread GEMM read ~145 GFLOP/s for minutes, then ~200 (the host's load
    on the second vCPU), and a 512-token int8 prefill ~455 vs ~620 tok/s with it (correlation
    0.76 over 16 alternating probes and prefills). Allocates ~0.6 GB: the bench runs it in a
    child process (`probe_in_child`) so the measured process's peak RSS never sees it."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 512), dtype=np.float32)
    b = rng.standard_normal((512, 512), dtype=np.float32)
    with threadpool_limits(limits=max(1, threads)):
        a @ b  # thread start-up
        gemm = _median_time(lambda: a @ b, seconds)
    copies = measure_bandwidths_gbps((1, threads) if threads > 1 else (1,), repeats=3)
    one, split_copy = copies[0], copies[-1]
    return {"matmul_gflops": 2 * 512**3 / gemm / 1e9, "bandwidth_gbps": one,
            "kernel_gflops": measure_kernel_gflops(threads, seconds),
            "bandwidth_threads_gbps": split_copy,
            "kernel_stream_gbps": measure_kernel_stream_gbps(threads, seconds)}


def probe_in_child(threads: int, timeout_s: float = 60.0) -> dict[str, float | None] | None:
    """`probe` in a fresh Python process (its memory stays out of the caller's peak RSS);
    None if it fails or times out."""
    import subprocess
    import sys

    code = ("import json, sys; from tightfit.bench.fingerprint import probe; "
            "print(json.dumps(probe(int(sys.argv[1]))))")
    try:
        done = subprocess.run([sys.executable, "-c", code, str(max(1, threads))],
                              capture_output=True, text=True, timeout=timeout_s, check=True)
        got = json.loads(done.stdout.strip().splitlines()[-1])
        return {k: None if got.get(k) is None else float(got[k]) for k in PROBED}
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, IndexError):
        return None


def _median_time(fn: Any, seconds: float) -> float:
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < seconds:
        times.append(_timed(fn))
    return sorted(times)[len(times) // 2]


def probe_fields(before: dict[str, float | None] | None, after: dict[str, float | None] | None
                 ) -> dict[str, float | None]:
    """The row's `probe_*` fields: the mean of the probes before and after the run (either
    alone if the other failed or lacks the figure; None without any)."""
    out: dict[str, float | None] = {}
    for k in PROBED:
        got = [v for p in (before, after) if p and (v := p.get(k)) is not None]
        out[f"probe_{k}"] = round(sum(got) / len(got), 1) if got else None
    return out


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def gpu_info() -> tuple[str | None, float | None, int]:
    """(name, memory GiB, count) of NVML GPU 0; (None, None, 0) without NVML or a GPU."""
    try:
        import pynvml
    except ImportError:
        return None, None, 0
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        if not count:
            return None, None, 0
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
        return (name.decode() if isinstance(name, bytes) else name), round(mem, 2), count
    except Exception:  # NVML present but no driver/GPU: report none, never fail a run over it
        return None, None, 0


def machine(refresh: bool = False) -> dict[str, Any]:
    """Machine-level fields (cached micro-benchmarks); per-run fields are added by `for_run`."""
    model, flags = cpu_model_and_flags()
    cores = psutil.cpu_count(logical=False)
    mem = psutil.virtual_memory().total
    mid = machine_id(model, cores, mem)
    bench = _microbench(cache_dir() / f"fingerprint-{mid}.json", refresh)
    gpu_name, gpu_mem, gpu_count = gpu_info()
    return dict(machine_id=mid, kind="cpu", cpu_model=model, cpu_flags=flags,
                cpu_cores_physical=cores, cpu_threads_logical=logical_cpus(),
                memory_total_gib=round(mem / 2**30, 2), **bench, gpu_name=gpu_name,
                gpu_memory_gib=gpu_mem, gpu_count=gpu_count,
                os=f"{platform.system()} {platform.release()}")


def _microbench(path: Path, refresh: bool) -> dict[str, Any]:
    """Cached micro-benchmark results. They measure peak capability, so contention only lowers
    them: when the machine is quieter now than when they were cached (load average lower by
    >= 0.5), measure again and keep the better figure of each."""
    cached = json.loads(path.read_text()) if path.exists() else None
    load = load_avg_1m()
    quieter = cached is not None and load is not None and \
        load <= (cached.get("microbench_load_avg_1m") or 0.0) - 0.5
    if cached is not None and not refresh and not quieter:
        return cached
    fresh = {"memory_bandwidth_gbps": measure_bandwidth_gbps(),
             "matmul_gflops": measure_matmul_gflops(), "microbench_load_avg_1m": load}
    if cached is not None and not refresh:
        for k in ("memory_bandwidth_gbps", "matmul_gflops"):
            fresh[k] = max(fresh[k], cached.get(k) or 0.0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fresh))
    return fresh


def for_run(base: dict[str, Any], threads: int, load_avg: float | None,
            other_cores: float | None, probed: dict[str, Any] | None = None) -> dict[str, Any]:
    return {**base, "threads_used": threads, "load_avg_1m": load_avg,
            "other_cpu_cores_mean": None if other_cores is None else round(other_cores, 3),
            **(probed or probe_fields(None, None))}


def git_commit() -> str | None:
    """The checkout's commit (+dirty with local changes), or None outside a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=True).stdout
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "tightfit"],
                               capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return head.strip() + ("+dirty" if dirty.strip() else "")


def software() -> dict[str, Any]:
    from tightfit import __version__

    out: dict[str, Any] = {"python": platform.python_version(), "tightfit": __version__,
                           "tightfit_commit": git_commit()}
    for field, dist in LIBRARIES.items():
        try:
            out[field] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[field] = None
    return out
