"""Serving benchmark: N streaming /v1/completions requests at concurrency C against an
OpenAI-compatible server; prints throughput and p50/p99 time to first token and inter-token
latency per concurrency level, and llama.cpp's llama-server side by side when one is found
(on PATH or $LLAMA_SERVER). Without --url it starts `tightfit serve` itself.

    python -m tightfit.server.loadtest --concurrency 1 8 32 --requests 200
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import httpx

PROMPT = "Write a short poem about the sea."


@dataclass
class RequestResult:
    ok: bool
    latency_s: float
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None


@dataclass(frozen=True)
class LoadSummary:
    backend: str
    concurrency: int
    requests: int
    failures: int
    wall_s: float
    req_per_s: float
    output_tok_per_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    server_rss_mb: float | None = None
    errors: tuple[str, ...] = ()


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def request_body(max_tokens: int, prompt: str = PROMPT, model: str | None = None) -> dict:
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                            "stream": True, "ignore_eos": True,
                            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    return body


async def one_request(client: httpx.AsyncClient, body: dict) -> RequestResult:
    t0 = time.perf_counter()
    res = RequestResult(ok=False, latency_s=0.0)
    last, chunks, done = None, 0, False
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                obj = json.loads(line[6:])
                if "error" in obj:
                    res.error = str(obj["error"])[:200]
                    return res
                if obj.get("usage"):
                    res.tokens = obj["usage"].get("completion_tokens", 0)
                if any(c.get("text") for c in obj.get("choices") or ()):
                    now = time.perf_counter()
                    if last is None:
                        res.ttft_s = now - t0
                    else:
                        res.itl_s.append(now - last)
                    last, chunks = now, chunks + 1
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"[:200]
        return res
    finally:
        res.latency_s = time.perf_counter() - t0
    res.tokens = res.tokens or chunks
    res.ok = done
    res.error = None if done else (res.error or "stream ended without [DONE]")
    return res


async def run_load(url: str, concurrency: int, requests: int, body: dict,
                   api_key: str | None = None, timeout_s: float = 600) -> list[RequestResult]:
    """`requests` streaming requests, `concurrency` at a time; one result per request."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    results: list[RequestResult] = []
    todo = iter(range(requests))
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits,
                                 timeout=timeout_s) as client:
        async def worker() -> None:
            for _ in todo:
                results.append(await one_request(client, body))
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


def summarize(backend: str, concurrency: int, results: list[RequestResult], wall_s: float,
              rss_mb: float | None = None) -> LoadSummary:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [x for r in ok for x in r.itl_s]
    return LoadSummary(
        backend=backend, concurrency=concurrency, requests=len(results),
        failures=len(results) - len(ok), wall_s=wall_s, req_per_s=len(ok) / wall_s,
        output_tok_per_s=sum(r.tokens for r in ok) / wall_s,
        ttft_p50_s=percentile(ttft, 50), ttft_p99_s=percentile(ttft, 99),
        itl_p50_s=percentile(itl, 50), itl_p99_s=percentile(itl, 99), server_rss_mb=rss_mb,
        errors=tuple(sorted({r.error for r in results if r.error}))[:5])


