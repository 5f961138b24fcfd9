"""Runs a list of tasks for a person: a rich progress bar (on stderr), each result appended to the
store as it lands, notes for skipped backends and restarted workers. Returns the measurements.
"""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn)

from tightfit.bench.runner import Callbacks, RunContext, Task, run_tasks
from tightfit.data.schema import Measurement
from tightfit.data.store import MeasurementStore


def default_store_dir() -> Path:
    """`$TIGHTFIT_DATA_DIR`, else the repository's `data/measurements` in a source checkout, else
    `~/.local/share/tightfit/measurements`."""
    import os

    env = os.environ.get("TIGHTFIT_DATA_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2] / "data" / "measurements"
    return repo if repo.is_dir() else Path.home() / ".local" / "share" / "tightfit" / "measurements"


def execute(tasks: list[Task], store: MeasurementStore | None, title: str,
            refresh_fingerprint: bool = False, console: Console | None = None) -> list[Measurement]:
    console = console or Console(stderr=True)
    results: list[Measurement] = []
    with console.status("fingerprinting the machine (cached after the first run)"):
        ctx = RunContext.gather(refresh_fingerprint)
    with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console) as progress:
        bar = progress.add_task(title, total=len(tasks))

        def on_result(m: Measurement, task: Task) -> None:
            if store is not None:
                store.append(m)
            results.append(m)
            status = "ok" if m.status == "ok" else f"[red]failed[/]: {m.error}"
            progress.console.print(f"  {task.label}: {status}", highlight=False)
            progress.advance(bar)

        def on_skip(group: list[Task], why: str) -> None:
            progress.advance(bar, len(group))

        run_tasks(tasks, ctx, Callbacks(
            result=on_result, note=lambda s: progress.console.print(f"[yellow]{s}[/]"),
            start=lambda t: progress.update(bar, description=f"{title}: {t.label}"),
            skipped=on_skip))
        progress.update(bar, description=title)
    return results
