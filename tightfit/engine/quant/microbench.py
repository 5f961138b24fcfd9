"""Micro-benchmark of the linear drop-ins (fp32 / int8 / int4-g32/64/128) at the default model's
projection shapes: `python -m tightfit.engine.quant.microbench [--threads 1 2] [--m 1 4 16]`.
Prints the median ms per call; random weights (kernel speed does not depend on the values).
By default calls rotate over enough copies of each module to exceed the last-level cache, as in
a decode step that streams every layer's weights once (`--hot` reuses one copy: cache-resident).
"""
from __future__ import annotations

import argparse
import copy
import itertools
import statistics
import time
from typing import Callable

import torch

from tightfit.engine.quant.linear import quantize_linear

# SmolLM2-135M: hidden 576, 9 heads x 64, 3 KV heads, intermediate 1536, vocabulary 49152.
DEFAULT_SHAPES: tuple[tuple[str, int, int], ...] = (
    ("q/o 576x576", 576, 576),
    ("k/v 192x576", 192, 576),
    ("gate/up 1536x576", 1536, 576),
    ("down 576x1536", 576, 1536),
    ("head 49152x576", 49152, 576),
)
DEFAULT_FORMATS = ("fp32", "int8", "int4-g32", "int4-g64", "int4-g128")


def time_call(fn: Callable[[], object], min_time: float, repeats: int = 5) -> float:
    """Median ms per call over `repeats` timed batches, each lasting about min_time / repeats."""
    fn()
    fn()  # warm-up: first calls allocate and fault in pages
    start = time.perf_counter()
    fn()
    one = max(time.perf_counter() - start, 1e-6)
    n = max(1, int(min_time / repeats / one))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - start) / n * 1e3)
    return statistics.median(samples)


def module_nbytes(module: torch.nn.Module) -> int:
    from tightfit.engine.quant.linear import held_bytes

    return held_bytes(module)


def _copies(module: torch.nn.Module, working_set: int) -> list[torch.nn.Module]:
    """Enough deep copies of `module` that cycling through them touches `working_set` bytes."""
    n = max(1, -(-working_set // max(1, module_nbytes(module))))
    return [module] + [copy.deepcopy(module) for _ in range(n - 1)]


def run(shapes: tuple[tuple[str, int, int], ...], formats: tuple[str, ...], ms: list[int],
        threads: list[int], min_time: float, working_set: int) -> list[dict[str, object]]:
    """working_set: bytes of weights each format's calls rotate over (0: one hot copy)."""
    rows: list[dict[str, object]] = []
    gen = torch.Generator().manual_seed(0)
    for label, out_f, in_f in shapes:
        weight = torch.randn(out_f, in_f, generator=gen) * 0.02
        modules = {f: _copies(quantize_linear(weight, None, f), working_set) for f in formats}
        del weight
        for t in threads:
            torch.set_num_threads(t)
            for m in ms:
                x = torch.randn(m, in_f, generator=gen)
                row: dict[str, object] = {"shape": label, "M": m, "threads": t}
                with torch.inference_mode():
                    for f, mods in modules.items():
                        ring = itertools.cycle(mods)
                        row[f] = time_call(lambda ring=ring: next(ring)(x), min_time)
                rows.append(row)
                print(_format_row(row, formats), flush=True)
        del modules
    return rows


def _format_row(row: dict[str, object], formats: tuple[str, ...]) -> str:
    cells = [f"{row['shape']:<18}", f"{row['M']:>3}", f"{row['threads']:>3}"]
    cells += [f"{row[f]:>10.3f}" for f in formats]
    return " ".join(cells)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--m", type=int, nargs="+", default=[1, 4, 16], help="rows per call")
    p.add_argument("--formats", nargs="+", default=list(DEFAULT_FORMATS))
    p.add_argument("--min-time", type=float, default=0.25,
                   help="seconds spent timing each (shape, M, threads, format)")
    p.add_argument("--skip-head", action="store_true", help="leave out the 49152x576 head")
    p.add_argument("--hot", action="store_true",
                   help="call one copy of each module (weights stay in cache)")
    p.add_argument("--working-set-mb", type=int, default=128,
                   help="MB of weights rotated over per format when not --hot (default 128, "
                        "several times a typical last-level cache)")
    args = p.parse_args(argv)
    shapes = tuple(s for s in DEFAULT_SHAPES if not (args.skip_head and s[1] == 49152))
    formats = tuple(args.formats)
    working_set = 0 if args.hot else args.working_set_mb << 20
    print(f"torch {torch.__version__}, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}; ms per call (median); weights "
          f"{'hot (one copy)' if args.hot else f'rotated over {args.working_set_mb} MB'}")
    header = [f"{'shape':<18}", f"{'M':>3}", f"{'thr':>3}"] + [f"{f:>10}" for f in formats]
    print(" ".join(header))
    run(shapes, formats, args.m, args.threads, args.min_time, working_set)


if __name__ == "__main__":
    main()
