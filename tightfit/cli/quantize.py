"""`tightfit quantize`: writes a model in a weight format or precision plan to a `.tfq` file that
the engine loads directly (`tightfit generate --model out.tfq ...`); AWQ calibration, if the plan
asks for it, runs here once instead of at every load. File layout: tightfit/engine/loader/
quantized.py. With an output ending in `.gguf` it re-types a GGUF file's weights instead
(Q4_0 / Q4_1 / Q8_0 / F16 / F32, as llama-quantize does; no torch): the types the lite runtime
reads, from any type gguf-py can read (K-quants included)."""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quantize", help="write a quantised model file (.tfq, or a re-typed .gguf)",
                       description="Quantise a model (GGUF, HF directory or packaged name) with a "
                                   "weight format or precision plan and write a .tfq file; or, "
                                   "with an output ending in .gguf, re-type a GGUF model's "
                                   "weights to Q4_0, Q4_1, Q8_0, F16 or F32 (the types "
                                   "`--runtime lite` reads; metadata and tokenizer kept).")
    p.add_argument("--model", "-m", default=None,
                   help="GGUF file, HF-layout directory or packaged model name "
                        "(default: the embedded SmolLM2-135M)")
    p.add_argument("--quant", required=True,
                   help="int8, int4-g32|g64|g128, int4-awq-g32|g64|g128, native, fp32, or a "
                        "precision-plan file (YAML/JSON); for a .gguf output: Q4_0, Q4_1, Q8_0, "
                        "F16 or F32")
    p.add_argument("--output", "-o", required=True,
                   help="file to write: .tfq (tightfit's format) or .gguf (GGUF re-typing)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.set_defaults(func=run)


def show_awq_progress() -> None:
    """AWQ calibration logs one line per layer; show them on stderr (it can take minutes)."""
    log = logging.getLogger("tightfit.awq")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def run(args: argparse.Namespace) -> int:
    from tightfit.errors import TightfitError

    out = Path(args.output)
    if out.suffix == ".gguf":
        return run_gguf(args, out)
    if out.suffix != ".tfq":
        raise TightfitError(f"output {str(out)!r} must end in .tfq (the engine recognises "
                            "quantised files by that suffix) or .gguf (a re-typed GGUF file)")
    from tightfit.engine.loader.convert import TARGETS

    if args.quant.upper() in TARGETS and args.quant.upper() != "F32":
        raise TightfitError(f"--quant {args.quant} is a GGUF type: give an output ending in "
                            ".gguf, or a tightfit format (int8, int4-g64, ...) for a .tfq file")
    import torch

    from tightfit.config import default_threads
    from tightfit.engine.loader.model_loader import load_model
    from tightfit.engine.loader.quantized import save_quantized

    torch.set_num_threads(args.threads or default_threads())
    show_awq_progress()
    t0 = time.perf_counter()
    loaded = load_model(args.model, args.quant)
    save_quantized(loaded, out)
    size_mb = out.stat().st_size / 1e6
    print(f"wrote {out} ({size_mb:.1f} MB, {loaded.weight_format}, from {loaded.path.name}) "
          f"in {time.perf_counter() - t0:.1f} s")
    return 0


def run_gguf(args: argparse.Namespace, out: Path) -> int:
    """GGUF in, GGUF out, weights re-typed (tightfit/engine/loader/convert.py); torch-free."""
    from tightfit.engine.loader.convert import convert, target_type
    from tightfit.engine.loader.resolve import resolve_model
    from tightfit.errors import TightfitError

    target = target_type(args.quant)
    src = resolve_model(args.model)
    if src.suffix.lower() != ".gguf":
        raise TightfitError(f"a .gguf output re-types a GGUF file, and {str(src)!r} is not one: "
                            "give a .gguf model, or write a .tfq file instead")
    t0 = time.perf_counter()
    done = convert(src, out, target)
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(done["tensors"].items()))
    print(f"wrote {out} ({done['bytes_out'] / 1e6:.1f} MB, {target}: {kinds} tensors; from "
          f"{src.name}, {done['bytes_in'] / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s")
    if target in ("Q4_0", "Q4_1") and done["source_type"] not in ("F32", "F16", "BF16"):
        print(f"note: {src.name} is already quantised ({done['source_type']}); rounding it again "
              f"to {target} costs quality (the default model's Q4_1 -> Q4_0: perplexity "
              "+16-27% on the project's corpus). Start from an F16/F32 file where you can.",
              file=sys.stderr)
    return 0
