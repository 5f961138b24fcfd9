"""`tightfit calibrate`: measure this machine's memory bandwidth and matmul rate and store a device
profile; `tightfit predict` then accepts hardware name "local" or "this"."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

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
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tightfit.predictor import calibrate
    from tightfit.predictor.scenario import device_profile_path

    if not 8 <= args.size_mb <= 65536:
        raise TightfitError(f"--size-mb {args.size_mb} is out of range; use 8..65536")
    if not 64 <= args.matrix <= 16384:
        raise TightfitError(f"--matrix {args.matrix} is out of range; use 64..16384")
    path = Path(args.output) if args.output else device_profile_path()
    spec = calibrate.measure(args.size_mb, args.matrix)
    payload = calibrate.save_profile(spec, path)
    if args.json:
        print(json.dumps(payload, indent=1))
    else:
        print(f"{spec.name}: {spec.bandwidth_gbps} GB/s copy, {spec.fp16_tflops * 1000:.0f} "
              f"GFLOP/s fp32 matmul, {spec.memory_gb} GiB RAM -> {path}")
    return 0
