"""Servers measured as their users run them: a separate process on a free local port, driven by
streaming `/v1/completions` requests from this worker (`openai_client.py`), so the client's
Python never shares the server's interpreter or GIL.

- `llama-server`: llama.cpp's own server on the GGUF's stored weights (format `native`), with
  `--parallel` slots sharing one KV pool (continuous batching, as llama.cpp serves concurrency).
  Binaries: `make llamacpp`, or $TIGHTFIT_LLAMA_CPP_DIR (`tightfit/bench/llama_cpp_tools.py`).
- `tightfit-serve`: `tightfit serve` itself, any weight format.
- `tightfit-lite-serve`: `tightfit serve --runtime lite` (the file's own weights, no torch).

Peak RSS and CPU time are the server process's own (VmHWM), not the Python client's.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx

from tightfit.bench.backends.base import Backend, Timing
from tightfit.bench.backends.openai_client import CompletionsClient, free_port
from tightfit.bench.backends.tightfit_backend import (DEFAULT_KV, DEFAULT_MAX_NUM_SEQS,
                                                     model_arg, native_file)
from tightfit.bench.llama_cpp_tools import require_binary
from tightfit.bench.workloads import Arrival, BenchRequest
from tightfit.errors import TightfitError

START_TIMEOUT_S = 120.0
DEFAULT_SLOTS = 16


class ServerProcessBackend(CompletionsClient, Backend):
    """Starts `command(port)` and waits for GET /health before the first run."""

    start_timeout_s = START_TIMEOUT_S

    def command(self, port: int) -> list[str]:
        raise NotImplementedError

    def load(self) -> None:
        port = free_port()
        cmd = self.command(port)
        self._log = tempfile.TemporaryFile(mode="w+")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        self._wait_ready(t0)
        self.load_time_s = time.perf_counter() - t0

    def _wait_ready(self, t0: float) -> None:
        while time.perf_counter() - t0 < self.start_timeout_s:
            if self.proc.poll() is not None:
                raise TightfitError(f"{self.name} exited with {self.proc.returncode} at "
                                    f"start: {self._log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.close()
        raise TightfitError(f"{self.name} was not ready within {self.start_timeout_s:g} s: "
                            f"{self._log_tail()}")

    def _log_tail(self) -> str:
        self._log.seek(0)
        return self._log.read()[-600:].strip()

    def run(self, requests: list[BenchRequest], arrival: Arrival) -> list[Timing]:
        if self.proc.poll() is not None:
            raise TightfitError(f"{self.name} exited with {self.proc.returncode}: "
                                f"{self._log_tail()}")
        try:
            return self.drive(requests, arrival)
        except httpx.HTTPError as e:
            # a server that died mid-run says why in its own log, not in the client's error
            try:
                self.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                raise e from None
            raise TightfitError(f"{self.name} exited with {self.proc.returncode} during the "
                                f"run ({type(e).__name__}): {self._log_tail()}") from e

    def server_pid(self) -> int | None:
        return self.proc.pid

    def close(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


class LlamaServerBackend(ServerProcessBackend):
    name = "llama-server"
    engine = "llama.cpp"

    def command(self, port: int) -> list[str]:
        o = self.options
        path = native_file(o, "the llama-server backend")
        self.file_bytes = path.stat().st_size
        self.slots = o.max_num_seqs or DEFAULT_SLOTS
        # One KV pool shared by all slots (as tightfit's paged cache), sized for two full-length
        # sequences or every slot at a quarter of the context, whichever is larger.
        self.ctx = max(2 * o.max_model_len, self.slots * o.max_model_len // 4)
        return [str(require_binary("llama-server")), "-m", str(path), "--host", "127.0.0.1",
                "--port", str(port), "-t", str(o.threads), "-tb", str(o.threads),
                "-c", str(self.ctx), "-np", str(self.slots), "--kv-unified", "-b", "512",
                "--no-webui"]

    def request_body(self, r: BenchRequest) -> dict[str, Any]:
        # No prompt reuse between requests (tightfit's bench prompts share no prefix either).
        return {**super().request_body(r), "cache_prompt": False}

    def weight_bytes(self) -> int | None:
        return self.file_bytes

    def run_config(self) -> dict[str, Any]:
        return {**super().run_config(), "max_num_seqs": self.slots, "max_batch_size": self.slots,
                "kv_dtype": "f16", "extra": {**self.options.extra, "ctx": self.ctx}}


class TightfitServeBackend(ServerProcessBackend):
    """`tightfit serve` in its own process, as deployed (the `tightfit-http` backend instead
    serves from a thread of the worker, sharing its interpreter with the client)."""

    name = "tightfit-serve"
    engine = "tightfit"
    start_timeout_s = 900.0  # --compile compiles for minutes on a cold cache

    def command(self, port: int) -> list[str]:
        from tightfit.engine.loader.resolve import resolve_model

        o = self.options
        self.slots = o.max_num_seqs or DEFAULT_MAX_NUM_SEQS
        path = resolve_model(model_arg(o.model))
        # What the server holds is not visible from here; for `native` it is the file's blocks.
        self.file_bytes = path.stat().st_size if o.quant == "native" else None
        cmd = [sys.executable, "-m", "tightfit.cli.main", "serve", "--host", "127.0.0.1",
               "--port", str(port), "--quant", o.quant, "--threads", str(o.threads),
               "--max-model-len", str(o.max_model_len), "--max-num-seqs", str(self.slots),
               "--max-queue", "4096"]
        if o.model:
            cmd += ["--model", o.model]
        if o.memory_budget:
            cmd += ["--memory-budget", o.memory_budget]
        else:
            cmd += ["--kv-cache-memory", o.kv_cache_memory or DEFAULT_KV]
        if o.kv_dtype:
            cmd += ["--kv-dtype", o.kv_dtype]
        if o.extra.get("compile_decode"):
            cmd += ["--compile"]
        if not o.extra.get("scripted_decode", True):
            cmd += ["--no-script"]
        if not o.extra.get("fused_kernels", True):
            cmd += ["--no-fused"]
        return cmd

    def request_body(self, r: BenchRequest) -> dict[str, Any]:
        return {**super().request_body(r), "priority": r.priority}

    def weight_bytes(self) -> int | None:
        return self.file_bytes

    def run_config(self) -> dict[str, Any]:
        return {**super().run_config(), "max_num_seqs": self.slots, "max_batch_size": self.slots,
                "kv_dtype": self.options.kv_dtype or "fp32"}


class LiteServeBackend(TightfitServeBackend):
    """`tightfit serve --runtime lite` in its own process: the OpenAI server over the lite
    runtime (no torch in the server process)."""

    name = "tightfit-lite-serve"
    engine = "tightfit-lite"

    def command(self, port: int) -> list[str]:
        o = self.options
        self.file_bytes = native_file(o, "the lite runtime").stat().st_size
        self.slots = o.max_num_seqs or DEFAULT_MAX_NUM_SEQS
        cmd = [sys.executable, "-m", "tightfit.cli.main", "serve", "--runtime", "lite",
               "--host", "127.0.0.1", "--port", str(port), "--threads", str(o.threads),
               "--max-model-len", str(o.max_model_len), "--max-num-seqs", str(self.slots),
               "--max-queue", "4096"]
        return cmd + (["--model", o.model] if o.model else [])

    def run_config(self) -> dict[str, Any]:
        return {**super().run_config(), "kv_dtype": "f16"}
