"""The child process that holds one backend: `python -m tightfit.bench.worker` reads one job (JSON
on stdin: backend, options, tasks), loads the model once, warms up, runs each task and writes one
JSON event a line to its protocol stream. Running each backend in its own process keeps peak RSS
honest and lets a crashing native backend take down only itself.

Library chatter on stdout is moved to stderr so that the protocol stream stays clean.
Events: loaded | load_failed | task_start | task_done (status ok with timings, or failed + error).
"""
from __future__ import annotations

import dataclasses
import json
import os
import resource
import sys
import time
import traceback
from typing import IO, Any

import psutil

from tightfit import sysmem
from tightfit.bench import fingerprint
from tightfit.bench.backends import backend_class
from tightfit.bench.backends.base import Backend, BackendOptions
from tightfit.bench.workloads import Arrival, BenchRequest


def peak_rss_mib(backend: Backend | None = None) -> float:
    """The serving process's peak: a server child's (llama-server) when there is one, else this
    worker's."""
    pid = backend.server_pid() if backend is not None else None
    theirs = sysmem.peak_rss_mib(pid) if pid is not None else 0.0
    return round(theirs or sysmem.peak_rss_mib(), 1)


def _busy_s() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _own_cpu_s(backend: Backend | None = None) -> float:
    """CPU seconds of this worker and of its serving child, if any (not "other" load)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    own = r.ru_utime + r.ru_stime
    pid = backend.server_pid() if backend is not None else None
    if pid is not None:
        try:
            t = psutil.Process(pid).cpu_times()
            own += t.user + t.system
        except psutil.Error:
            pass
    return own


class Worker:
    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.load_peak: float | None = None

    def emit(self, **event: Any) -> None:
        self.out.write(json.dumps(event) + "\n")
        self.out.flush()

    def serve(self, job: dict[str, Any]) -> int:
        options = BackendOptions(**job["options"])
        try:
            backend = backend_class(job["backend"])(options)
            backend.load()
            if job.get("warmup", True):
                backend.warmup()
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which records it
            self.emit(event="load_failed", error=_describe(exc))
            return 1
        self.load_peak = peak_rss_mib(backend)
        self.emit(event="loaded", load_time_s=backend.load_time_s,
                  weight_bytes=backend.weight_bytes(), peak_rss_mib=self.load_peak)
        for task in job["tasks"]:
            self.run_task(backend, task)
        backend.close()
        return 0

    def run_task(self, backend: Backend, task: dict[str, Any]) -> None:
        self.emit(event="task_start", key=task["key"])
        backend.options = BackendOptions(**task["options"])
        requests = [BenchRequest(**{**r, "prompt_ids": tuple(r["prompt_ids"])})
                    for r in task["requests"]]
        load = round(os.getloadavg()[0], 2)
        # the machine's state around the run, in a child process (out of this worker's peak RSS)
        before = fingerprint.probe_in_child(backend.options.threads)
        busy0, own0, t0 = _busy_s(), _own_cpu_s(backend), time.perf_counter()
        try:
            timings = backend.run(requests, Arrival(**task["arrival"]))
        except Exception as exc:  # noqa: BLE001 - one failed task must not end the sweep
            self.emit(event="task_done", key=task["key"], status="failed", error=_describe(exc),
                      load_avg_1m=load, peak_rss_mib=peak_rss_mib(backend))
            return
        wall = time.perf_counter() - t0
        others = (max(0.0, (_busy_s() - busy0) - (_own_cpu_s(backend) - own0)) / wall
                  if wall > 0 else None)
        probed = fingerprint.probe_fields(before,
                                          fingerprint.probe_in_child(backend.options.threads))
        self.emit(event="task_done", key=task["key"], status="ok", probe=probed,
                  timings=[dataclasses.asdict(t) for t in timings], run_config=backend.run_config(),
                  load_avg_1m=load, other_cpu_cores=others, peak_rss_mib=peak_rss_mib(backend),
                  load_time_s=backend.load_time_s, weight_bytes=backend.weight_bytes(),
                  load_peak_rss_mib=self.load_peak)


def _describe(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def main() -> int:
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything a library prints goes to stderr, not into the protocol
    sys.stdout = sys.stderr
    return Worker(protocol).serve(json.loads(sys.stdin.read()))


if __name__ == "__main__":
    sys.exit(main())
