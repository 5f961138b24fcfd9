"""Measurement tables -> labelled scenarios for fitting and evaluation, with stated filter rules.

Reads the TSVs shipped in `predictor/data/` (or `TIGHTFIT_SHARED_DATA`). Each filter rule is named
and counted so that the evaluation report can print what was dropped and why.
"""
from __future__ import annotations

import csv
import hashlib
import math
import os
import re
import statistics
from collections import Counter
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any
from pathlib import Path

from tightfit.predictor import architectures, formats, hardware, memory
from tightfit.predictor.hardware import DeviceSpec
from tightfit.predictor.scenario import ALL_LAYERS, Scenario, Workload, stored_bits

APPLE_FILE = "llamacpp_4167_apple_silicon_llama2_7b.tsv"
LLMFIT_FILE = "llmfit_community_benchmarks.tsv"
# The server settings some llmfit submissions state in the pull request that added them (the
# table has no column for them): context, -ngl, --n-cpu-moe, per submission file and model
# ("*": the file's other models). Read by hand from those pull requests' descriptions.
LLMFIT_SETTINGS_FILE = "llmfit_settings.tsv"
DESIGN_FILE = "design_reference.tsv"
# tightfit's own dataset, one file per machine, each a copy of data/measurements/<name>.jsonl (a
# bench sweep): the 2-core AMD EPYC VM, and the 2-core Intel Xeon VM (the single-stream blocks).
OWN_FILES = ("tightfit_cpu_2core.jsonl", "tightfit_cpu_2core_xeon.jsonl")
MIN_OVER_AVG = 0.5       # rule: unstable run if the slowest repetition < half the average
MAX_BW_UTIL = 1.15       # rule: physically impossible if implied bandwidth > 115% of peak
# Prompt tokens a llmfit llama.cpp request makes the server process. Its client (llmfit-core's
# bench.rs) sends one of three short prompts a run in the model's chat template, after a
# warm-up request ("Say hello.") through the same template; llama-server keeps the cached
# prefix (`cache_prompt`, on by default), so what runs is the user text and the template's
# closing and assistant header. Counted with tightfit's tokenizer and the GGUF chat templates
# of SmolLM2 and Gemma 3: 11, 18-20 and 23 tokens of text, 20-53 with the template, 16-29
# after the warm-up's prefix (22-24 on average).
LLMFIT_PROMPT_TOKENS = 24


@dataclass(frozen=True)
class Observation:
    scenario: Scenario
    metric: str          # decode_tok_s | prefill_tok_s | ttft_s | peak_memory_gb | fits
    value: float
    device_key: str
    model_key: str
    source: str
    # True: `value` is the tokens generated over the request's whole wall time, the prompt, the
    # request's own overhead and the first token included (llmfit's client for llama-server
    # divides a non-streamed reply's output tokens by its total milliseconds: the table's
    # avg_decode_tps x avg_total_ms / 1000 = avg_output_tokens, within 1% in the median of its
    # llamacpp rows and 10% on every one: a mean of three runs' ratios), not the rate of the
    # decode steps alone.
    whole_request: bool = False
    # The machine a run of tightfit's own dataset ran on, whatever its thread count (its
    # `device_key` is the machine at the threads used): "" for the shared tables, whose device
    # is the machine.
    machine_key: str = ""


def data_dir() -> Path:
    env = os.environ.get("TIGHTFIT_SHARED_DATA")
    return Path(env) if env else Path(__file__).parent / "data"


def data_hash(directory: Path | None = None) -> str:
    h = hashlib.sha256()
    for name in (APPLE_FILE, LLMFIT_FILE, DESIGN_FILE, *OWN_FILES):
        path = Path(directory or data_dir()) / name
        if path.is_file() or name not in OWN_FILES:
            h.update(path.read_bytes())
    h.update((Path(__file__).parent / "data" / LLMFIT_SETTINGS_FILE).read_bytes())
    return h.hexdigest()[:16]