def server_rss_mb(url: str, api_key: str | None = None) -> float | None:
    """The tightfit server's RSS from its monitor endpoint (None for other servers)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(url + "/v1/monitor", headers=headers, timeout=10)
        return r.json()["rss_bytes"] / 2**20 if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def measure(backend: str, url: str, concurrency: int, requests: int, body: dict,
            api_key: str | None = None, warmup: int | None = None) -> LoadSummary:
    """Warm up with `warmup` requests (default: one wave), then time `requests`."""
    asyncio.run(run_load(url, concurrency, warmup if warmup is not None else concurrency,
                         body, api_key))
    t0 = time.perf_counter()
    results = asyncio.run(run_load(url, concurrency, requests, body, api_key))
    wall = time.perf_counter() - t0
    return summarize(backend, concurrency, results, wall, server_rss_mb(url, api_key))


# -- servers to measure -----------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with status {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server at {url} not healthy after {timeout_s:.0f} s")


def start_tightfit(extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "tightfit", "serve", "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc)
    return proc, url


def llama_server_binary() -> str | None:
    found = os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    return found if found and os.path.exists(found) else None


def start_llama_server(binary: str, model: str | None, parallel: int,
                       ctx_per_slot: int = 512) -> tuple[subprocess.Popen, str]:
    from tightfit.engine.loader.resolve import resolve_model  # no torch import

    port = free_port()
    cmd = [binary, "-m", str(resolve_model(model)), "--host", "127.0.0.1", "--port", str(port),
           "--parallel", str(parallel), "-c", str(ctx_per_slot * parallel)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc)
    return proc, url


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


# -- report -----------------------------------------------------------------------------------

def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def table(rows: list[LoadSummary]) -> Iterator[str]:
    yield (f"{'backend':<13}{'conc':>5}{'reqs':>6}{'fail':>5}{'req/s':>8}{'tok/s':>8}"
           f"{'TTFT p50':>10}{'p99 ms':>8}{'ITL p50':>9}{'p99 ms':>8}{'RSS MB':>8}")
    for s in rows:
        rss = "-" if s.server_rss_mb is None else f"{s.server_rss_mb:.0f}"
        yield (f"{s.backend:<13}{s.concurrency:>5}{s.requests:>6}{s.failures:>5}"
               f"{s.req_per_s:>8.2f}{s.output_tok_per_s:>8.1f}{_ms(s.ttft_p50_s):>10}"
               f"{_ms(s.ttft_p99_s):>8}{_ms(s.itl_p50_s):>9}{_ms(s.itl_p99_s):>8}{rss:>8}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tightfit.server.loadtest",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="server to measure (default: start `tightfit serve` here)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--requests", type=int, default=200, help="requests per level")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--model", default=None, help="model for a started server / the request")
    p.add_argument("--quant", default=None, help="--quant for a started tightfit server")
    p.add_argument("--api-key", default=os.environ.get("TIGHTFIT_API_KEY"))
    p.add_argument("--warmup", type=int, default=None, help="warm-up requests (default: C)")
    p.add_argument("--no-llama-server", action="store_true", help="skip llama-server")
    p.add_argument("--json", action="store_true", help="print one JSON object per level")
    return p.parse_args(argv)


def _levels(backend: str, url: str, args: argparse.Namespace, model: str | None
            ) -> list[LoadSummary]:
    body = request_body(args.max_tokens, args.prompt, model)
    out = []
    for c in args.concurrency:
        s = measure(backend, url, c, args.requests, body, args.api_key, args.warmup)
        print(json.dumps(asdict(s)) if args.json else list(table([s]))[1],
              file=sys.stderr, flush=True)
        out.append(s)
    return out


def _tightfit_rows(args: argparse.Namespace) -> list[LoadSummary]:
    if args.url:
        return _levels("tightfit", args.url.rstrip("/"), args, args.model)
    extra = ["--max-num-seqs", str(max(args.concurrency))]
    extra += ["--model", args.model] if args.model else []
    extra += ["--quant", args.quant] if args.quant else []
    proc, url = start_tightfit(extra)
    try:
        return _levels("tightfit", url, args, None)
    finally:
        stop(proc)


def _llama_rows(args: argparse.Namespace) -> list[LoadSummary]:
    binary = None if args.no_llama_server else llama_server_binary()
    if binary is None:
        print("llama-server: skipped (not found on PATH and $LLAMA_SERVER not set)",
              file=sys.stderr)
        return []
    proc, url = start_llama_server(binary, args.model, max(args.concurrency))
    try:
        return _levels("llama-server", url, args, None)
    finally:
        stop(proc)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = _tightfit_rows(args) + _llama_rows(args)
    if args.json:
        for s in rows:
            print(json.dumps(asdict(s)))
    else:
        print(f"{args.requests} streaming requests per level, max_tokens={args.max_tokens}, "
              f"prompt {args.prompt!r}")
        print("\n".join(table(rows)))
    return 1 if any(s.failures for s in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
