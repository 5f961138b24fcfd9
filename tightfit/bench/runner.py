"""Runs bench tasks: groups them by model load, drives one worker process per group, and turns
each worker event into a dataset `Measurement` (ok or failed), handed to a callback as it lands.

A worker that dies or overruns `timeout_s` fails only the task it was on; the group restarts on
a fresh worker for the remaining tasks (at most `MAX_RESTARTS` times). Backends that cannot run
here are skipped with a message, not recorded. No torch in this process.
"""
from __future__ import annotations

import hashlib
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator

from tightfit.bench import fingerprint, metrics, model_info
from tightfit.bench.backends import canonical, unavailable_reason
from tightfit.bench.backends.base import BackendOptions, Timing
from tightfit.bench.workloads import Overrides, Workload, build_workload, get_scenario
from tightfit.data.schema import Measurement, utc_now

MAX_RESTARTS = 2
CONTENDED_CORES = 0.25
# the rest: tightfit
ENGINE_FAMILY = {"hf": "hf-transformers", "llamacpp": "llama.cpp", "llama-server": "llama.cpp"}


@dataclass(frozen=True)
class Task:
    backend: str
    options: BackendOptions
    scenario: str
    overrides: Overrides = Overrides()
    seed: int = 0
    repeat: int = 0
    sweep: str | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend", canonical(self.backend))
        get_scenario(self.scenario)

    @property
    def run_key(self) -> str:
        ident = dict(backend=self.backend, options=asdict(self.options), scenario=self.scenario,
                     overrides=asdict(self.overrides), seed=self.seed, repeat=self.repeat)
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def label(self) -> str:
        o = self.options
        return (f"{self.backend} {o.model or 'default'} {o.quant} t{o.threads} {self.scenario}"
                + "".join(f" {k}={v}" for k, v in asdict(self.overrides).items() if v is not None))


@dataclass
class RunContext:
    """Machine facts gathered once per invocation."""

    machine: dict[str, Any] = field(default_factory=dict)
    software: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def gather(cls, refresh_fingerprint: bool = False) -> RunContext:
        return cls(fingerprint.machine(refresh_fingerprint), fingerprint.software())


OnResult = Callable[[Measurement, Task], None]
OnNote = Callable[[str], None]
OnStart = Callable[[Task], None]


@dataclass(frozen=True)
class Callbacks:
    result: OnResult
    note: OnNote = lambda s: None
    start: OnStart = lambda t: None
    skipped: Callable[[list[Task], str], None] = lambda ts, why: None


def run_tasks(tasks: list[Task], ctx: RunContext, cb: Callbacks) -> None:
    """Runs every task; each outcome reaches `cb.result` as soon as it is known."""
    for group in group_tasks(tasks):
        reason = unavailable_reason(group[0].backend)
        if reason:
            cb.note(f"{reason}; {len(group)} run(s) not taken")
            cb.skipped(group, reason)
            continue
        _run_group(group, ctx, cb)


def group_tasks(tasks: list[Task]) -> list[list[Task]]:
    groups: dict[tuple[Any, ...], list[Task]] = {}
    for t in tasks:
        groups.setdefault((t.backend, t.options.load_key()), []).append(t)
    return list(groups.values())


def _run_group(group: list[Task], ctx: RunContext, cb: Callbacks) -> None:
    workloads = {}
    for t in group:
        try:
            workloads[t.run_key] = build_workload(t.scenario, model_info.tokenizer(t.options.model),
                                                  t.seed, t.overrides)
        except Exception as exc:  # noqa: BLE001 - e.g. a missing model file: record and go on
            cb.result(build_failed(t, ctx, None, f"{type(exc).__name__}: {exc}", {}), t)
    remaining = [t for t in group if t.run_key in workloads]
    for _attempt in range(MAX_RESTARTS + 1):
        if not remaining:
            return
        remaining = _one_worker(remaining, workloads, ctx, cb)
    for t in remaining:
        cb.result(build_failed(t, ctx, workloads[t.run_key], "worker kept dying; gave up", {}), t)


def _one_worker(tasks: list[Task], workloads: dict[str, Workload], ctx: RunContext,
                cb: Callbacks) -> list[Task]:
    """Runs tasks on one worker; returns those it did not reach (to retry on a fresh worker)."""
    by_key = {t.run_key: t for t in tasks}
    pending = list(by_key)
    current: str | None = None
    loaded = False
    with WorkerProcess(tasks[0], [_task_json(t, workloads[t.run_key]) for t in tasks]) as proc:
        def timeout() -> float | None:  # a run's limit; while loading, the first run's
            if current is not None:
                return by_key[current].timeout_s
            return None if loaded else tasks[0].timeout_s

        for event in proc.events(timeout):
            kind = event["event"]
            loaded = loaded or kind == "loaded"
            if kind == "load_failed":
                for key in pending:
                    cb.result(build_failed(by_key[key], ctx, workloads[key],
                                           f"load failed: {event['error']}", event), by_key[key])
                return []
            if kind == "task_start":
                current = event["key"]
                cb.start(by_key[current])
            elif kind == "task_done":
                task = by_key[event["key"]]
                cb.result(build_from_event(task, ctx, workloads[task.run_key], event), task)
                pending.remove(event["key"])
                current = None
        if not loaded and pending:  # died while loading: deterministic, do not retry
            for key in pending:
                cb.result(build_failed(by_key[key], ctx, workloads[key],
                                       f"load failed: {proc.failure()}", {}), by_key[key])
            return []
        if current is not None:  # died or timed out mid-task
            task = by_key[current]
            cb.result(build_failed(task, ctx, workloads[current], proc.failure(), {}), task)
            pending.remove(current)
            if pending:
                cb.note(f"worker for {task.backend} stopped ({proc.failure()}); restarting for "
                        f"{len(pending)} remaining run(s)")
    return [by_key[k] for k in pending]