def _read(name: str, directory: Path | None) -> list[dict[str, str]]:
    with open(Path(directory or data_dir()) / name, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def model_key(name: str) -> str:
    """Model identity for leave-one-model-out: the name without org prefix, tuning tags or quant."""
    s = architectures.clean_name(name)
    s = re.sub(r"^[a-z0-9.-]+_", "", s)
    s = re.sub(r"[-_:](instruct|it|chat|thinking|base|pt|hf|mlx|4bit|latest|v\d[\w.]*|\d{4}).*$",
               "", s)
    return s


def load_apple(directory: Path | None = None) -> list[Observation]:
    out = []
    model = architectures.KNOWN["llama-2-7b"]
    for row in _read(APPLE_FILE, directory):
        device = hardware.apple_chip(row["chip"], int(row["gpu_cores"]))
        device = hardware.with_overrides(device, bandwidth_gbps=float(row["mem_bw_GBps"]))
        key = hardware.normalise_name(device.name)  # same key as the llmfit rows of that chip
        for quant in ("f16", "q8_0", "q4_0"):
            for metric, col, wl in (("prefill_tok_s", f"{quant}_pp512_tps", Workload(512, 0, 1, 512)),
                                    ("decode_tok_s", f"{quant}_tg128_tps", Workload(0, 128, 1, 128))):
                if row.get(col):
                    sc = Scenario(f"apple-{row['chip']}-{row['gpu_cores']}-{quant}-{metric}", device,
                                  model, quant, stored_bits(quant, model), "llama.cpp", wl)
                    out.append(Observation(sc, metric, float(row[col]), key, "llama-2-7b", "apple"))
    return out


def load_design(directory: Path | None = None) -> list[Observation]:
    out = []
    for i, row in enumerate(_read(DESIGN_FILE, directory)):
        device = hardware.lookup(row["device"])
        model = architectures.lookup(row["model"])
        assert device is not None and model is not None, row
        # the reference rows measured through llama-cpp-python ran without flash attention
        fa = False if "llama-cpp-python" in row.get("note", "") else None
        wl = Workload(int(row["prompt_tokens"]), int(row["gen_tokens"]), 1,
                      int(row["context_tokens"]), flash_attn=fa)
        sc = Scenario(f"design-{i}", device, model, row["quant"],
                      stored_bits(row["quant"], model), row["engine"], wl)
        value = float(row["value"]) * (1e9 / 2**30 if row["metric"] == "peak_memory_gb" else 1.0)
        out.append(Observation(sc, row["metric"], value, hardware.normalise_name(device.name),
                               model_key(row["model"]), "design"))
    return out


def load_llmfit(directory: Path | None = None) -> tuple[list[Observation], Counter[str]]:
    """llama.cpp rows of the llmfit table that pass the rules; also the count dropped per rule."""
    dropped: Counter[str] = Counter()
    out, seen = [], set()
    for row in _read(LLMFIT_FILE, directory):
        reason = _llmfit_reject(row, seen)
        if reason:
            dropped[reason] += 1
            continue
        obs = _llmfit_observation(row)
        if obs is None:
            dropped["hardware not in catalog"] += 1
        elif _impossible(obs):
            dropped["implied bandwidth > 115% of peak (name misstates the model)"] += 1
        else:
            out.append(obs)
    return out, dropped


def _llmfit_reject(row: dict[str, str], seen: set[tuple[str, ...]]) -> str | None:
    ident = (row["hardware_name"], row["model_file"], row["avg_decode_tps"], row["avg_total_ms"])
    if ident in seen:
        return "exact duplicate row"
    seen.add(ident)
    if row["provider"] != "llamacpp":
        return f"provider {row['provider']} (not llama.cpp)"
    if architectures.lookup(row["model_file"]) is None:
        return "model size not derivable from the file name"
    if formats.quant_from_filename(row["model_file"]) is None:
        return "weight format not derivable from the file name"
    if float(row["min_decode_tps"]) < MIN_OVER_AVG * float(row["avg_decode_tps"]):
        return "unstable run (min < 0.5 x avg)"
    return _stated(row).get("excluded")


def _stated(row: dict[str, str]) -> dict[str, Any]:
    """The settings the row's submission states (`llmfit_settings`), or {}."""
    stated = llmfit_settings()
    return stated.get((row["source_file"], row["model_file"])) or \
        stated.get((row["source_file"], "*")) or {}


def _llmfit_device(row: dict[str, str]) -> DeviceSpec | None:
    spec = hardware.lookup(row["hardware_name"])
    if spec is None:
        return None
    count = max(int(row["gpu_count"]), 1)
    host = hardware.lookup(row["cpu"])
    return hardware.with_overrides(
        spec, memory_gb=float(row["vram_gb"]) / count, device_count=count,
        host_memory_gb=float(row["ram_gb"]),
        host_bandwidth_gbps=host.bandwidth_gbps if host and not spec.unified else None,
    )


def _llmfit_observation(row: dict[str, str]) -> Observation | None:
    device = _llmfit_device(row)
    model = architectures.lookup(row["model_file"])
    quant = formats.quant_from_filename(row["model_file"])
    if device is None or model is None or quant is None:
        return None
    gen = int(float(row["avg_output_tokens"]))
    stated = _stated(row)
    # The table does not say what context the server ran with; taken as the request's (a
    # prompt of <= 64 tokens with its chat template, and the tokens generated). llama.cpp's
    # `--fit` floor for a context left unset, 4096, placed the offloaded rows worse
    # (docs/predictor.md). The prompt processed: LLMFIT_PROMPT_TOKENS. Nor does it say how a
    # mixture of experts too large for the card was placed: taken as whole layers (an explicit
    # `-ngl`, which turns `--fit` off), which the table's offloaded MoE rows fit better than
    # llama.cpp's default of experts first (held out by device, llmfit 10.5% vs 10.8%: a
    # choice made on these rows; docs/predictor.md "A mixture of experts on the host").
    # Where the submission states the server's settings (LLMFIT_SETTINGS_FILE), they are used.
    ctx = stated.get("context_tokens") or 64 + gen
    sc = Scenario(f"llmfit-{row['source_file']}-{row['model_file']}", device, model, quant,
                  stored_bits(quant, model), "llama.cpp",
                  Workload(LLMFIT_PROMPT_TOKENS, gen, 1, max(ctx, LLMFIT_PROMPT_TOKENS + gen),
                           moe_offload="layers", gpu_layers=stated.get("gpu_layers"),
                           n_cpu_moe=stated.get("n_cpu_moe")),
                  embed_bits=formats.embed_bits_from_filename(row["model_file"]))
    return Observation(sc, "decode_tok_s", float(row["avg_decode_tps"]),
                       hardware.normalise_name(row["hardware_name"]), model_key(row["model_file"]),
                       "llmfit", whole_request=True)


_SETTINGS: dict[tuple[str, str], dict[str, Any]] = {}


def llmfit_settings() -> dict[tuple[str, str], dict[str, Any]]:
    """(submission file, model file or "*") -> the stated settings: context_tokens, gpu_layers
    (llama.cpp's -ngl; "all" as a count past any model's layers), n_cpu_moe; a blank is not
    stated; `excluded`, where the stated setup is one the predictor has no input for (the rows
    are dropped, the reason counted as a data rule). Read from this package's data (the file is
    tightfit's, not the shared tables')."""
    if not _SETTINGS:
        for r in _read(LLMFIT_SETTINGS_FILE, Path(__file__).parent / "data"):
            got = {}
            for key in ("context_tokens", "gpu_layers", "n_cpu_moe"):
                v = (r.get(key) or "").strip()
                if v:
                    got[key] = ALL_LAYERS if v == "all" else int(v)
            if (r.get("excluded") or "").strip():
                got["excluded"] = r["excluded"].strip()
            _SETTINGS[(r["source_file"], r["model_file"])] = got
    return _SETTINGS


def _with_known_attention(model: architectures.ModelSpec) -> architectures.ModelSpec:
    """A measured run records the model's shape, not its attention pattern or head tying: take
    them from the table entry of the same shape (the default Gemma 3 270M: 15 of 18 layers on a
    512-token window, tied)."""
    shape = (model.n_layers, model.hidden_size, model.n_kv_heads, model.vocab_size)
    for known in architectures.KNOWN.values():
        if (known.n_layers, known.hidden_size, known.n_kv_heads, known.vocab_size) == shape:
            return replace(model, sliding_window=known.sliding_window,
                           sliding_layers=known.sliding_layers,
                           attention_layers=known.attention_layers,
                           tied_embeddings=known.tied_embeddings)
    return model


def _impossible(obs: Observation) -> bool:
    s = obs.scenario
    bytes_tok = memory.params_read_per_token(s) * s.bits_per_weight / 8
    return bytes_tok * obs.value > MAX_BW_UTIL * s.device.bandwidth_gbps * 1e9


def _median_log_ratio(obs: list[Observation]) -> float:
    from tightfit.predictor import roofline

    logs = sorted(math.log(o.value * roofline.analyse(o.scenario).decode.total) for o in obs)
    return logs[len(logs) // 2]


def relabel_unused_gpus(obs: list[Observation], rows: list[dict[str, str]]) -> tuple[list[Observation], list[str]]:
    """Rule: a discrete GPU whose rows are, in the median, over 1.5x slower than the analytic GPU
    hypothesis and whose host-CPU hypothesis has under half its median log error ran on the CPU:
    relabel the device (the runtime evidently did not use the GPU), unless its submission states
    a GPU placement (LLMFIT_SETTINGS_FILE)."""
    host_of = {hardware.normalise_name(r["hardware_name"]): r["cpu"] for r in rows}
    out, moved = [], []
    for key in sorted({o.device_key for o in obs}):
        group = [o for o in obs if o.device_key == key]
        cpu = hardware.lookup(host_of.get(key, ""))
        stated_gpu = any(o.scenario.workload.gpu_layers for o in group)
        if group[0].scenario.device.device_class != "discrete_gpu" or cpu is None or stated_gpu:
            # not where the submission states that its runs put the layers on the GPU
            out += group
            continue
        as_cpu = [replace(o, scenario=replace(o.scenario, device=replace(
            cpu, host_memory_gb=o.scenario.device.host_memory_gb))) for o in group]
        gpu_err, cpu_err = _median_log_ratio(group), _median_log_ratio(as_cpu)
        if gpu_err < math.log(1 / 1.5) and abs(cpu_err) < 0.5 * abs(gpu_err):
            out += as_cpu
            moved.append(key)
        else:
            out += group
    return out, moved


def load_all(directory: Path | None = None) -> tuple[list[Observation], Counter[str]]:
    llmfit, dropped = load_llmfit(directory)
    decode = [o for o in llmfit if o.metric == "decode_tok_s"]
    relabelled, moved = relabel_unused_gpus(decode, _read(LLMFIT_FILE, directory))
    for key in moved:
        dropped[f"relabelled to host CPU (GPU evidently unused): {key}"] = sum(
            o.device_key == key for o in decode)
    fits = [Observation(o.scenario, "fits", 1.0, o.device_key, o.model_key, "llmfit")
            for o in relabelled]
    own: list[Observation] = []
    own_paths = [p for p in (Path(directory or data_dir()) / n for n in OWN_FILES) if p.is_file()]
    if own_paths:
        own, own_dropped = load_own(own_paths)
        dropped.update({f"tightfit data: {k}": v for k, v in own_dropped.items()})
    return load_apple(directory) + relabelled + fits + load_design(directory) + own, dropped


# --- tightfit's own measurements (the bench's JSONL dataset) -----------------------------------

_BACKEND_ENGINE = {"tightfit": "tightfit", "tightfit-http": "tightfit", "tightfit-serve": "tightfit",
                   "hf": "hf-transformers", "llamacpp": "llama.cpp", "llama.cpp": "llama.cpp",
                   "llama-server": "llama.cpp", "tightfit-lite": "tightfit-lite",
                   "tightfit-lite-serve": "tightfit-lite"}


# llama.cpp's flash attention as a backend ran it: llama-cpp-python's `Llama(flash_attn=False)`
# turns it off; llama-server keeps its tools' default ("auto": on where the backend has it)
_BACKEND_FLASH_ATTN = {"llamacpp": False}


def _own_quant(weight_format: str, file_format: str | None) -> str:
    """The bench's weight-format names -> the predictor's; "native" = as stored in the GGUF."""
    if weight_format == "native" and file_format and file_format.startswith("gguf:"):
        return file_format.split(":", 1)[1].lower()
    return {"fp32": "f32"}.get(weight_format, weight_format)


# Machines whose rows predate the kernel probe (schema < 5): the block-format kernel's rate as a
# share of the fp32 GEMM probe at one thread, from component measurements of the same probe
# code (tightfit.bench.fingerprint.measure_kernel_gflops; lite.c unchanged since 2026-12-04 19:33). The
# share holds while a VM's speed moves: on the Xeon, GEMM probes of 86-141 GFLOP/s within an
# hour came with kernel / GEMM 0.22-0.25.
#   AMD EPYC VM 77bd40e2fee6: tf_linear Q4_0 4096 x 4096, one token, one thread, best of 5,
#     52.1-52.2 GFLOP/s (2026-12-05 09:26 UTC, two rounds) over its rows' one-thread GEMM
#     probe (median 101.8): 0.51 (hardware.KERNEL_SHARE_OF_GEMM).
#   Intel Xeon VM e52b7ed21aa3: `fingerprint.probe` at one thread, 8 rounds alternating with
#     two threads (2026-12-06 10:31 UTC): kernel 20.9 / GEMM 87.1, share median 0.238 (range
#     0.229-0.252); two threads 0.253 (0.199-0.294).
KERNEL_SHARE_MEASURED = {"77bd40e2fee6": 0.51, "e52b7ed21aa3": 0.24}
# Machines whose rows predate the copy probe on the run's threads (schema < 6): a copy split
# over that many threads as a multiple of a one-thread copy, by (machine, threads).
#   Intel Xeon VM e52b7ed21aa3, two threads: `fingerprint.measure_bandwidth_gbps` with 1 and 2
#     threads, 8 rounds alternating (2026-12-06 11:17 UTC): 20.7 and 38.0 GB/s, median 1.84
#     (1.74-1.94).
#   AMD EPYC VM 77bd40e2fee6, two threads: the bench's two copy probes around each of 51
#     two-thread runs (data/measurements/repeat-epyc.jsonl, 2026-12-06 21:00-21:18 UTC), median
#     1.06 (0.94-1.38). Until then its one-thread copy stood for both (its memory-bound rows,
#     tightfit fp32 and HF, ran no faster at two threads than at one); with 1.06, held out by
#     device, own decode 10.7% -> 10.5% (EPYC x2 11.5% -> 11.3%), by machine 13.2% -> 12.9%,
#     prefill and TTFT unchanged (docs/predictor.md, "The same machine on another day").
COPY_THREADS_MEASURED = {("e52b7ed21aa3", 2): 1.84, ("77bd40e2fee6", 2): 1.06}
# Machines whose rows predate the streaming probe (schema < 7): the kernel's streaming rate as a
# share of a copy on the same threads (fingerprint.measure_kernel_stream_gbps over
# measure_bandwidth_gbps), the same at one thread and at two where both were measured.
#   AMD EPYC VM 77bd40e2fee6: tf_linear Q8_0 8192 x 8192, two threads, best of 15, 25 GB/s
#     against its 25.6 GB/s copy (2026-12-04, docs/performance.md): 0.98
#     (hardware.KERNEL_STREAM_SHARE_OF_COPY); one thread not measured.
#   Intel Xeon VM e52b7ed21aa3: 8 rounds alternating 1 and 2 threads (2026-12-06 13:25 UTC):
#     6.1-7.7 GB/s against copies of 17.9-22.1 at one thread, 11.5-15.2 against 35.9-44.2 at
#     two; share median 0.342 at both (0.29-0.38). Again at 13:33 UTC: 0.337 and 0.334.
STREAM_SHARE_MEASURED = {"77bd40e2fee6": 0.98, "e52b7ed21aa3": 0.34}


def own_device(hw: Any, probes: dict[str, float] | None = None) -> DeviceSpec:
    """This machine as the bench measured it, the threads the run used as its cores. Compute:
    rows from schema 4 on carry a GEMM probe taken around the run on its own threads, used as
    it is; older rows have the cached fingerprint only, whose matmul rate is for all logical
    CPUs, so a run on fewer threads gets its share. Bandwidth: the cached fingerprint's copy
    rate (one thread), read as its rated equivalent (hardware.measured_cpu), and what a copy
    split over the run's threads gains on that machine (`threads_bandwidth_gain`: the row's two
    copy probes, schema 6 on; else COPY_THREADS_MEASURED; else 1), which the memory terms use
    and the residual's features do not. The rows' copy probe itself (three single-threaded
    copies) scatters 20-28 GB/s within minutes; held out by thread count, describing decode by
    it made own-data decode worse (10.9% vs 9.1% MAPE), so only the ratio of the two probes,
    taken together, is used. Kernel rate:
    the row's probe (schema 5 on), else its machine's measured share of the GEMM rate
    (KERNEL_SHARE_MEASURED), else none (the priors' share). The kernel's streaming rate, as a
    share of the copy on the run's threads: the row's two probes (schema 7 on), else
    STREAM_SHARE_MEASURED, else none. `probes` (sitting_probes: the medians of the copy,
    kernel and streaming probes over the run's sitting) stand in for the row's own where given;
    the GEMM probe stays the row's."""
    if probes:
        hw = SimpleNamespace(**{**vars(hw), **probes})
    cores = hw.threads_used or hw.cpu_cores_physical or 1
    every = hw.cpu_threads_logical or cores
    gflops = hw.probe_matmul_gflops or (
        hw.matmul_gflops * min(1.0, cores / every) if hw.matmul_gflops else 50.0 * cores)
    kernel = getattr(hw, "probe_kernel_gflops", None)
    if kernel is None and hw.machine_id in KERNEL_SHARE_MEASURED:
        kernel = round(gflops * KERNEL_SHARE_MEASURED[hw.machine_id], 1)
    one, spread = hw.probe_bandwidth_gbps, getattr(hw, "probe_bandwidth_threads_gbps", None)
    threads_x = max(1.0, min(float(cores), spread / one)) if one and spread else \
        COPY_THREADS_MEASURED.get((hw.machine_id, cores), 1.0)
    stream = getattr(hw, "probe_kernel_stream_gbps", None)
    stream_share = round(stream / spread, 3) if stream and spread else \
        STREAM_SHARE_MEASURED.get(hw.machine_id)
    return hardware.measured_cpu(f"{hw.cpu_model} x{cores} ({hw.machine_id})",
                                 hw.memory_total_gib or 16.0, hw.memory_bandwidth_gbps or 20.0,
                                 gflops, cores, kernel, round(threads_x, 3),
                                 stream_share)


# The bench's per-run probes (schema 5-7: around each run, on its threads) that describe a
# machine by their median over the run's sitting (`sitting_probes`). A single run's probes
# scatter: the same 2-core EPYC VM's 51 two-thread runs of one sitting (2026-12-06,
# data/measurements/repeat-epyc.jsonl) read a split copy of 25.4-37.8 GB/s and the kernel
# streaming 20.7-52.6 GB/s, while their decode rates stayed within a few percent of their
# neighbours'. Scored by the shipped model (`tightfit predictor score`, one-off comparison,
# 2026-12-06 21:40 UTC), the four files of schema 5-7 rows, 178 runs on two machines, read
# decode at 13.4% MAPE described by each run's own probes and 12.1% by their sitting's
# medians (repeat-epyc 13.3% -> 11.3%, max 53.7% -> 28.3%; thread-gain-xeon 28.1% -> 24.0%;
# kernel-probe-xeon 9.0% -> 8.5%, its max 28.4% -> 44.5%; stream-probe-xeon 10.1% -> 12.2%).
# The GEMM probe stays the run's own: taking its sitting median too, the fit's rows (schema 4,
# whose only probe it is) went from 16.0% to 16.6% prefill MAPE held out by device and TTFT
# from 21.4% to 25.1% (`tightfit predictor evaluate`, 21:20-21:34 UTC; decode 10.6% either
# way): a prompt is compute-bound, and the GEMM around the run follows the machine's state.
SITTING_PROBES = ("probe_bandwidth_gbps", "probe_kernel_gflops",
                  "probe_bandwidth_threads_gbps", "probe_kernel_stream_gbps")


def _sitting(m: Any) -> tuple[Any, ...]:
    """One machine at one thread count within one sweep on one UTC day."""
    return (m.hardware.machine_id, m.hardware.threads_used, m.sweep, str(m.created_at)[:10])


def sitting_probes(measurements: list[Any]) -> dict[tuple[Any, ...], dict[str, float]]:
    """The median of each of SITTING_PROBES over a sitting's (`_sitting`) uncontended runs, as
    `tightfit calibrate` takes the median of its probes."""
    got: dict[tuple[Any, ...], dict[str, list[float]]] = {}
    for m in measurements:
        if m.status != "ok" or m.contended:
            continue
        d = got.setdefault(_sitting(m), {})
        for f in SITTING_PROBES:
            v = getattr(m.hardware, f, None)
            if v:
                d.setdefault(f, []).append(float(v))
    return {k: {f: statistics.median(v) for f, v in d.items()} for k, d in got.items()}


def _batched_workload(m: Any) -> int | None:
    """The batch a concurrent run decoded at, or None where the run is not one the batch model
    describes: a closed loop (each finished request replaced at once) of several requests,
    generating the same number of tokens each (`gen_tokens_max` = mean), so that the requests
    of a round finish in one step and the next round's prompts run while none decodes
    (`bench.metrics`: the decode rate is over the union of the requests' decoding intervals).
    The batch is the requests in flight (one: the same harness's single stream), capped by the
    engine's sequence slots."""
    w, c, r = m.workload, m.config, m.results
    inflight = w.concurrency or 1
    if w.arrival != "closed" or w.num_requests < max(inflight, 2) \
            or not w.gen_tokens_max or w.gen_tokens_mean != w.gen_tokens_max \
            or r.output_tokens_total != w.num_requests * w.gen_tokens_max:
        return None
    return min(inflight, c.max_num_seqs or inflight)


def load_own(paths: list[str | Path], batched: bool = False
             ) -> tuple[list[Observation], Counter[str]]:
    """Single-stream runs of tightfit's dataset -> observations (decode tok/s, prefill tok/s,
    TTFT, peak memory). Rules, each counted: failed runs, runs with more than one stream (the
    predictor's contract is batch 1 here), runs the harness flagged as contended, and backends
    the predictor has no engine for. Repeats of one configuration (a sweep's `repeats`) become
    one observation per metric, the median of the repeats (counted as merged).

    `batched`: the closed-loop concurrent runs instead (`_batched_workload`), observations of
    the aggregate decode rate and the peak memory, with the batch the engine ran (and a llama.cpp
    server's context, `extra.ctx`, held for its slots); single-stream runs are then the ones
    dropped. For scoring the batch model (`report.score`), not for the fit."""
    from tightfit.data import read_measurements

    dropped: Counter[str] = Counter()
    groups: dict[tuple[Any, ...], tuple[Scenario, str, str, str, list[dict[str, float | None]]]] = {}
    measurements = read_measurements([str(p) for p in paths]).measurements
    sittings = sitting_probes(measurements)
    for m in measurements:
        w, c, r, md = m.workload, m.config, m.results, m.model
        if m.status != "ok" or r is None:
            dropped["failed run"] += 1
            continue
        single = (w.concurrency or 1) == 1 and w.num_requests == 1 and w.scenario == "decode"
        batch = _batched_workload(m) if batched else None
        if batched and batch is None:
            dropped["not a closed-loop batch of equal generations" if not single
                    else "one stream (scored without --batched)"] += 1
            continue
        if not batched and not single:
            dropped["more than one request or stream"] += 1
            continue
        if m.contended:
            dropped["contended machine (load from other processes)"] += 1
            continue
        engine = _BACKEND_ENGINE.get(c.backend)
        if engine is None:
            dropped[f"backend {c.backend}"] += 1
            continue
        model = _with_known_attention(architectures.ModelSpec(
            md.name, md.params_b, md.params_b, md.n_layers, md.hidden_size, md.n_heads,
            md.n_kv_heads, md.vocab_size, md.intermediate_size, md.head_dim))
        quant = _own_quant(md.weight_format, md.file_format)
        bpw = stored_bits(quant, model)
        prompt = int(w.prompt_tokens_mean)
        slots = None
        if batch is None:
            gen = max(1, int(r.output_tokens_total or 1))
            context = prompt + gen
        else:
            gen = int(w.gen_tokens_mean)
            # a llama.cpp server holds its whole context (`-c`) for all its slots (`-np`) from
            # the start, however many sequences are in flight: slots x context = its cells
            cells = int((c.extra or {}).get("ctx") or 0)
            slots = max(c.max_num_seqs or batch, batch) if cells else None
            context = max(prompt + gen, cells // (slots or batch))
        wl = Workload(prompt, gen, batch or 1, context,
                      flash_attn=_BACKEND_FLASH_ATTN.get(c.backend), slots=slots)
        device = own_device(m.hardware, sittings.get(_sitting(m)))
        sc = Scenario(f"tightfit-{m.id}", device, model, quant, bpw, engine, wl)
        key = hardware.normalise_name(device.name)
        machine = hardware.normalise_name(f"{m.hardware.cpu_model} ({m.hardware.machine_id})")
        values = {"decode_tok_s": r.decode_tok_s, "prefill_tok_s": r.prefill_tok_s,
                  "ttft_s": r.ttft_s_p50,
                  "peak_memory_gb": None if r.peak_rss_mib is None else r.peak_rss_mib / 1024}
        if prompt < 128:  # prefill rate of a short prompt is mostly fixed overhead
            values["prefill_tok_s"] = None
        if batch is not None:  # the aggregate decode rate and the peak: the prompts overlap
            values = {"decode_tok_s": r.decode_tok_s, "peak_memory_gb": values["peak_memory_gb"]}
        config = (key, c.backend, md.name, quant, c.kv_dtype, prompt, w.gen_tokens_mean,
                  w.scenario, batch)
        if config in groups:
            groups[config][-1].append(values)
            dropped["repeat merged into its configuration's median"] += 1
        else:
            groups[config] = (sc, key, model_key(md.name), machine, [values])
    out: list[Observation] = []
    for sc, key, mkey, machine, repeats in groups.values():
        for metric in repeats[0]:
            got = [v[metric] for v in repeats if v[metric] is not None and v[metric] > 0]
            if got:
                out.append(Observation(sc, metric, float(statistics.median(got)), key, mkey,
                                       "tightfit", machine_key=machine))
    return out, dropped
