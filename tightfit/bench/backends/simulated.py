"""A model-free backend on a virtual clock: requests take `prompt / prefill_tok_s` to their first
token and `1 / decode_tok_s` per token after it, `slots` at a time. It exists to test the harness
(runner, store, resume, reports) in milliseconds, and to inject failures on purpose:

extra.fail_load: message -> `load` raises; extra.fail_prompt_tokens: n -> a run containing an
n-token prompt raises; extra.crash_prompt_tokens: n -> the worker process dies (exit 3), as a
segfaulting native backend would; extra.hang_prompt_tokens: n -> such a run hangs (for timeouts).
Its rows carry `config.backend = "simulated"`: never measurements; reports and fits drop them.
"""
from __future__ import annotations

import heapq
import os
import time
from typing import Any

from tightfit.bench.backends.base import Backend, Timing
from tightfit.bench.workloads import Arrival, BenchRequest


class SimulatedBackend(Backend):
    name = "simulated"
    engine = "tightfit"

    def load(self) -> None:
        if "fail_load" in self.options.extra:
            raise RuntimeError(str(self.options.extra["fail_load"]))
        self.load_time_s = 0.0

    def warmup(self) -> None:
        """Nothing to warm."""

    def run(self, requests: list[BenchRequest], arrival: Arrival) -> list[Timing]:
        x = self.options.extra
        lengths = {len(r.prompt_ids) for r in requests}
        if x.get("hang_prompt_tokens") in lengths:
            time.sleep(3600)
        if x.get("crash_prompt_tokens") in lengths:
            os._exit(3)
        if x.get("fail_prompt_tokens") in lengths:
            raise RuntimeError(f"injected failure on a {x['fail_prompt_tokens']}-token prompt")
        return self._schedule(requests, arrival, float(x.get("prefill_tok_s", 500.0)),
                              float(x.get("decode_tok_s", 50.0)))

    def _schedule(self, requests: list[BenchRequest], arrival: Arrival, prefill: float,
                  decode: float) -> list[Timing]:
        open_slots = self.options.max_num_seqs or 8
        slots = arrival.concurrency if arrival.kind == "closed" else open_slots
        free = [0.0] * slots
        out = []
        for r in sorted(requests, key=lambda r: (r.arrival_s or 0.0, r.index)):
            start = heapq.heappop(free)
            at = start if r.arrival_s is None else r.arrival_s
            begin = max(start, at)
            first = begin + len(r.prompt_ids) / prefill
            end = first + (r.max_tokens - 1) / decode
            heapq.heappush(free, end)
            out.append(Timing(r.index, len(r.prompt_ids), r.max_tokens, r.priority, at,
                              r.max_tokens, first, end))
        return sorted(out, key=lambda t: t.index)

    def weight_bytes(self) -> int | None:
        return 0

    def run_config(self) -> dict[str, Any]:
        return {**super().run_config(), "max_batch_size": self.options.max_num_seqs or 8}