def _task_json(task: Task, workload: Workload) -> dict[str, Any]:
    s = workload.scenario
    return {"key": task.run_key, "options": asdict(task.options),
            "requests": workload.to_json()["requests"],
            "arrival": asdict(s.arrival)}


class WorkerProcess:
    """One `python -m tightfit.bench.worker` child; events are read on a thread so that the
    parent can time out a stuck task and kill the child."""

    def __init__(self, first: Task, tasks: list[dict[str, Any]]) -> None:
        self.job = {"backend": first.backend, "options": asdict(first.options), "tasks": tasks}
        self.threads = first.options.threads
        self.timed_out: float | None = None

    def __enter__(self) -> WorkerProcess:
        env = {**os.environ, **{k: str(self.threads) for k in
                                ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}}
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "tightfit.bench.worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True, env=env)
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(self.job))
        self.proc.stdin.close()
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        return self

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def events(self, timeout: Callable[[], float | None]) -> Iterator[dict[str, Any]]:
        while True:
            limit = timeout()
            try:
                line = self.lines.get(timeout=limit)
            except queue.Empty:
                self.timed_out = limit
                self.proc.kill()
                return
            if line is None:
                return
            if line.strip():
                yield json.loads(line)

    def failure(self) -> str:
        if self.timed_out is not None:
            return f"timed out after {self.timed_out:g} s (worker killed)"
        code = self.proc.wait()
        self.stderr.seek(0)
        tail = " | ".join(self.stderr.read().strip().splitlines()[-3:])
        return f"worker process exited with code {code}" + (f": {tail}" if tail else "")

    def __exit__(self, *exc: Any) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.stderr.close()


def build_from_event(task: Task, ctx: RunContext, workload: Workload,
                     event: dict[str, Any]) -> Measurement:
    if event["status"] != "ok":
        return build_failed(task, ctx, workload, event["error"], event)
    timings = [Timing(**t) for t in event["timings"]]
    try:
        results = metrics.summarize(timings, workload.scenario.slo_ttft_ms,
                                    event.get("peak_rss_mib"), event.get("load_time_s"),
                                    event.get("load_peak_rss_mib"))
    except RuntimeError as exc:
        return build_failed(task, ctx, workload, str(exc), event)
    return _measurement(task, ctx, workload, event, "ok", None, results, event["run_config"])


def build_failed(task: Task, ctx: RunContext, workload: Workload | None, error: str,
                 event: dict[str, Any]) -> Measurement:
    return _measurement(task, ctx, workload, event, "failed", error, None, _bare_config(task))


def _bare_config(task: Task) -> dict[str, Any]:
    """RunConfig of a run whose worker never reported one (the options as asked)."""
    o = task.options
    return dict(backend=task.backend, engine=ENGINE_FAMILY.get(task.backend, "tightfit"),
                threads=o.threads,
                max_num_seqs=o.max_num_seqs, max_batch_size=None, block_size=o.block_size,
                kv_cache_bytes=None, kv_dtype=None, kv_retention=None, memory_budget_bytes=None,
                prefix_caching=o.prefix_caching, extra=dict(o.extra))


def _measurement(task: Task, ctx: RunContext, workload: Workload | None, event: dict[str, Any],
                 status: str, error: str | None, results: dict[str, Any] | None,
                 config: dict[str, Any]) -> Measurement:
    others = event.get("other_cpu_cores")
    load = event.get("load_avg_1m", fingerprint.load_avg_1m())
    contended = others >= CONTENDED_CORES if others is not None else (
        load > ctx.machine.get("cpu_threads_logical", 1) if load is not None else None)
    try:
        model = model_info.descriptor(task.options.model, task.options.quant,
                                      event.get("weight_bytes"))
    except Exception:  # noqa: BLE001 - the model file itself is the failure being recorded
        model = _unknown_model(task)
    return Measurement.model_validate(dict(
        id=uuid.uuid4().hex, run_key=task.run_key, sweep=task.sweep, created_at=utc_now(),
        status=status, error=error, contended=contended,
        hardware=fingerprint.for_run(ctx.machine, task.options.threads, load, others,
                                     event.get("probe")),
        software=ctx.software, model=model, config=config,
        workload=workload.describe() if workload else None, results=results))


def _unknown_model(task: Task) -> dict[str, Any]:
    return dict(name=task.options.model or "default", file_name=None, file_bytes=None,
                file_format=None, architecture=None, params_b=None, n_layers=None,
                hidden_size=None, intermediate_size=None, n_heads=None, n_kv_heads=None,
                head_dim=None, vocab_size=None, weight_format=task.options.quant,
                weight_bytes=None)
