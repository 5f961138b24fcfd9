"""llama.cpp through llama-cpp-python, on the GGUF's own stored weights (weight format `native`).

Optional: skipped with a clear message when `llama_cpp` is not importable (`make llamacpp`
builds it on the same library as llama-bench and llama-server). Its Python API serves one
sequence at a time, so requests run one after another whatever the scenario's concurrency
(recorded as batch size 1); for concurrency, llama.cpp's own server is the `llama-server`
backend.
"""
from __future__ import annotations

import time
from typing import Any

try:
    import llama_cpp
except ImportError as exc:  # the registry turns this into a clear "not installed" message
    raise ImportError("llama-cpp-python is not installed (optional; `make llamacpp`, about "
                      "10-20 minutes to build on 2 cores)") from exc

from tightfit.bench.backends.base import Admission, Backend, Timing, now_since
from tightfit.bench.backends.tightfit_backend import native_file
from tightfit.bench.workloads import Arrival, BenchRequest


class LlamaCppBackend(Backend):
    name = "llamacpp"
    engine = "llama.cpp"

    def load(self) -> None:
        path = native_file(self.options, "the llamacpp backend")
        t0 = time.perf_counter()
        # swa_full=False: a sliding-window layer keeps window + n_batch cells, as llama.cpp's
        # own tools (llama-server, llama-cli, llama-bench) do; the Python binding's default
        # (llama_context_default_params) keeps the whole context for them (Gemma 3 270M at a
        # 32k context: 480 vs 15 MiB of K/V on those layers, docs/predictor.md)
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=self.options.max_model_len,
                                   n_batch=512, n_threads=self.options.threads,
                                   n_threads_batch=self.options.threads, swa_full=False,
                                   verbose=False)
        self.load_time_s = time.perf_counter() - t0
        self.file_bytes = path.stat().st_size

    def run(self, requests: list[BenchRequest], arrival: Arrival) -> list[Timing]:
        adm = Admission(requests, Arrival("closed") if arrival.kind == "closed" else arrival)
        queue: list[tuple[BenchRequest, float]] = []
        done: list[Timing] = []
        t0 = time.perf_counter()
        while not adm.done or queue:
            queue += adm.due(now_since(t0), len(queue))
            if not queue:
                time.sleep(adm.wait_s(now_since(t0)))
                continue
            queue.sort(key=lambda ra: (ra[0].priority, ra[1], ra[0].index))
            req, at = queue.pop(0)
            done.append(self._one(req, at, t0))
        return sorted(done, key=lambda t: t.index)

    def _one(self, req: BenchRequest, at: float, t0: float) -> Timing:
        t = Timing(req.index, len(req.prompt_ids), req.max_tokens, req.priority, at)
        self.llm.reset()  # no prompt reuse between requests
        for _token in self.llm.generate(list(req.prompt_ids), temp=0.0, top_k=1,
                                        repeat_penalty=1.0, reset=True):
            t.output_tokens += 1
            if t.first_token_s is None:
                t.first_token_s = now_since(t0)
            if t.output_tokens >= req.max_tokens:
                break
        t.finished_s = now_since(t0)
        return t

    def weight_bytes(self) -> int | None:
        return self.file_bytes  # mmapped file: the weights as stored

    def run_config(self) -> dict[str, Any]:
        return {**super().run_config(), "max_batch_size": 1, "kv_dtype": "f16"}
