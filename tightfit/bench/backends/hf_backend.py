"""HF Transformers, fp32, loaded from the same GGUF file (dequantised by transformers): the
reference most users would reach for. No continuous batching exists there, so requests are served
the way a plain `generate` user would: static batches (left-padded) of whatever has arrived, up to
`max_num_seqs`, each batch run to completion before the next starts.

Per-token times come from a stopping criterion that HF calls after every generated token; it also
ends each row at its own length. Needs `transformers`, `gguf` and `accelerate`.
"""
from __future__ import annotations

import time
from typing import Any

try:
    import torch
    from transformers import StoppingCriteria
except ImportError as exc:  # the registry turns this into a clear "not installed" message
    raise ImportError("the hf backend needs torch and transformers: "
                      "pip install -e '.[reference]'") from exc

from tightfit.bench.backends.base import Admission, Backend, BackendOptions, Timing, now_since
from tightfit.bench.backends.tightfit_backend import model_arg
from tightfit.bench.workloads import Arrival, BenchRequest
from tightfit.errors import TightfitError

DEFAULT_BATCH = 16


class _StepClock(StoppingCriteria):
    """A StoppingCriteria: records when each row got its first and last token; stops each row
    once it has its `max_tokens` (HF keeps padding finished rows until the batch ends)."""

    def __init__(self, timings: list[Timing], t0: float) -> None:
        self.timings, self.t0, self.steps = timings, t0, 0

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        self.steps += 1
        now = now_since(self.t0)
        done = []
        for t in self.timings:
            if t.first_token_s is None:
                t.first_token_s = now
            if t.finished_s is None and self.steps >= t.max_tokens:
                t.finished_s, t.output_tokens = now, t.max_tokens
            done.append(t.finished_s is not None)
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class HFBackend(Backend):
    name = "hf"
    engine = "hf-transformers"

    def __init__(self, options: BackendOptions, model: Any = None) -> None:
        super().__init__(options)
        self.model = model  # an already-loaded model (tests share one); else `load` builds it

    def load(self) -> None:
        if self.options.quant != "fp32":
            raise TightfitError(f"the hf backend runs fp32 only (dequantised GGUF), not "
                                f"{self.options.quant!r}")
        import transformers

        from tightfit.engine.loader.resolve import resolve_model

        torch.set_num_threads(self.options.threads)
        path = resolve_model(model_arg(self.options.model))
        t0 = time.perf_counter()
        if self.model is None:
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=torch.float32)
        self.model.eval()
        self.load_time_s = time.perf_counter() - t0
        cfg = self.model.generation_config
        self.pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else 0

    @property
    def batch_cap(self) -> int:
        return self.options.max_num_seqs or DEFAULT_BATCH

    def run(self, requests: list[BenchRequest], arrival: Arrival) -> list[Timing]:
        adm = Admission(requests, arrival)
        queue: list[tuple[BenchRequest, float]] = []
        done: list[Timing] = []
        t0 = time.perf_counter()
        while not adm.done or queue:
            queue += adm.due(now_since(t0), len(queue))
            if not queue:
                time.sleep(adm.wait_s(now_since(t0)))
                continue
            queue.sort(key=lambda ra: (ra[0].priority, ra[1], ra[0].index))
            batch, queue = queue[:self.batch_cap], queue[self.batch_cap:]
            done += self._run_batch(batch, t0)
        return sorted(done, key=lambda t: t.index)

    def _run_batch(self, batch: list[tuple[BenchRequest, float]], t0: float) -> list[Timing]:
        timings = [Timing(r.index, len(r.prompt_ids), r.max_tokens, r.priority, at)
                   for r, at in batch]
        width = max(len(r.prompt_ids) for r, _ in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (r, _) in enumerate(batch):  # left padding: prompts end at the same column
            ids[row, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            mask[row, width - len(r.prompt_ids):] = 1
        longest = max(r.max_tokens for r, _ in batch)
        with torch.inference_mode():
            self.model.generate(
                input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=longest,
                min_new_tokens=longest, pad_token_id=self.pad_id,
                stopping_criteria=[_StepClock(timings, t0)])
        return timings

    def weight_bytes(self) -> int | None:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def run_config(self) -> dict[str, Any]:
        return {**super().run_config(), "max_batch_size": self.batch_cap, "kv_dtype": "fp32"}
