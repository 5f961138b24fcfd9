"""The lite runtime (tightfit.lite) in process: the GGUF's own weights, no torch in the worker.
Same request loop as the torch engine's backend (the lite engine has its interface): requests
join the continuous batch at their arrival times, each run on a fresh engine over the loaded
weights and K/V slots, warmed by one untimed request."""
from __future__ import annotations

import time
from typing import Any

from tightfit.bench.backends.tightfit_backend import (DEFAULT_MAX_NUM_SEQS, TightfitBackend,
                                                      native_file)


class LiteBackend(TightfitBackend):
    name = "tightfit-lite"
    engine = "tightfit-lite"

    def load(self) -> None:
        from tightfit.lite import LiteLLM

        o = self.options
        path = native_file(o, "the lite runtime")
        t0 = time.perf_counter()
        if self.llm is None:
            self.llm = LiteLLM(path, num_threads=o.threads,
                               max_model_len=o.max_model_len,
                               max_num_seqs=o.max_num_seqs or DEFAULT_MAX_NUM_SEQS)
        if self.load_time_s is None:
            self.load_time_s = time.perf_counter() - t0

    def _engine_llm(self) -> Any:
        return self.llm.derive()

    def weight_bytes(self) -> int | None:
        return sum(t.data.nbytes for t in self.llm.model.gguf.tensors())  # read in place

    def run_config(self) -> dict[str, Any]:
        o = self.options
        seqs = o.max_num_seqs or DEFAULT_MAX_NUM_SEQS
        return {**super(TightfitBackend, self).run_config(), "max_num_seqs": seqs,
                "max_batch_size": seqs, "block_size": None,
                "kv_cache_bytes": seqs * o.max_model_len * self.llm.model.kv_bytes_per_token(),
                "kv_dtype": "f16", "prefix_caching": False}
