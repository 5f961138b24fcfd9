"""`tightfit calibrate`: measure this machine's memory bandwidth and matmul rate, run the engine
briefly on the embedded model (tightfit, the lite runtime, and llama.cpp where
llama-cpp-python is installed), and store a device profile;
`tightfit predict` then accepts hardware name "local" or "this", and predictions for those
engines there are scaled by how each engine's calibration run compared with its own prediction
(tightfit/predictor/local.py)."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tightfit.errors import TightfitError


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "calibrate", help="measure this machine and store a device profile for predictions",
        description="Measure memory bandwidth (numpy copy) and fp32 matmul rate (numpy GEMM), "
                    "then write a device profile JSON used for hardware name 'local'/'this'.")
    p.add_argument("--output", "-o", help="profile path (default ~/.cache/tightfit/device.json "
                                          "or $TIGHTFIT_DEVICE_PROFILE)")
    p.add_argument("--size-mb", type=int, default=256, help="copy buffer size in MB (default 256)")
    p.add_argument("--matrix", type=int, default=1024, help="GEMM side length (default 1024)")
    p.add_argument("--no-engine", action="store_true",
                   help="skip the short engine runs (tightfit, the lite runtime, and llama.cpp "
                        "where llama-cpp-python is installed; about 10 s each: load the "
                        "embedded model, 128-token prompts, 32 generated tokens)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for the engine run (default: all cores)")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    p.set_defaults(func=run)


ENGINE_PROMPT_TOKENS = 128
ENGINE_GEN_TOKENS = 32


# tightfit and the lite runtime always; llama.cpp where llama-cpp-python is installed (optional)
ENGINES = ("tightfit", "tightfit-lite", "llama.cpp")


def _llama_cpp(threads: int | None) -> tuple[Any, Any, int, Path]:
    """llama.cpp (llama-cpp-python) on the embedded model's file, and a run of one prompt that
    returns (TTFT s, decode tok/s) timed as the bench's llamacpp backend times it."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise TightfitError("llama-cpp-python is not installed (optional: `make llamacpp`)") from exc
    from tightfit.engine.loader.resolve import resolve_model
    from tightfit.predictor.calibrate import physical_cores

    path = resolve_model(None)
    n = threads or physical_cores()  # llama.cpp's own default, and the profile's cores
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_batch=512, n_threads=n,
                          n_threads_batch=n, verbose=False)

    def one(ids: list[int]) -> tuple[float, float]:
        llm.reset()
        t0 = time.perf_counter()
        first, count = 0.0, 0
        for _ in llm.generate(ids, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
            count += 1
            if count == 1:
                first = time.perf_counter()
            if count >= ENGINE_GEN_TOKENS:
                break
        return first - t0, (count - 1) / (time.perf_counter() - first)

    tokenizer = SimpleNamespace(encode=lambda text: llm.tokenize(text.encode(), add_bos=False))
    return tokenizer, one, n, path


def engine_run(threads: int | None, engine: str = "tightfit") -> dict[str, object]:
    """One short run of an engine (tightfit, the lite runtime, llama.cpp) on the embedded model
    with its stored (native) weights: the best of two for decode and prefill rates. Each
    engine's run corrects predictions for that engine only: two CPUs can differ 2x in one
    engine's kernels and not in another's (docs/predictor.md, "A second machine")."""
    from tightfit import SamplingParams
    from tightfit.studies.workload_driver import corpus_ids

    params = SamplingParams(max_tokens=ENGINE_GEN_TOKENS, ignore_eos=True)
    if engine == "llama.cpp":
        tokenizer, one, n_threads, path = _llama_cpp(threads)
    else:
        if engine == "tightfit-lite":
            from tightfit.lite import LiteLLM

            llm: Any = LiteLLM(num_threads=threads)
            fresh = llm.derive
        else:
            from tightfit import LLM

            llm = LLM(quant="native", num_threads=threads)
            fresh = lambda: llm.derive(enable_prefix_caching=False)  # noqa: E731

        def one(ids: list[int]) -> tuple[float, float]:
            out = fresh().generate([ids], params)[0]
            return out.ttft_s, out.decode_tok_s or 0.0
        tokenizer, n_threads, path = llm.tokenizer, llm.num_threads, llm.loaded.path
    ids = corpus_ids(tokenizer)
    best: dict[str, float] = {"decode_tok_s": 0.0, "prefill_tok_s": 0.0}
    for i in range(3):  # the first warms up
        ttft, decode = one(ids[1000 * i:1000 * i + ENGINE_PROMPT_TOKENS])
        if i == 0:
            continue
        best["decode_tok_s"] = max(best["decode_tok_s"], decode)
        best["prefill_tok_s"] = max(best["prefill_tok_s"], ENGINE_PROMPT_TOKENS / ttft)
    gguf_type = Path(path).name.rsplit(".", 2)[-2].lower()  # SmolLM2-...Q4_1.gguf -> q4_1
    return {"engine": engine, "model": "smollm2-135m", "quant": gguf_type,
            "threads": n_threads, "prompt_tokens": ENGINE_PROMPT_TOKENS,
            "gen_tokens": ENGINE_GEN_TOKENS,
            **{k: round(v, 2) for k, v in best.items()}}


def run(args: argparse.Namespace) -> int:
    from tightfit.predictor import calibrate
    from tightfit.predictor.scenario import device_profile_path

    if not 8 <= args.size_mb <= 65536:
        raise TightfitError(f"--size-mb {args.size_mb} is out of range; use 8..65536")
    if not 64 <= args.matrix <= 16384:
        raise TightfitError(f"--matrix {args.matrix} is out of range; use 64..16384")
    path = Path(args.output) if args.output else device_profile_path()
    if args.threads is not None and args.threads < 1:
        raise TightfitError(f"--threads must be >= 1, got {args.threads}")
    spec = calibrate.measure(args.size_mb, args.matrix)
    runs = []
    for engine in () if args.no_engine else ENGINES:
        try:
            runs.append(engine_run(args.threads, engine))
        except TightfitError as exc:
            if engine == "tightfit":
                raise
            # the lite runtime compiles its kernels with the machine's C compiler at first use;
            # llama-cpp-python is an optional extra
            print(f"engine run: {engine} skipped ({exc}); its predictions stay uncorrected")
    payload = calibrate.save_profile(spec, path, runs)
    if args.json:
        print(json.dumps(payload, indent=1))
    else:
        kernel = "no" if spec.kernel_gflops is None else f"{spec.kernel_gflops:.0f} GFLOP/s"
        kernel += " block-format kernel"
        if spec.kernel_stream_share is not None:
            kernel += f" (streams {spec.kernel_stream_share:.2f} of a copy)"
        print(f"{spec.name}: {spec.copy_bandwidth_gbps} GB/s copy (rated equivalent "
              f"{spec.bandwidth_gbps}), {spec.fp16_tflops * 1000:.0f} "
              f"GFLOP/s fp32 matmul, {kernel}, {spec.memory_gb} GiB RAM "
              f"-> {path}")
        for r in runs:
            print(f"engine run: {r['engine']} {r['model']} {r['quant']}, {r['threads']} threads: "
                  f"decode {r['decode_tok_s']} tok/s, prefill {r['prefill_tok_s']} tok/s")
    return 0
