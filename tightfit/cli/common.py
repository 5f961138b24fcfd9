"""Options shared by the subcommands that load a model (generate, chat, serve, eval, ...), and
the small helpers that turn them into library objects. No torch import at module level."""
from __future__ import annotations

import argparse
from typing import Any


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", "-m", default=None,
                   help="GGUF file, HF-layout directory, or a packaged model name "
                        "('smollm2-135m' = the embedded default, 'gemma3-270m')")
    g.add_argument("--quant", default="native",
                   help="weight format: native, fp32, int8, int4-g32|g64|g128, "
                        "int4-awq-g32|g64|g128, or a precision-plan file (default: native = as stored)")
    g.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    g.add_argument("--max-model-len", type=int, default=2048,
                   help="longest prompt + output in tokens (default: 2048)")
    g.add_argument("--kv-cache-memory", default="256MiB",
                   help="memory for the paged KV cache, e.g. 256MiB (default: 256MiB)")
    g.add_argument("--memory-budget", default=None,
                   help="hard memory budget for the whole process, e.g. 1.5GiB: weights, "
                        "runtime and activations are measured/estimated and the KV pool gets "
                        "the rest (overrides --kv-cache-memory); refused if the model cannot fit")
    g.add_argument("--kv-tiers", default=None, metavar="NAME:MAX_LEN:SHARE,...",
                   help="KV pool length tiers, e.g. short:512:0.3,long:2048:0.7 (a request goes "
                        "to the smallest tier that holds prompt + max_tokens; an idle tier's "
                        "blocks are borrowed; default: short:512:0.5,long:2048:0.5)")
    g.add_argument("--kv-dtype", choices=("fp32", "int8"), default="fp32",
                   help="KV cache storage: fp32, or int8 with per-token, per-head scales "
                        "(~3.8x more tokens in the same memory; default: fp32)")
    g.add_argument("--compile", action="store_true",
                   help="run decode steps through torch.compile (C++ wrapper): ~1.5x faster "
                        "decode, but the first start compiles for minutes (cached on disk "
                        "afterwards); fp32 KV cache only")
    g.add_argument("--no-script", dest="scripted", action="store_false",
                   help="run decode steps through eager PyTorch modules instead of the "
                        "TorchScript decode stack (same results, slower; for debugging)")
    g.add_argument("--no-fused", dest="fused", action="store_false",
                   help="run the TorchScript decode stack on ATen ops only, without tightfit's "
                        "fused C++ decode kernels (same results to float rounding, slower)")


def add_runtime_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runtime", choices=("torch", "lite"), default="torch",
                   help="torch: the full engine (every format and architecture, paged KV pool, "
                        "KV compression; default). lite: llama-architecture GGUF files on their "
                        "own weights in a process without torch (~200 MiB instead of ~500 MiB "
                        "for the default model; --quant native only, no KV pool options)")


# options the lite runtime does not take, with the value that means "not asked for"
_TORCH_ONLY = {"quant": "native", "memory_budget": None, "kv_tiers": None, "kv_dtype": "fp32",
               "compile": False, "scripted": True, "fused": True}


def build_lite_llm(args: argparse.Namespace, max_num_seqs: int = 32) -> Any:
    from tightfit.errors import TightfitError
    from tightfit.lite import LiteLLM

    for name, default in _TORCH_ONLY.items():
        if getattr(args, name, default) != default:
            flag = {"scripted": "no-script", "fused": "no-fused"}.get(name, name)
            raise TightfitError(f"--runtime lite runs the GGUF file's own weights with its own "
                                f"K/V slots: drop --{flag.replace('_', '-')} "
                                f"({getattr(args, name)!r}), or use --runtime torch")
    return LiteLLM(args.model, num_threads=args.threads, max_model_len=args.max_model_len,
                   max_num_seqs=max_num_seqs)


def add_sampling_args(p: argparse.ArgumentParser, max_tokens: int = 128) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=max_tokens,
                   help=f"tokens to generate at most (default: {max_tokens})")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default: 1)")
    g.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def parse_tiers(text: str | None) -> tuple[tuple[str, int, float], ...] | None:
    """"short:512:0.3,long:2048:0.7" -> (("short", 512, 0.3), ("long", 2048, 0.7))."""
    from tightfit.engine.memory_pool import Tier
    from tightfit.errors import TightfitError

    if text is None:
        return None
    tiers = []
    for part in text.split(","):
        bits = part.strip().split(":")
        try:
            name, max_len, share = bits[0], int(bits[1]), float(bits[2])
            if len(bits) != 3 or not name:
                raise ValueError
        except (ValueError, IndexError):
            raise TightfitError(f"cannot read KV tier {part!r}: use NAME:MAX_LEN:SHARE, e.g. "
                                "short:512:0.3") from None
        Tier(name, max_len, share)  # validates: max_len >= 1, share in (0, 1]
        tiers.append((name, max_len, share))
    if sum(t[2] for t in tiers) > 1 + 1e-9:
        raise TightfitError(f"KV tier shares add up to {sum(t[2] for t in tiers):g} in "
                            f"{text!r}: they must total at most 1")
    return tuple(tiers)


def build_llm(args: argparse.Namespace, **extra: Any) -> Any:
    if getattr(args, "runtime", "torch") == "lite":  # before anything imports torch
        return build_lite_llm(args, extra.pop("max_num_seqs", 32))
    from tightfit import LLM

    tiers = parse_tiers(getattr(args, "kv_tiers", None))
    if tiers is not None:
        extra.setdefault("tiers", tiers)
    return LLM(model=args.model, quant=args.quant, num_threads=args.threads,
               max_model_len=args.max_model_len, kv_cache_memory=args.kv_cache_memory,
               kv_dtype=getattr(args, "kv_dtype", "fp32"),
               memory_budget=getattr(args, "memory_budget", None),
               compile_decode=getattr(args, "compile", False),
               scripted_decode=getattr(args, "scripted", True),
               fused_kernels=getattr(args, "fused", True), **extra)


def sampling_from_args(args: argparse.Namespace) -> Any:
    from tightfit import SamplingParams

    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                          top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                          stop=tuple(args.stop))


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB."""
    from tightfit.sysmem import peak_rss_mib

    return peak_rss_mib()
