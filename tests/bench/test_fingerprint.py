"""Hardware fingerprint: fields present, micro-benchmarks cached per machine and re-measured only
when the machine is quieter than when they were cached (keeping the better figure)."""
from __future__ import annotations

from tightfit.bench import fingerprint as fp
from tightfit.lite.runtime import SIMD, library


def test_machine_fields(monkeypatch, tmp_path):
    monkeypatch.setenv("TIGHTFIT_CACHE", str(tmp_path))
    m = fp.machine()
    assert m["cpu_threads_logical"] >= 1 and m["memory_total_gib"] > 0
    assert m["memory_bandwidth_gbps"] > 0 and m["matmul_gflops"] > 0
    assert m["kind"] == "cpu" and isinstance(m["cpu_flags"], list)
    assert list(tmp_path.glob("fingerprint-*.json"))
    sw = fp.software()
    assert sw["numpy"] and sw["tightfit"] and "llama_cpp_python" in sw


def test_microbench_cache_policy(monkeypatch, tmp_path):
    path = tmp_path / "fp.json"
    figures = iter([(10.0, 100.0), (20.0, 50.0), (99.0, 99.0)])
    calls = []

    def bw():
        calls.append("bw")
        return current[0]

    monkeypatch.setattr(fp, "measure_bandwidth_gbps", bw)
    monkeypatch.setattr(fp, "measure_matmul_gflops", lambda: current[1])
    loads = iter([5.0, 4.8, 3.0])
    monkeypatch.setattr(fp, "load_avg_1m", lambda: next(loads))

    current = next(figures)
    first = fp._microbench(path, refresh=False)  # measured at load 5.0
    assert (first["memory_bandwidth_gbps"], first["matmul_gflops"]) == (10.0, 100.0)
    current = next(figures)
    again = fp._microbench(path, refresh=False)  # load 4.8: not quieter by 0.5, cached
    assert again == first and len(calls) == 1
    quiet = fp._microbench(path, refresh=False)  # load 3.0: quieter, re-measured, best kept
    assert (quiet["memory_bandwidth_gbps"], quiet["matmul_gflops"]) == (20.0, 100.0)
    assert quiet["microbench_load_avg_1m"] == 3.0 and len(calls) == 2


def test_the_run_probe_measures_and_averages_before_and_after():
    one = fp.probe_in_child(1)  # a child process: the caller's peak RSS never sees its arrays
    assert one["matmul_gflops"] > 0 and one["bandwidth_gbps"] > 0
    if SIMD[library().tf_simd()] == "avx512-vnni":  # the lite runtime's SIMD block kernels
        assert one["kernel_gflops"] > 0 and one["kernel_stream_gbps"] > 0
    else:
        assert one["kernel_gflops"] is None and one["kernel_stream_gbps"] is None
    assert one["bandwidth_threads_gbps"] == one["bandwidth_gbps"]  # one thread: the same copy
    assert fp.probe_in_child(2)["bandwidth_threads_gbps"] > 0  # the copy split over 2 threads
    before = {"matmul_gflops": 100.0, "bandwidth_gbps": 10.0, "kernel_gflops": None,
              "bandwidth_threads_gbps": 18.0, "kernel_stream_gbps": 6.0}
    after = {"matmul_gflops": 200.0, "bandwidth_gbps": 20.0, "kernel_gflops": 40.0,
             "bandwidth_threads_gbps": 38.0, "kernel_stream_gbps": 8.0}
    assert fp.probe_fields(before, after) == {"probe_matmul_gflops": 150.0,
                                              "probe_bandwidth_gbps": 15.0,
                                              "probe_kernel_gflops": 40.0,
                                              "probe_bandwidth_threads_gbps": 28.0,
                                              "probe_kernel_stream_gbps": 7.0}
    assert fp.probe_fields(None, after)["probe_matmul_gflops"] == 200.0  # one probe failed
    assert set(fp.probe_fields(None, None).values()) == {None}


def test_a_copy_split_over_threads_covers_the_array_once():
    """The copy on the run's threads: slices that cover the array once whatever the thread
    count, and a rate for every split (plausible against one thread's)."""
    for n, parts in ((10, 3), (2**20, 2), (7, 7), (5, 8)):
        covered = [i for part in fp.split(n, parts) for i in range(n)[part]]
        assert covered == list(range(n))
    one = fp.measure_bandwidth_gbps(mib=16, repeats=2)
    for threads in (2, 3):
        assert fp.measure_bandwidth_gbps(mib=16, repeats=2, threads=threads) > 0.2 * one


def test_copies_at_several_thread_counts_share_one_pair_of_arrays(monkeypatch):
    """The run probe's two copies (one thread, the run's threads) come from one allocation, in
    the order asked, and each is the single-count measurement's figure."""
    import numpy as np

    made = []
    real_ones = np.ones
    monkeypatch.setattr(np, "ones", lambda *a, **k: made.append(a) or real_ones(*a, **k))
    one, two = fp.measure_bandwidths_gbps((1, 2), mib=16, repeats=2)
    assert len(made) == 1 and one > 0 and two > 0.2 * one
    monkeypatch.setattr(fp, "measure_bandwidths_gbps", lambda counts, mib, repeats: (7.5,))
    assert fp.measure_bandwidth_gbps(mib=16, repeats=2, threads=3) == 7.5
