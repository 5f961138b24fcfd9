"""llama.cpp's own server (`llama-server`) on the GGUF's stored weights (format `native`): the
worker starts it as a child process with `--parallel` slots sharing one KV pool (continuous
batching, as llama.cpp serves concurrency) and replays the workload as streaming
`/v1/completions` requests, exactly as for tightfit's own server (`openai_client.py`).

Peak RSS is the server process's own high-water mark (VmHWM), not the Python client's.
Binaries: `make llamacpp`, or $TIGHTFIT_LLAMA_CPP_DIR (see `tightfit/bench/llama_cpp_tools.py`).
"""
from __future__ import annotations

import subprocess
import tempfile
import time
from typing import Any

import httpx

from tightfit.bench.backends.base import Backend, Timing
from tightfit.bench.backends.openai_client import CompletionsClient, free_port
from tightfit.bench.backends.tightfit_backend import model_arg
from tightfit.bench.llama_cpp_tools import require_binary
from tightfit.bench.workloads import Arrival, BenchRequest
from tightfit.errors import TightfitError

START_TIMEOUT_S = 120.0
DEFAULT_SLOTS = 16


class LlamaServerBackend(CompletionsClient, Backend):
    name = "llama-server"
    engine = "llama.cpp"

    def load(self) -> None:
        from tightfit.engine.loader.resolve import resolve_model

        o = self.options
        if o.quant != "native":
            raise TightfitError(f"the llama-server backend runs the file's own format: use quant "
                                f"'native', not {o.quant!r}")
        path = resolve_model(model_arg(o.model))
        self.file_bytes = path.stat().st_size
        self.slots = o.max_num_seqs or DEFAULT_SLOTS
        # One KV pool shared by all slots (as tightfit's paged cache), sized for two full-length
        # sequences or every slot at a quarter of the context, whichever is larger.
        self.ctx = max(2 * o.max_model_len, self.slots * o.max_model_len // 4)
        port = free_port()
        cmd = [str(require_binary("llama-server")), "-m", str(path), "--host", "127.0.0.1",
               "--port", str(port), "-t", str(o.threads), "-tb", str(o.threads),
               "-c", str(self.ctx), "-np", str(self.slots), "--kv-unified", "-b", "512",
               "--no-webui"]
        self._log = tempfile.TemporaryFile(mode="w+")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        self._wait_ready(t0)
        self.load_time_s = time.perf_counter() - t0

    def _wait_ready(self, t0: float) -> None:
        while time.perf_counter() - t0 < START_TIMEOUT_S:
            if self.proc.poll() is not None:
                raise TightfitError(f"llama-server exited with {self.proc.returncode} at "
                                    f"start: {self._log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.close()
        raise TightfitError(f"llama-server was not ready within {START_TIMEOUT_S:g} s: "
                            f"{self._log_tail()}")

    def _log_tail(self) -> str:
        self._log.seek(0)
        return self._log.read()[-600:].strip()

    def request_body(self, r: BenchRequest) -> dict[str, Any]:
        # No prompt reuse between requests (tightfit's bench prompts share no prefix either).
        return {**super().request_body(r), "cache_prompt": False}

    def run(self, requests: list[BenchRequest], arrival: Arrival) -> list[Timing]:
        if self.proc.poll() is not None:
            raise TightfitError(f"llama-server exited with {self.proc.returncode}: "
                                f"{self._log_tail()}")
        return self.drive(requests, arrival)

    def server_pid(self) -> int | None:
        return self.proc.pid

    def weight_bytes(self) -> int | None:
        return self.file_bytes

    def run_config(self) -> dict[str, Any]:
        return {**super().run_config(), "max_num_seqs": self.slots, "kv_dtype": "f16",
                "extra": {**self.options.extra, "ctx": self.ctx}}

    def close(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
