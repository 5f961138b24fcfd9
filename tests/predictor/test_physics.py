"""The analytic base and memory model: directions and ratios that physics fixes."""
from __future__ import annotations

from dataclasses import replace

import pytest

from tightfit.predictor import engines, features, hardware, memory, roofline
from tightfit.predictor.scenario import parse_row


def _analyse(row):
    return roofline.analyse(parse_row(row))


def test_decode_time_tracks_weight_bytes(row) -> None:
    row["quant"] = "F16"
    row["hardware"]["memory_gb"] = 24
    f16 = _analyse(row).decode
    row["quant"] = "Q4_0"
    q4 = _analyse(row).decode
    assert f16.mem_s / q4.mem_s == pytest.approx(16 / 4.5, rel=0.1)


def test_shares_sum_to_one_and_name_the_bottleneck(row) -> None:
    b = _analyse(row)
    for phase in (b.decode, b.prefill):
        assert sum(phase.shares().values()) == pytest.approx(1.0)
    assert max(b.decode.shares(), key=b.decode.shares().get) == "memory_bandwidth"
    assert max(b.prefill.shares(), key=b.prefill.shares().get) == "compute"


def test_too_big_for_the_gpu_offloads_and_slows_down(row) -> None:
    fits = _analyse(row)
    row["quant"] = "F16"
    row["hardware"]["host_memory_gb"] = 64
    off = _analyse(row)
    assert fits.memory.fits_on_device and not off.memory.fits_on_device
    assert off.memory.fits is True and 0 < off.memory.device_fraction < 1
    assert off.decode.shares()["offload_transfer"] > 0.5
    assert off.decode.total > 5 * fits.decode.total


def test_layers_split_over_two_devices_double_capacity_not_speed(row) -> None:
    row["quant"] = "Q8_0"
    one = _analyse(row)
    row["hardware"]["device_count"] = 2
    two = _analyse(row)
    assert not one.memory.fits_on_device and two.memory.fits_on_device
    assert two.memory.capacity_bytes == pytest.approx(2 * one.memory.capacity_bytes)
    assert two.decode.offload_s == 0 and two.decode.mem_s >= one.decode.mem_s * one.memory.device_fraction


def test_kv_cache_grows_with_context_and_shrinks_with_dtype(row) -> None:
    small = _analyse(row).memory.kv_bytes
    row["workload"]["context_tokens"] = 8192
    assert _analyse(row).memory.kv_bytes == pytest.approx(4 * small)
    row["workload"]["kv_dtype"] = "q8_0"
    assert _analyse(row).memory.kv_bytes == pytest.approx(4 * small * 1.0625 / 2)


def test_llama3_8b_kv_bytes_per_token(row) -> None:
    # 2 (K,V) x 32 layers x 8 kv heads x 128 dims x 2 bytes
    s = parse_row(row)
    prof = engines.profile(s.engine, s.device.device_class)
    assert memory.kv_bytes_per_token(s, prof) == 2 * 32 * 8 * 128 * 2
    # the torch-based engines keep K/V in their compute dtype unless told (fp16 on a GPU)
    tf = parse_row({**row, "engine": "tightfit"})
    assert memory.kv_bytes_per_token(tf, engines.profile("tightfit", "discrete_gpu")) == \
        2 * 32 * 8 * 128 * 2
    cpu = parse_row({**row, "engine": "tightfit", "hardware": {"name": "x", "kind": "cpu",
                                                              "memory_gb": 32,
                                                              "memory_bandwidth_gbps": 50,
                                                              "fp16_tflops": 1, "cpu_cores": 8}})
    assert memory.kv_bytes_per_token(cpu, engines.profile("tightfit", "cpu")) == \
        2 * 32 * 8 * 128 * 4


def test_hf_transformers_holds_dequantised_weights(row) -> None:
    row["engine"] = "hf-transformers"
    row["hardware"]["memory_gb"] = 40
    hf = _analyse(row).memory.weights_bytes
    assert hf == pytest.approx(8.03e9 * 2)


def test_hf_transformers_keeps_bitsandbytes_gptq_awq_weights_quantised(row) -> None:
    """A GGUF file HF dequantises; load_in_4bit / 8bit, GPTQ and AWQ it holds as stored, but
    for the embedding and the (untied) head, which stay in the compute dtype."""
    row["engine"] = "hf-transformers"
    row["hardware"]["memory_gb"] = 12
    embed = 128256 * 4096
    gguf = _analyse(row)  # Q4_K_M: dequantised to fp16, does not fit a 12 GiB card
    row["quant"] = "nf4"
    nf4 = _analyse(row)
    row["quant"] = "F16"
    f16 = _analyse(row)
    expected = ((8.03e9 - 2 * embed) * 4.5 + 2 * embed * 16) / 8
    assert nf4.memory.weights_bytes == pytest.approx(expected)
    assert gguf.memory.weights_bytes == pytest.approx(8.03e9 * 2) == f16.memory.weights_bytes
    assert nf4.memory.fits_on_device and not f16.memory.fits_on_device
    # the loader holds one float tensor at a time, not a float copy of the model
    assert nf4.memory.load_transient_bytes == pytest.approx(embed * 2)
    # speed as with float weights (not measured here): not faster than fp16 where it fits
    row["hardware"]["memory_gb"] = 40
    assert nf4.decode.mem_s == pytest.approx(_analyse(row).decode.mem_s)
    s = parse_row({**row, "quant": "nf4"})
    assert s.widen == pytest.approx(1.5) and any("bitsandbytes" in n for n in s.notes)
    assert parse_row({**row, "quant": "Q4_K_M"}).widen == 1.0


def test_brief_lambda_factors() -> None:
    assert features.lambda_mem(32) == 1.0 and features.lambda_mem(64) == pytest.approx(0.5)
    assert features.lambda_mem(10) == 1.0
    assert features.lambda_comp(2, 8) == pytest.approx(0.2449, abs=1e-4)
    assert features.lambda_quant(4.5) == pytest.approx(4.5 / 16) and features.lambda_quant(32) == 1.0


def test_apple_working_set_is_a_soft_cap(row) -> None:
    """Past ~75% of RAM an Apple GPU runs outside its recommended working set (fits, not on
    device); past what RAM holds beside the OS it does not fit."""
    row["hardware"] = {"name": "M4 Pro", "kind": "apple", "memory_gb": 24,
                       "memory_bandwidth_gbps": 273, "fp16_tflops": 17}
    row["model"] = {"name": "gemma-3-27b-it"}
    # 24k: its 52 windowed layers hold 1,536 positions, so 4096 would stay under 18 GiB
    row["workload"]["context_tokens"] = 24576
    b = _analyse(row)
    assert 0.75 * 24 < b.memory.peak_bytes / 2**30 < 0.9 * 24
    assert b.memory.fits and not b.memory.fits_on_device
    row["hardware"]["memory_gb"] = 16
    assert _analyse(row).memory.fits is False


def test_lite_decode_slows_with_context_as_its_step_was_timed() -> None:
    """The lite runtime's decode step timed alone, one thread: 7.4-7.5 ms at 16 positions,
    11.7-12.1 ms at 1,536 (0.62-0.64x the rate). The base, with its attention at 0.65 of the
    matrix rate (engines.attn_rel), must slow by more than 30%; at the matrix rate it said
    0.71x."""
    from tightfit.predictor.roofline import analyse
    from tightfit.predictor.scenario import parse_row

    def rate(prompt: int) -> float:
        s = parse_row({"id": "x", "hardware": {"name": "cpu", "kind": "cpu", "memory_gb": 23.5,
                                               "memory_bandwidth_gbps": 25.6,
                                               "fp16_tflops": 0.1, "cpu_cores": 1},
                       "model": "SmolLM2-135M", "quant": "Q4_1", "engine": "lite",
                       "workload": {"prompt_tokens": prompt, "gen_tokens": 128}})
        return 1 / analyse(s).decode.total

    assert rate(1536) < 0.7 * rate(16)


def test_llama_cpp_cpu_attention_costs_the_same_whatever_the_weights_format() -> None:
    """llama-bench on the default model, one thread: 1,536 positions added 5.8 ms a token as
    Q4_0 and 4.5 ms as Q4_1 with flash attention off, 8.9 and 10.4 ms with it on (the tools'
    default), although Q4_0's repacked weights decode 1.3x faster (the K/V are f16 either
    way). The base adds 5.8-5.9 ms to both off and 9.8 on; before, with attention at the
    matrix rate and Q4_0's factor on it, 3.1 ms to Q4_0 and 3.8 ms to Q4_1."""
    def added_ms(quant: str, flash: bool | None) -> float:
        def step(prompt: int) -> float:
            s = parse_row({"id": "x", "hardware": {"name": "cpu", "kind": "cpu",
                                                   "memory_gb": 23.5,
                                                   "memory_bandwidth_gbps": 27.0,
                                                   "fp16_tflops": 0.1, "cpu_cores": 1},
                           "model": "SmolLM2-135M", "quant": quant, "engine": "llama.cpp",
                           "workload": {"prompt_tokens": prompt, "gen_tokens": 64,
                                        "flash_attn": flash}})
            return roofline.analyse(s).decode.total * 1e3
        return step(1536) - step(0)

    off = added_ms("Q4_0", False), added_ms("Q4_1", False)
    on = added_ms("Q4_0", None), added_ms("Q4_1", "on")
    assert off[0] == pytest.approx(off[1], rel=0.05) and on[0] == pytest.approx(on[1], rel=0.05)
    assert 4.5 < off[1] < 7.0 and 8.0 < on[1] < 11.0


def test_mxfp4_files_keep_all_but_the_experts_at_q8_0(row) -> None:
    # llama.cpp's gpt-oss-20b MXFP4 GGUF is 12.1 GB: 19.11e9 expert weights at 4.25 bits, the
    # other 1.79e9 (attention, embeddings, router) at Q8_0; all at 4.25 would be 11.1 GB
    row["model"] = {"name": "gpt-oss-20b"}
    row["quant"] = "MXFP4"
    row["hardware"]["memory_gb"] = 24
    b = _analyse(row)
    assert b.memory.weights_bytes == pytest.approx(12.05e9, rel=0.01)
    row["model"] = {"name": "some-moe-21b-a4b", "params_b": 20.9, "active_params_b": 3.6}
    assert _analyse(row).memory.weights_bytes < 11.3e9  # expert count unknown: all at 4.25 bits


def test_llama_cpp_leaves_a_gib_free_on_each_gpu(row) -> None:
    # --fit places layers so that 1024 MiB stay free per card: a model whose peak is within a
    # GiB of the card's size is split, and the free GiB is counted per card
    row["hardware"]["memory_gb"] = 8
    peak = _analyse(row).memory.peak_bytes
    row["hardware"]["memory_gb"] = (peak + 0.5 * memory.GB) / memory.GB  # 0.5 GiB to spare
    near = _analyse(row).memory
    assert not near.fits_on_device and 0.85 < near.device_fraction < 1
    assert near.capacity_bytes == pytest.approx(row["hardware"]["memory_gb"] * memory.GB - memory.GB)
    row["hardware"]["device_count"] = 2
    assert _analyse(row).memory.capacity_bytes == pytest.approx(
        2 * row["hardware"]["memory_gb"] * memory.GB - 2 * memory.GB)
    row["hardware"]["device_count"] = 1
    row["engine"] = "hf-transformers"  # no such margin
    row["quant"] = "F16"
    row["hardware"]["memory_gb"] = 40
    hf = _analyse(row).memory
    assert hf.capacity_bytes == pytest.approx(40 * memory.GB)


def test_llama_cpp_streams_an_moe_s_active_weights_at_its_moe_share(row) -> None:
    # an MoE's active weights take 1 / moe_bw_rel longer per byte than a dense model's; the
    # bytes it reports per step (and the KV part of its memory time) are unchanged
    row["hardware"]["memory_gb"] = 48
    row["model"] = {"name": "some-moe-30b-a3b", "params_b": 30.0, "active_params_b": 3.0}

    def split(r):
        s = parse_row(r)
        prof = engines.profile(s.engine, s.device.device_class, s.quant)
        b = roofline.analyse(s)
        weights = memory.active_weight_bytes(s, prof)
        per_byte = 1 / (s.device.bandwidth_gbps * 1e9 * prof.bw_eff)
        return b, weights, b.bytes_per_step - weights, per_byte, prof

    b, weights, kv, per_byte, prof = split(row)
    assert 0 < prof.moe_bw_rel < 1 and weights > 0 and kv > 0
    assert b.decode.mem_s == pytest.approx((weights / prof.moe_bw_rel + kv) * per_byte)
    row["model"] = {"name": "some-dense-3b", "params_b": 3.0}
    b, weights, kv, per_byte, _ = split(row)
    assert b.decode.mem_s == pytest.approx((weights + kv) * per_byte)
    row["engine"] = "hf-transformers"  # no MoE prior of its own
    row["hardware"]["memory_gb"] = 128  # its float weights on the card whole
    row["model"] = {"name": "some-moe-30b-a3b", "params_b": 30.0, "active_params_b": 3.0}
    b, weights, kv, per_byte, prof = split(row)
    assert prof.moe_bw_rel == 1 and b.decode.mem_s == pytest.approx((weights + kv) * per_byte)


def test_ggml_f16_decode_on_a_cpu_computes_slower_so_a_second_thread_helps_more() -> None:
    """F16 weights widened to f32 run at ~0.65 of the block formats' one-token rate (tf_linear
    with the matrix in cache); llama.cpp's F16 rows gained 1.27x from a second thread and the
    lite runtime's 1.44x, where a memory-bound base said 1.09-1.10x."""
    def gain(engine: str, quant: str) -> float:
        def rate(threads: int) -> float:
            s = parse_row({"id": "x", "hardware": {"name": "cpu", "kind": "cpu", "memory_gb": 23.5,
                                                   "memory_bandwidth_gbps": 38.0,
                                                   "fp16_tflops": 0.1 * threads,
                                                   "cpu_cores": threads},
                           "model": "SmolLM2-135M", "quant": quant, "engine": engine,
                           "workload": {"prompt_tokens": 16, "gen_tokens": 128}})
            return 1 / roofline.analyse(s).decode.total
        return rate(2) / rate(1)

    for engine in ("llama.cpp", "lite"):
        f16 = engines.profile(engines.canonical_engine(engine), "cpu", "f16")
        q8 = engines.profile(engines.canonical_engine(engine), "cpu", "q8_0")
        assert f16.decode_comp_eff == pytest.approx(0.65 * q8.decode_comp_eff)
        assert gain(engine, "F16") > 1.15  # 1.07-1.10 before
    assert engines.profile("llama.cpp", "apple", "f16").decode_comp_eff == \
        engines.profile("llama.cpp", "apple", "q8_0").decode_comp_eff  # CPUs only
    assert engines.profile("tightfit", "cpu", "f16").decode_comp_eff == \
        engines.profile("tightfit", "cpu", "q8_0").decode_comp_eff  # torch's own kernels


def test_llama_cpp_float_decode_on_a_cpu_overlaps_reads_and_arithmetic_more() -> None:
    """llama.cpp's F16 step on a CPU is near the p = 3 norm of its reads and arithmetic timed
    alone, its Q8_0 step near their sum: on the base's effective terms F16 takes a larger p
    (roofline.FLOAT_OVERLAP_P), the block formats and every other engine and device the
    default."""
    def phase(quant: str, engine: str = "llama.cpp", kind: str = "cpu") -> roofline.Phase:
        hw = {"name": "x", "kind": kind, "memory_gb": 23.5, "memory_bandwidth_gbps": 38.0,
              "fp16_tflops": 0.1, "cpu_cores": 1}
        return roofline.analyse(parse_row({"id": "x", "hardware": hw, "model": "SmolLM2-135M",
                                           "quant": quant, "engine": engine,
                                           "workload": {"prompt_tokens": 16,
                                                        "gen_tokens": 64}})).decode

    f16, q8 = phase("F16"), phase("Q8_0")
    assert f16.p == roofline.FLOAT_OVERLAP_P > 3 and q8.p == 3
    assert max(f16.mem_s, f16.comp_s) < f16.roof_s < (f16.mem_s ** 3 + f16.comp_s ** 3) ** (1 / 3)
    assert phase("F16", engine="lite").p == 3 and phase("F16", kind="gpu").p == 3


def test_llama_cpp_cpu_barriers_cost_more_with_more_threads() -> None:
    """ggml's CPU threads meet at a barrier after every graph node, and a barrier costs more the
    more threads spin on it: a step's overhead grows with the threads, which matters for a small
    model on a many-core CPU and hardly for a large one (llama.cpp's own test-barrier figures:
    engines.py)."""
    def analyse(model: str, threads: int) -> roofline.Breakdown:
        return roofline.analyse(parse_row({
            "id": "x", "hardware": {"name": "cpu", "kind": "cpu", "memory_gb": 128,
                                    "memory_bandwidth_gbps": 77.0,
                                    "fp16_tflops": 0.077 * threads, "cpu_cores": threads},
            "model": model, "quant": "Q4_K_M", "engine": "llama.cpp",
            "workload": {"prompt_tokens": 512, "gen_tokens": 128}}))

    prof = engines.profile("llama.cpp", "cpu", "q4_k_m")
    small1, small14 = analyse("SmolLM2-135M", 1), analyse("SmolLM2-135M", 14)
    assert small14.decode.overhead_s - small1.decode.overhead_s == pytest.approx(
        13 * 30 * prof.sync_s_per_thread_layer)  # 30 layers
    assert small14.decode.shares()["overhead"] > 0.4 > small1.decode.shares()["overhead"]
    assert small14.prefill.overhead_s == small1.prefill.overhead_s  # decode only
    large14 = analyse("Meta-Llama-3-8B", 14).decode
    assert large14.shares()["overhead"] < 0.1
    # the engines whose thread pools were measured at 1-2 threads only, and GPUs, have none
    for engine, cls in (("tightfit-lite", "cpu"), ("tightfit", "cpu"), ("llama.cpp", "discrete_gpu")):
        assert engines.profile(engine, cls).sync_s_per_thread_layer == 0


def test_the_head_runs_once_a_prompt_and_an_untied_embedding_is_only_looked_up(row) -> None:
    """Prefill multiplies the output head for the last position only (every engine here asks
    for the last token's logits), and an untied token embedding is read one row a token: its
    bytes are not streamed in decode and its parameters are no FLOPs in either phase."""
    row["workload"] = {"prompt_tokens": 512, "gen_tokens": 1, "batch": 1, "context_tokens": 1024}
    row["model"] = {"name": "gemma-3-270m"}  # tied: the embedding (168M) is the head, 63%
    s = parse_row(row)
    b = roofline.analyse(s)
    head = memory.embedding_params(s)
    body = s.model.params_b * 1e9 - head
    attn = 2.0 * s.model.n_layers * 512 ** 2 * s.model.n_heads * s.model.head_dim
    assert b.prefill_flops == pytest.approx(2 * body * 512 + 2 * head + attn, rel=1e-6)
    assert b.prefill_flops < 0.5 * 2 * s.model.params_b * 1e9 * 512  # head x 512 would double it
    assert memory.lookup_only_params(s) == 0.0  # tied: streamed as the head in decode
    assert b.bytes_per_step > memory.weight_bytes(s, engines.profile(s.engine, s.device.device_class,
                                                                      s.quant))

    row["model"] = {"name": "Meta-Llama-3-8B"}  # untied: 128256 x 4096 looked up, 525M
    s = parse_row(row)
    prof = engines.profile(s.engine, s.device.device_class, s.quant)
    lookup = memory.lookup_only_bytes(s, prof)
    assert memory.lookup_only_params(s) == pytest.approx(128256 * 4096)
    assert lookup == pytest.approx(128256 * 4096 * 4.5 / 8, rel=0.01)  # Q4_K_M's base type, Q4_K
    dec = roofline.analyse(s)
    kv = dec.bytes_per_step - memory.active_weight_bytes(s, prof)
    assert memory.active_weight_bytes(s, prof) == pytest.approx(
        memory.weight_bytes(s, prof) - lookup)
    ctx = 512 + 0.5  # the decode step's mean context
    attn = 4.0 * s.model.n_layers * ctx * s.model.n_heads * s.model.head_dim
    assert kv > 0 and dec.flops_per_step == pytest.approx(
        2 * (s.model.params_b * 1e9 - 128256 * 4096) + attn, rel=1e-6)


def test_per_layer_embeddings_are_looked_up_and_gemma_ties_its_head(row) -> None:
    """Gemma 4 E4B's per-layer table (262144 x 42 x 256 = 2.82B of its 8B) is read one row a
    token (llama.cpp: ggml_get_rows), so decode streams neither it nor counts it as FLOPs; it
    still counts in the weights held. Every Gemma ties its embedding to the head, which is
    streamed in decode (the size guess alone called Gemma 3 12B / 27B untied)."""
    from tightfit.predictor import architectures

    row["workload"] = {"prompt_tokens": 512, "gen_tokens": 1, "batch": 1, "context_tokens": 1024}
    row["model"] = {"name": "gemma-4-E4B-it-Q4_K_M.gguf"}
    s = parse_row(row)
    prof = engines.profile(s.engine, s.device.device_class, s.quant)
    assert s.model.per_layer_embed_params_b == pytest.approx(262144 * 42 * 256 / 1e9, rel=0.01)
    assert s.model.ties_embeddings
    assert memory.lookup_only_params(s) == pytest.approx(2.82e9)
    ple_bytes = 2.82e9 * s.bits_per_weight / 8
    assert memory.lookup_only_bytes(s, prof) == pytest.approx(ple_bytes)
    assert memory.active_weight_bytes(s, prof) == pytest.approx(
        memory.weight_bytes(s, prof) - ple_bytes)
    assert memory.held_weight_bytes(s, prof) >= memory.weight_bytes(s, prof)  # held all the same
    dec = roofline.analyse(s)
    attn = 4.0 * s.model.n_layers * (512 + 0.5) * s.model.n_heads * s.model.head_dim
    assert dec.flops_per_step == pytest.approx(2 * (8.0e9 - 2.82e9) + attn, rel=1e-6)
    # an HF engine that dequantises holds the table in the compute dtype: so does the lookup
    hf = dict(row, engine="hf-transformers")
    s_hf = parse_row(hf)
    prof_hf = engines.profile(s_hf.engine, s_hf.device.device_class, s_hf.quant)
    assert prof_hf.dequantises
    assert memory.lookup_only_bytes(s_hf, prof_hf) == pytest.approx(
        2.82e9 * memory.compute_dtype_bytes(s_hf))
    # given explicitly, as with any other model field; absurd values are a row error
    row["model"] = {"name": "my-model", "params_b": 6.0, "per_layer_embed_params_b": 2.0}
    assert memory.lookup_only_params(parse_row(row)) >= 2.0e9
    from tightfit.predictor.scenario import RowError
    row["model"]["per_layer_embed_params_b"] = -1
    with pytest.raises(RowError, match="model.per_layer_embed_params_b"):
        parse_row(row)
    # unknown "E" names: a share of the 1.7x estimate is taken as per-layer embeddings
    unknown = architectures.lookup("gemma-9-E4B-it")
    assert unknown is not None and unknown.per_layer_embed_params_b > 0
    for name in ("gemma-3-12b-it", "gemma-3-27b-it", "gemma-2-27b-it", "gemma-4-31B-it"):
        spec = architectures.lookup(name)
        assert spec is not None and spec.ties_embeddings, name
    row["model"] = {"name": "gemma-3-27b-it"}
    s = parse_row(row)
    assert memory.lookup_only_params(s) == 0.0  # the head, streamed and multiplied


def test_sliding_window_layers_hold_their_window_where_the_engine_has_a_window_cache(row) -> None:
    """Gemma 3 27B: 52 of 62 layers attend to the last 1024 tokens. llama.cpp keeps window +
    n_ubatch (512) cells for them, HF's DynamicCache the window, tightfit the whole context; a
    decode step reads what is held. At a 32k context that is 3.11 vs 15.5 GiB of f16 K/V."""
    row["hardware"] = {"name": "RTX 4090"}
    row["model"] = {"name": "gemma-3-27b-it"}
    row["workload"] = {"prompt_tokens": 30000, "gen_tokens": 128, "batch": 1,
                       "context_tokens": 32768}
    per_token = 2 * 62 * 16 * 128 * 2  # K and V, f16
    s = parse_row(row)
    lcpp = engines.profile("llama.cpp", s.device.device_class, s.quant)
    held = per_token * (10 * 32768 + 52 * 1536) / 62
    assert memory.estimate(s, lcpp).kv_bytes == pytest.approx(held)
    assert held / (per_token * 32768) < 0.21
    assert held / 2 ** 30 == pytest.approx(3.11, abs=0.01)
    hf = engines.profile("hf-transformers", s.device.device_class, s.quant)
    assert memory.kv_tokens(s, hf, 32768) == pytest.approx((10 * 32768 + 52 * 1024) / 62)
    tf = engines.profile("tightfit", s.device.device_class, s.quant)
    assert memory.kv_tokens(s, tf, 32768) == 32768  # its paged cache keeps every position
    assert any("52 of 62 layers held for a 1024-token window" in n for n in s.notes)
    tf_row = parse_row(dict(row, engine="tightfit", quant="int4-g64"))
    assert any("keeps every position's K/V on the 52 layers" in n for n in tf_row.notes)
    # a context inside the window holds everything, windowed or not
    assert memory.kv_tokens(s, lcpp, 1000) == 1000
    # the decode step reads the held K/V: at a 30k prompt, a windowed model's step is cheaper
    plain = dict(row, model={"name": "gemma-3-27b-it", "n_layers": 62})
    b = roofline.analyse(s)
    full = per_token * (30000 + 64)
    assert b.bytes_per_step < memory.active_weight_bytes(s, lcpp) + 0.3 * full
    assert b.bytes_per_step > memory.active_weight_bytes(s, lcpp) + 0.1 * full
    assert parse_row(plain).model.sliding_layers == 52  # shape fields keep the window
    # prompt attention: llama.cpp's 512-token calls meet the window cache, HF's one masked
    # call computes every pair
    body = 2 * (s.model.params_b * 1e9 - memory.embedding_params(s)) * 30000 \
        + 2 * memory.embedding_params(s)
    full_attn = 4.0 * 62 * 30000 * 15000 * 32 * 128
    assert b.prefill_flops - body == pytest.approx(
        full_attn * (10 * 15000 + 52 * 1536) / (62 * 15000), rel=1e-6)
    hf_row = parse_row(dict(row, engine="hf-transformers"))
    assert roofline.analyse(hf_row).prefill_flops - body == pytest.approx(full_attn, rel=1e-6)
    from tightfit.predictor.scenario import RowError
    with pytest.raises(RowError, match="model.sliding_layers"):
        parse_row(dict(row, model={"name": "gemma-3-27b-it", "sliding_layers": 63}))
    mine = parse_row(dict(row, model={"name": "my-model", "params_b": 7, "n_layers": 32,
                                       "hidden_size": 4096, "sliding_window": 4096,
                                       "sliding_layers": 16}))
    assert memory.kv_tokens(mine, lcpp, 32768) == pytest.approx((16 * 32768 + 16 * 4608) / 32)
    # gpt-oss-20b: half its 24 layers on a 128-token window
    row["model"] = {"name": "gpt-oss-20b"}
    row["quant"] = "MXFP4"
    s = parse_row(row)
    lcpp = engines.profile("llama.cpp", s.device.device_class, s.quant)
    assert memory.kv_tokens(s, lcpp, 32768) == pytest.approx((12 * 32768 + 12 * 640) / 24)


def test_a_hybrid_caches_k_and_v_for_its_attention_layers_only(row) -> None:
    """Granite 4.0-H Small: 4 of its 40 layers attend (36 are Mamba-2); Qwen3-Next 12 of 48.
    Their K/V, held and read, is that share of a dense model's of the same shape."""
    row["hardware"] = {"name": "RTX 4090"}
    row["workload"] = {"prompt_tokens": 1000, "gen_tokens": 100, "batch": 1,
                       "context_tokens": 131072}
    for name, share in (("granite-4.0-h-small", 4 / 40), ("Qwen3-Next-80B-A3B-Instruct", 12 / 48)):
        row["model"] = {"name": name}
        s = parse_row(row)
        prof = engines.profile("llama.cpp", s.device.device_class, s.quant)
        dense = memory.kv_bytes_per_token(s, prof) * 131072
        assert memory.estimate(s, prof).kv_bytes == pytest.approx(share * dense), name
        assert memory.kv_tokens(s, prof, 1000) == pytest.approx(1000 * share)
        assert any("a hybrid" in n for n in s.notes)
    # Qwen3.5 9B: 8 of 32 layers attend, 4 K/V heads of 256: 32 KiB a token at f16, so a
    # 128k context takes 4 GiB and the whole model stays on a 24 GB card (counted on all 32
    # layers, before the table had it, 11% of it went to the host)
    row["model"] = {"name": "Qwen3.5-9B-Q4_K_M.gguf"}
    s = parse_row(row)
    prof = engines.profile("llama.cpp", s.device.device_class, s.quant)
    assert memory.kv_bytes_per_token(s, prof) * s.model.kv_layers / s.model.n_layers == 8 * 2 * 4 * 256 * 2
    assert memory.estimate(s, prof).kv_bytes == pytest.approx(131072 * 32768)
    from tightfit.predictor import predict
    p = predict([row])[0]
    assert p["peak_memory_gb"] < 16 and not any("on the host" in n for n in p["notes"])
    # ... and its 24 Gated DeltaNet layers hold a fixed state a sequence, f32: 32 value heads of
    # a 128 x 128 matrix, the convolution's last 3 inputs of Q, K, V (2 x 16 x 128 + 32 x 128):
    # counted per sequence in memory, read and written back by every decode step
    gdn = 24 * 4 * (32 * 128 * 128 + 3 * (2 * 16 * 128 + 32 * 128))
    assert s.model.recurrent_state_bytes == gdn
    one = memory.estimate(s, prof)
    assert one.state_bytes == gdn and any("MiB a sequence, counted" in n for n in s.notes)
    four = parse_row({**row, "workload": {**row["workload"], "batch": 4}})
    assert memory.estimate(four, prof).state_bytes == 4 * gdn
    assert memory.estimate(four, prof).peak_bytes - one.peak_bytes >= 3 * gdn + 3 * one.kv_bytes
    assert roofline.analyse(s).bytes_per_step == pytest.approx(
        memory.active_weight_bytes(s, prof) + memory.kv_bytes(s, prof, 1050) + 2 * gdn)
    # Granite 4.0-H Small: 36 Mamba-2 layers of 8192 channels x d_state 128 (148 MiB a sequence)
    assert parse_row({**row, "model": {"name": "granite-4.0-h-small"}}).model.recurrent_state_bytes \
        == pytest.approx(36 * 4 * (8192 * 128 + 3 * (8192 + 256)))
    # Jamba by name: Mamba (d_state 16) on twice the hidden width, its convolution on those
    # channels alone
    jamba = parse_row({**row, "model": {"name": "AI21-Jamba2-3B"}}).model
    inner = 2 * jamba.hidden_size
    assert jamba.state_bytes_per_layer == 4 * (inner * 16 + 3 * inner)
    assert jamba.recurrent_state_bytes == jamba.state_bytes_per_layer * (jamba.n_layers - jamba.kv_layers)
    # a config the table lacks: the state a layer given in MiB
    given = parse_row({**row, "model": {"name": "my-hybrid", "params_b": 3, "n_layers": 20,
                                        "hidden_size": 2048, "attention_layers": 5,
                                        "state_mb_per_layer": 2}})
    assert given.model.recurrent_state_bytes == 15 * 2 * 2**20
    # DeepSeek-Coder-V2-Lite attends through MLA: llama.cpp caches 512 + 64 values a layer
    row["model"] = {"name": "DeepSeek-Coder-V2-Lite-Instruct-Q4_K_M.gguf"}
    s = parse_row(row)
    assert memory.kv_bytes_per_token(s, engines.profile("llama.cpp", "discrete_gpu")) == 27 * 576 * 2
    from tightfit.predictor.scenario import RowError
    row["model"] = {"name": "granite-4.0-h-small", "attention_layers": 41}
    with pytest.raises(RowError, match="model.attention_layers"):
        parse_row(row)


def test_llama_cpp_reserves_a_full_call_of_logits_on_a_gpu(row) -> None:
    """llama.cpp sizes its compute buffer for a 512-token call with every position's logits:
    for a 262k vocabulary 512 MiB (its log for Gemma 3 270M: 514.50 MiB), device memory on a
    GPU; on a CPU the pages stay untouched and the RSS never holds them."""
    row["model"] = {"name": "gemma-3-270m"}
    row["workload"] = {"prompt_tokens": 64, "gen_tokens": 64, "batch": 1, "context_tokens": 4096}
    gpu = parse_row(row)
    prof = engines.profile("llama.cpp", "discrete_gpu", gpu.quant)
    assert memory.buffer_bytes(gpu, prof) >= 512 * 2 ** 20
    row["hardware"] = {"name": "EPYC 7763"}
    cpu = parse_row(row)
    assert memory.buffer_bytes(cpu, engines.profile("llama.cpp", "cpu", cpu.quant)) < 100 * 2 ** 20
    tf = engines.profile("tightfit", "discrete_gpu", gpu.quant)
    assert memory.buffer_bytes(gpu, tf) < 100 * 2 ** 20  # its own chunk's activations only


def test_llama_cpp_gpu_buffer_holds_no_attention_scores(row) -> None:
    """llama.cpp's flash attention is on by default on GPU backends, so its compute buffer
    is a call's logits, not heads x context scores: Qwen2.5 32B (40 heads, 152k vocabulary)
    at a 4096 context reserves ~311 MB, not the 684 MB the scores added; the same 32B Q4_K_M
    HF Transformers' buffer keeps the scores of the prompt it holds."""
    row["model"] = {"name": "Qwen2.5-32B-Instruct-Q4_K_M.gguf"}
    row["workload"] = {"prompt_tokens": 64, "gen_tokens": 200, "batch": 1, "context_tokens": 4096}
    row["hardware"] = {"name": "Radeon RX 7900 XT"}
    s = parse_row(row)
    llama = engines.profile("llama.cpp", "discrete_gpu", s.quant)
    logits = 4.0 * 512 * s.model.vocab_size
    assert memory.buffer_bytes(s, llama) == pytest.approx(logits)
    hf = engines.profile("hf-transformers", "discrete_gpu", s.quant)
    assert memory.buffer_bytes(s, hf) >= 4.0 * 64 * s.model.n_heads * 4096  # its 64-token prompt
    assert not llama.score_buffer and hf.score_buffer


def test_llama_cpp_flash_attention_setting_decides_the_score_buffer_on_any_device(row) -> None:
    """llama.cpp's tools resolve `-fa auto` to on wherever the backend runs the fused operation,
    a CPU included, so a prompt call holds no heads x positions scores; `flash_attn: false`
    (`-fa off`, llama-cpp-python's default) puts them back, on a GPU too. Anything but a
    boolean or on / off / auto is an error naming the field."""
    from tightfit.predictor.scenario import RowError

    row["model"] = {"name": "Qwen2.5-7B-Instruct"}
    for hw in ({"name": "EPYC 7763"}, {"name": "Radeon RX 7900 XT"}):
        row["hardware"] = hw
        row["workload"] = {"prompt_tokens": 512, "gen_tokens": 64, "context_tokens": 4096}
        default = parse_row(row)
        row["workload"]["flash_attn"] = "off"
        off = parse_row(row)
        on_buf = memory.buffer_bytes(default, engines.for_scenario(default))
        off_buf = memory.buffer_bytes(off, engines.for_scenario(off))
        scores = 4.0 * 512 * default.model.n_heads * 4096
        if default.device.device_class == "cpu":
            assert off_buf - on_buf == pytest.approx(scores, rel=0.01)
        else:  # a GPU reserves the larger of a call's activations and its logits
            assert on_buf < off_buf <= on_buf + scores
        assert roofline.analyse(off).memory.peak_bytes > roofline.analyse(default).memory.peak_bytes
    for bad in ("yes", 1, "fast"):
        row["workload"]["flash_attn"] = bad
        with pytest.raises(RowError, match="workload.flash_attn"):
            parse_row(row)


def test_llama_cpp_prompt_kernels_on_a_cpu_by_stored_format() -> None:
    """ggml-cpu runs Q4_0/Q4_K/IQ4_NL (repacked) and Q8_0/F16 (llamafile's sgemm) through tiled
    kernels and every other block type through a per-row dot product: ~2x apart in prompt
    rate on a CPU; on a GPU the format does not change the prior."""
    eff = {q: engines.profile("llama.cpp", "cpu", q).comp_eff
           for q in ("q4_0", "q4_k_m", "q8_0", "f16", "q4_1", "q6_k", "q5_k_m", "iq4_xs")}
    assert eff["q4_0"] >= eff["q4_k_m"] == eff["q8_0"] > eff["f16"]
    for generic in ("q4_1", "q6_k", "q5_k_m", "iq4_xs"):
        assert eff["q8_0"] / eff[generic] > 2.0
    gpu = {engines.profile("llama.cpp", "discrete_gpu", q).comp_eff for q in eff}
    assert len(gpu) == 1


def test_llama_cpp_keeps_the_context_asked_for_and_says_which_would_fit(row) -> None:
    """llama.cpp's `--fit` shrinks only a context left unset; a context the user sets stays,
    and layers go to the host instead. Llama 3.3 70B Q4_K_M on two 24 GB cards: at a 32k
    context its K/V (10 GB) pushes some layers off the GPUs, at the request's own context
    everything stays; the prediction says the largest context that keeps every layer on."""
    from tightfit.predictor import predict

    row["model"] = {"name": "Llama-3.3-70B-Instruct"}
    row["quant"] = "Q4_K_M"
    row["hardware"] = {"name": "RTX 4090", "device_count": 2, "host_memory_gb": 128}
    row["workload"] = {"prompt_tokens": 512, "gen_tokens": 128, "context_tokens": 32768}
    long = _analyse(row)
    assert not long.memory.fits_on_device and 0.8 < long.memory.device_fraction < 1
    assert long.decode.offload_s > 0
    s = parse_row(row)
    prof = engines.profile(s.engine, s.device.device_class, s.quant)
    ctx = memory.max_context_on_device(s, prof)
    assert ctx is not None and ctx % 256 == 0 and 640 < ctx < 32768
    row["workload"]["context_tokens"] = ctx
    assert _analyse(row).memory.fits_on_device
    row["workload"]["context_tokens"] = ctx + 512
    assert not _analyse(row).memory.fits_on_device
    row["workload"]["context_tokens"] = 32768
    out = predict([row])[0]
    assert any(f"up to {ctx} tokens keeps every layer on the GPU" in n for n in out["notes"])
    assert out["offload_fraction"] > 0
    row["workload"]["context_tokens"] = 640  # the request alone: all on the GPUs, no note
    out = predict([row])[0]
    assert out["offload_fraction"] == 0 and not any("keeps every layer" in n for n in out["notes"])


def test_offloaded_row_says_what_is_on_the_host_and_which_field_decides_fits(row):
    """A 70B Q4_K_M on one 24 GB card: about half of it on the host. Without the host's RAM
    `fits` is null, and the notes say how many GiB are on the host and which field decides;
    with it given, the prediction decides and that note goes."""
    from tightfit.predictor import predict

    row["model"] = {"name": "Llama-3.3-70B-Instruct"}
    row["quant"] = "Q4_K_M"
    row["hardware"] = {"name": "RTX 4090"}
    out = predict([row])[0]
    assert out["fits"] is None and 0.3 < out["offload_fraction"] < 0.7
    host = [n for n in out["notes"] if "on the host at a" in n]
    assert len(host) == 1 and "llama.cpp runs those layers on the CPU" in host[0]
    assert any("give hardware.host_memory_gb" in n for n in out["notes"])
    row["hardware"]["host_memory_gb"] = 64
    out = predict([row])[0]
    assert out["fits"] is True and not any("host_memory_gb" in n for n in out["notes"])
    row["engine"] = "hf-transformers"
    out = predict([row])[0]
    assert any("streams them over the host link every step" in n for n in out["notes"])


def test_a_deployment_that_does_not_fit_says_why_and_what_would(row) -> None:
    """`fits_reason`: the memory needed against the memory there is, then what fits instead,
    each checked against the estimate it names (a context, a format, a batch); null where the
    deployment fits."""
    from tightfit.predictor import predict

    def est(**change):
        r = {**row, **{k: v for k, v in change.items() if k != "workload"}}
        r["workload"] = {**row["workload"], **change.get("workload", {})}
        s = parse_row(r)
        return memory.estimate(s, engines.for_scenario(s))

    row["hardware"] = {"name": "Raspberry Pi 5"}
    row["model"] = {"name": "Llama-3.1-8B"}
    row["quant"] = "Q8_0"
    row["workload"] = {"prompt_tokens": 512, "gen_tokens": 128, "context_tokens": 131072}
    out = predict([row])[0]
    assert out["fits"] is False and out["fits_reason"] in out["notes"]
    why = out["fits_reason"]
    assert why.startswith(f"does not fit: its serving peak of {out['peak_memory_gb']:.2f} GiB is "
                          "more than the 7.20 GiB of Raspberry Pi 5's 8 GB")
    # Q8_0 itself fits at no context; the first lighter preset that fits at a shorter one
    assert est(workload={"context_tokens": 1024}).fits is False
    import re
    q, ctx = re.search(r"at (Q\w+) a context of up to (\d+) tokens fits", why).groups()
    assert est(quant=q, workload={"context_tokens": int(ctx)}).fits is True
    assert est(quant=q, workload={"context_tokens": int(ctx) + 512}).fits is False
    assert est(quant="Q8_0" if q != "Q8_0" else "Q6_K", workload={"context_tokens": int(ctx)}).fits is False \
        or q == "Q8_0"
    # a format that fits at the context asked for is named with its need
    row["workload"]["context_tokens"] = 2048
    row["quant"] = "F16"
    row["hardware"] = {"name": "Apple M2"}
    why = predict([row])[0]["fits_reason"]
    q, need = re.search(r"at (Q\w+) it needs ([\d.]+) GiB and fits", why).groups()
    assert q == "Q6_K" and est(quant="Q6_K").fits is True and est(quant="Q8_0").fits is False
    assert float(need) == pytest.approx(est(quant="Q6_K").peak_bytes / memory.GB, abs=0.05)
    # nothing fits: said so; a deployment that fits has no reason
    row["model"] = {"name": "Llama-3.1-70B"}
    why = predict([row])[0]["fits_reason"]
    assert why.endswith("neither a shorter context nor a format down to Q2_K fits: a smaller "
                        "model, or a device with more memory")
    row["model"], row["quant"] = {"name": "SmolLM2-135M"}, "Q8_0"
    out = predict([row])[0]
    assert out["fits"] is True and out["fits_reason"] is None
    # past an Apple chip's recommended working set, within what it can take: fits, and says so
    row["hardware"] = {"name": "M4 Pro", "memory_gb": 24}
    row["model"], row["quant"] = {"name": "Qwen2.5-32B"}, "Q4_K_M"
    row["workload"]["context_tokens"] = 4096
    out = predict([row])[0]
    assert out["fits"] is True and out["fits_on_device"] is False and out["fits_reason"] is None
    assert any(n.startswith("fits past the GPU's recommended working set: its peak of "
                            f"{out['peak_memory_gb']:.2f} GiB is over the 18.00 GiB")
               for n in out["notes"])
    # an offload over the host's RAM
    row["hardware"] = {"name": "RTX 3060", "host_memory_gb": 16}
    row["model"], row["quant"] = {"name": "Llama-3.1-70B"}, "Q4_K_M"
    out = predict([row])[0]
    assert out["fits"] is False
    assert re.search(r"does not fit: [\d.]+ GiB on the host .* is more than the 14.4 GiB usable "
                     r"of the host's 16 GB RAM", out["fits_reason"])
    row["hardware"]["host_memory_gb"] = 64  # offloaded and fits: no reason, no working-set note
    out = predict([row])[0]
    assert out["fits"] is True and out["fits_on_device"] is False and out["fits_reason"] is None
    assert not any("working set" in n for n in out["notes"])


def test_capacity_is_the_largest_context_and_batch_that_stay_on_the_device(row) -> None:
    """`capacity`: the largest context at the row's batch, and the most sequences at the row's
    context, that keep the deployment on the device (a set placement: its GPU part within the
    card); each checked against the memory estimate one step past it."""
    from tightfit.predictor import predict

    def on_device(r, **work):
        s = parse_row({**r, "workload": {**r["workload"], **work}})
        m = memory.estimate(s, engines.for_scenario(s))
        return m.gpu_bytes <= m.capacity_bytes if "gpu_layers" in r["workload"] \
            else m.fits_on_device

    row["model"] = {"name": "Llama-3.1-8B"}  # trained for 131,072 positions: memory caps it
    for hw, extra in (({"name": "RTX 3070"}, {}), ({"name": "Raspberry Pi 5"}, {}),
                      ({"name": "RTX 3060"}, {"gpu_layers": 20})):
        r = {**row, "hardware": hw, "workload": {**row["workload"], **extra}}
        cap = predict([r])[0]["capacity"]
        ctx, batch = cap["max_context_tokens"], cap["max_batch"]
        assert ctx % 256 == 0 and on_device(r, context_tokens=ctx)
        assert not on_device(r, context_tokens=ctx + 256)
        assert on_device(r, batch=batch, slots=None) and not on_device(r, batch=batch + 1)
    # more memory, more room; a deployment that does not stay on the device has none
    small = predict([{**row, "hardware": {"name": "RTX 3060"}}])[0]["capacity"]
    big = predict([{**row, "hardware": {"name": "RTX 4090"}}])[0]["capacity"]
    assert big["max_context_tokens"] > small["max_context_tokens"] > 2048
    assert big["max_batch"] > small["max_batch"] > 1
    none = predict([{**row, "hardware": {"name": "GTX 1050 Ti"}}])[0]
    assert none["offload_fraction"] > 0
    assert none["capacity"] == {"max_context_tokens": None, "max_batch": None}
    # the first Llama 3 was trained for 8,192 positions: its headroom stops there
    first = predict([{**row, "model": {"name": "Meta-Llama-3-8B"},
                      "hardware": {"name": "RTX 4090"}}])[0]["capacity"]
    assert first["max_context_tokens"] == 8192 < big["max_context_tokens"]
    # a tiny model on a large device reaches the search's caps
    tiny = predict([{**row, "hardware": {"name": "RTX 4090"}, "model": {"name": "SmolLM2-135M"},
                     "quant": "Q8_0", "workload": {"prompt_tokens": 16, "gen_tokens": 16}}])[0]
    assert tiny["capacity"]["max_batch"] == 4096


def test_tightfit_cpu_decode_reads_the_window_its_cache_does_not_drop(row) -> None:
    """tightfit's paged cache keeps every position, but its fused CPU decode attention starts a
    sliding-window layer's row at len - window (engine/kernels/decode.cpp): Gemma 3 270M at a
    1,536-token prompt holds all of it on 18 layers and reads 512 positions on 15 of them."""
    row["hardware"] = {"name": "Ryzen 9 7950X"}
    row["model"] = {"name": "gemma-3-270m-it"}
    row["engine"], row["quant"] = "tightfit", "int4-g64"
    row["workload"] = {"prompt_tokens": 1536, "gen_tokens": 128}
    s = parse_row(row)
    tf = engines.profile("tightfit", "cpu", s.quant)
    ctx = 1536 + 64
    assert memory.kv_tokens(s, tf, ctx) == ctx
    assert memory.kv_tokens(s, tf, ctx, read=True) == pytest.approx((3 * ctx + 15 * 512) / 18)
    per_token = memory.kv_bytes_per_token(s, tf)
    b = roofline.analyse(s)
    read = b.bytes_per_step - memory.active_weight_bytes(s, tf)
    assert read == pytest.approx(per_token * (3 * ctx + 15 * 512) / 18)
    assert b.memory.kv_bytes == pytest.approx(per_token * (1536 + 128))  # held: all of it
    # inside the window nothing changes, and engines that read what they hold keep doing so
    assert memory.kv_tokens(s, tf, 400, read=True) == 400
    lcpp = engines.profile("llama.cpp", "cpu", "q4_k_m")
    assert memory.kv_tokens(s, lcpp, ctx, read=True) == memory.kv_tokens(s, lcpp, ctx)


@pytest.mark.parametrize("quant,file_gb", [("Q8_0", 1.32), ("Q6_K", 1.02), ("Q5_K_M", 0.91),
                                           ("Q5_K_S", 0.89), ("Q4_K_M", 0.81), ("Q4_K_S", 0.78)])
def test_preset_weights_match_published_file_sizes(row, quant: str, file_gb: float) -> None:
    """llama-quantize's head rule: Llama 3.2 1B's tied 128256 x 2048 embedding is its output head,
    stored at Q6_K (2048 is whole 256-blocks), not Q8_0. The published files of one public
    conversion: Q4_K_M 0.81 GB, and 0.87 GB for its Q4_K_L, which keeps embedding and head at
    Q8_0 (what the predictor said for Q4_K_M before: 0.872)."""
    row["model"] = {"name": "Llama-3.2-1B-Instruct"}
    row["quant"] = quant
    s = parse_row(row)
    prof = engines.profile(s.engine, s.device.device_class, s.quant)
    assert memory.weight_bytes(s, prof) / 1e9 == pytest.approx(file_gb, rel=0.02)


def test_untied_head_is_streamed_at_q6_k_and_the_embedding_looked_up_at_the_base_type(row) -> None:
    """Llama 3 8B Q4_K_M: output.weight Q6_K (streamed every step), token_embd.weight Q4_K (one
    row a token); the whole file 4.92 GB as published."""
    row["model"] = {"name": "Meta-Llama-3-8B"}
    s = parse_row(row)
    prof = engines.profile(s.engine, s.device.device_class, s.quant)
    table = 128256 * 4096
    total = memory.weight_bytes(s, prof)
    assert total / 1e9 == pytest.approx(4.92, rel=0.02)
    assert memory.lookup_only_bytes(s, prof) == pytest.approx(table * 4.5 / 8)
    body = s.model.params_b * 1e9 - 2 * table
    assert memory.active_weight_bytes(s, prof) == pytest.approx(
        (body * s.bits_per_weight + table * 6.5625) / 8)
    row["model"] = {"name": "gemma-3-270m"}  # 640 wide: the tied head falls back to Q8_0
    assert memory.gguf_head_bits(parse_row(row)) == 8.5


def test_float_embedding_and_head_of_a_tagged_preset(row) -> None:
    """`Q4_K_M-f16` (llama-quantize's --token-embedding-type / --output-tensor-type f16): the
    file holds the embedding and an untied head in f16, the rest as the preset. Llama 3 8B's two
    128256 x 4096 tables: 1.05e9 weights from Q4_K / Q6_K-class bits to 16, about +1.3 GB, and
    decode streams the head (not the looked-up embedding) at the larger size."""
    from tightfit.predictor import predict

    row["model"] = {"name": "Meta-Llama-3-8B"}
    row["hardware"] = {"name": "RTX 4090"}
    plain = _analyse(row)
    row["quant"] = "Q4_K_M-f16"
    tagged = _analyse(row)
    extra = tagged.memory.weights_bytes - plain.memory.weights_bytes
    assert 1.1e9 < extra < 1.5e9
    assert 1.0 < tagged.decode.mem_s / plain.decode.mem_s < 1.25
    out = predict([row])[0]
    assert any("output head at 16 bits" in n for n in out["notes"])
    row["model"] = {"name": "gemma-2-9b-it"}  # tied: one table, the head (Q6_K: 3584 = 14 x 256)
    row["quant"] = "Q4_K_M"
    tied = _analyse(row).memory.weights_bytes
    row["quant"] = "Q4_K_M-fp16"
    assert _analyse(row).memory.weights_bytes - tied == pytest.approx(
        parse_row(row).model.embedding_params * (16 - 6.5625) / 8, rel=0.01)
    row["quant"] = "Q4_K_M"  # the tag in the model's file name, after the same preset
    row["model"] = {"name": "gemma-2-9b-it-Q4_K_M-fp16.gguf"}
    assert _analyse(row).memory.weights_bytes == pytest.approx(tied + (
        parse_row(row).model.embedding_params * (16 - 6.5625) / 8), rel=0.01)
    row["quant"] = "Q8_0"  # another preset than the file's: the file name says nothing of it
    assert parse_row(row).embed_bits is None
    row["quant"] = "f16-Q4"
    assert "quant" == predict([row])[0]["error"]["field"]


def _cpu_row(engine: str, quant: str, **hw: float) -> dict:
    return {"id": "x", "hardware": {"name": "vm", "kind": "cpu", "memory_gb": 23.5,
                                    "memory_bandwidth_gbps": 38.0, "fp16_tflops": 0.1,
                                    "cpu_cores": 1, **hw},
            "model": "SmolLM2-135M", "quant": quant, "engine": engine,
            "workload": {"prompt_tokens": 256, "gen_tokens": 128}}


@pytest.mark.parametrize("engine,quant,decode,prefill", [
    ("llama.cpp", "Q4_1", True, True), ("llama.cpp", "F16", True, True),
    ("tightfit-lite", "Q8_0", True, True), ("tightfit", "int8", True, False),
    ("tightfit", "fp32", False, False), ("hf-transformers", "fp32", False, False)])
def test_a_cpu_whose_simd_kernels_run_slow_for_its_gemm_slows_the_engines_that_run_them(
        engine: str, quant: str, decode: bool, prefill: bool) -> None:
    """Two 2-core VMs: the Xeon's block-format kernel runs at 0.24 of its fp32 GEMM, the
    EPYC's (where the priors were measured) at 0.51, and the Xeon's llama.cpp, lite and
    tightfit-int8 decode ran at 0.4-0.6 of the EPYC's with the higher GEMM rate. Only the
    hand-written kernels' compute is scaled: torch's GEMV and fbgemm's prompt GEMM are not."""
    from tightfit.predictor.hardware import KERNEL_SHARE_OF_GEMM

    plain = roofline.analyse(parse_row(_cpu_row(engine, quant)))
    same = roofline.analyse(parse_row(_cpu_row(engine, quant,
                                               kernel_gflops=100 * KERNEL_SHARE_OF_GEMM)))
    slow = roofline.analyse(parse_row(_cpu_row(engine, quant,
                                               kernel_gflops=50 * KERNEL_SHARE_OF_GEMM)))
    assert same.decode.comp_s == pytest.approx(plain.decode.comp_s)  # the priors' own share
    assert same.prefill.comp_s == pytest.approx(plain.prefill.comp_s)
    assert slow.decode.comp_s == pytest.approx(plain.decode.comp_s * (2 if decode else 1))
    assert slow.prefill.comp_s == pytest.approx(plain.prefill.comp_s * (2 if prefill else 1))
    assert slow.decode.mem_s == plain.decode.mem_s  # streaming is not the kernel's arithmetic


def test_a_gpu_or_a_catalog_cpu_has_no_kernel_scale(row) -> None:
    from tightfit.predictor.hardware import lookup

    assert lookup("RTX 3070").kernel_rel == 1.0 and lookup("Raspberry Pi 5").kernel_rel == 1.0
    row["hardware"]["kernel_gflops"] = 10.0  # on a GPU the CPU kernels do not run
    assert roofline.kernel_scale(parse_row(row), "decode") == 1.0
    # the share is clipped: a typo cannot make a CPU 1000x slower
    tiny = parse_row(_cpu_row("llama.cpp", "Q4_0", kernel_gflops=0.001))
    assert tiny.device.kernel_rel == 0.25


def test_a_cpu_whose_threads_stream_more_than_one_copy_reads_weights_faster() -> None:
    """A measured CPU's memory terms use what its threads stream (the Xeon VM: a copy split over
    two threads 1.84x a one-thread copy); its compute and the residual's bandwidth features do
    not change."""
    from dataclasses import replace

    s = parse_row(_cpu_row("tightfit", "fp32", cpu_cores=2))
    fast = replace(s, device=replace(s.device, threads_bandwidth_gain=1.84))
    a, b = roofline.analyse(s), roofline.analyse(fast)
    assert b.decode.mem_s == pytest.approx(a.decode.mem_s / 1.84)
    assert b.prefill.mem_s == pytest.approx(a.prefill.mem_s / 1.84)
    assert b.decode.comp_s == a.decode.comp_s
    assert features.features(fast, b, "decode")["log_bandwidth"] == \
        features.features(s, a, "decode")["log_bandwidth"]


@pytest.mark.parametrize("engine,quant,scaled", [
    ("llama.cpp", "F16", True), ("tightfit-lite", "Q8_0", True), ("llama.cpp", "Q4_1", True),
    ("tightfit", "int8", False), ("tightfit", "fp32", False), ("hf-transformers", "fp32", False)])
def test_a_cpu_whose_kernels_stream_less_of_a_copy_reads_weights_slower(
        engine: str, quant: str, scaled: bool) -> None:
    """The Xeon VM's lite kernel streams a matrix beyond its caches at 0.34 of a copy on the
    same threads, the EPYC's (where the priors were measured) at 0.98, and the Xeon's llama.cpp
    and lite decode stream F16 / Q8_0 weights at 4.6-6.7 GB/s against a ~20 GB/s copy. Only
    llama.cpp's and the lite runtime's memory terms are scaled: tightfit's own integer kernels
    stream differently (scaled, held out by machine its int8 rows went 1.22 -> 0.69 of the
    measured speed on the Xeon), and torch's and HF's float GEMV are library code."""
    from tightfit.predictor.hardware import KERNEL_STREAM_SHARE_OF_COPY

    plain = roofline.analyse(parse_row(_cpu_row(engine, quant)))
    same = roofline.analyse(parse_row(_cpu_row(
        engine, quant, kernel_stream_share=KERNEL_STREAM_SHARE_OF_COPY)))
    slow = roofline.analyse(parse_row(_cpu_row(
        engine, quant, kernel_stream_share=KERNEL_STREAM_SHARE_OF_COPY / 2)))
    assert same.decode.mem_s == pytest.approx(plain.decode.mem_s)  # the priors' own share
    assert slow.decode.mem_s == pytest.approx(plain.decode.mem_s * (2 if scaled else 1))
    assert slow.prefill.mem_s == pytest.approx(plain.prefill.mem_s * (2 if scaled else 1))
    assert slow.decode.comp_s == plain.decode.comp_s  # arithmetic is the other probe's
    assert features.features(parse_row(_cpu_row(engine, quant, kernel_stream_share=0.3)),
                             slow, "decode")["log_bandwidth"] == \
        features.features(parse_row(_cpu_row(engine, quant)), plain, "decode")["log_bandwidth"]


def test_a_gpu_or_a_catalog_cpu_has_no_stream_scale(row) -> None:
    from tightfit.predictor import predict
    from tightfit.predictor.hardware import lookup

    assert lookup("Raspberry Pi 5").stream_rel == 1.0
    row["hardware"]["kernel_stream_share"] = 0.3  # on a GPU the CPU kernels do not run
    assert roofline.stream_scale(parse_row(row)) == 1.0
    tiny = parse_row(_cpu_row("llama.cpp", "Q4_0", kernel_stream_share=0.001))
    assert tiny.device.stream_rel == 0.25  # clipped like the kernel's share
    row["hardware"]["kernel_stream_share"] = 7
    assert predict([row])[0]["error"]["field"] == "hardware.kernel_stream_share"


def test_tightfit_int8_decode_gets_less_of_a_second_thread_on_small_matrices() -> None:
    """fbgemm's int8 product (tightfit's int8 decode) gained 0.9-1.4x from a second thread on
    0.3-0.9 MB matrices and 1.5-1.9x from 1 MB up on the Xeon VM, against a copy's 1.84: the
    base gives a model the byte-weighted share of the threads' gain its matrices get. SmolLM2's
    are 0.33-1.77 MB (its 28 MB head included, ~0.66 of the gain), an 8B model's all > 2 MB.
    Other formats and engines, and one thread, are as before."""
    from dataclasses import replace

    def two_threads(engine: str, quant: str, model: str) -> tuple[float, float]:
        row = _cpu_row(engine, quant, cpu_cores=2)
        row["model"] = model
        one = parse_row(row)
        two = replace(one, device=replace(one.device, threads_bandwidth_gain=1.84))
        return roofline.thread_efficiency(two), \
            roofline.analyse(one).decode.mem_s / roofline.analyse(two).decode.mem_s

    eff, gain = two_threads("tightfit", "int8", "SmolLM2-135M")
    assert 0.55 < eff < 0.75 and gain == pytest.approx(1 + eff * 0.84)
    eff8, gain8 = two_threads("tightfit", "int8", "Meta-Llama-3-8B")
    assert eff8 == 1.0 and gain8 == pytest.approx(1.84)
    for engine, quant in (("tightfit", "int4-g64"), ("tightfit", "fp32"), ("llama.cpp", "Q8_0")):
        assert two_threads(engine, quant, "SmolLM2-135M") == (1.0, pytest.approx(1.84))
    # the compute term: the second thread's share of the matrix rate, likewise
    row = _cpu_row("tightfit", "int8", cpu_cores=2)
    small = roofline.analyse(parse_row(row)).decode.comp_s
    row["hardware"]["cpu_cores"] = 1  # same rate, one thread: nothing to lose
    assert roofline.analyse(parse_row(row)).decode.comp_s == pytest.approx(small * (1 + eff) / 2)


@pytest.mark.parametrize("name", ["AMD EPYC 7763", "Ryzen 9 7950X", "AMD Ryzen Threadripper"])
def test_torch_float_decode_gets_no_second_thread_on_an_amd_cpu(name: str) -> None:
    """MKL keeps torch's fp32 products of a few rows on one thread on AMD CPUs (tightfit's fp32
    decode of SmolLM2 20.7 tok/s at one thread, 19.8 at two on the EPYC VM; 21.1 and 38.1 on
    the Xeon VM): tightfit's and HF's fp32 decode there get none of a second thread's gain, in
    the memory term or the compute term. An Intel CPU, a CPU of unknown make, the engines'
    other kernels, and a batch of 8 sequences (which MKL threads) get it as before."""
    def gain(engine: str, quant: str, hw_name: str, batch: int = 1) -> tuple[float, float]:
        """(memory term at 1 / at 2 threads, the 2-thread device's matrix rate used as a share
        of its given rate: 1 both cores, 0.5 one)."""
        row = _cpu_row(engine, quant, cpu_cores=2)
        row["hardware"]["name"] = hw_name
        row["workload"]["batch"] = batch
        one = parse_row(row)
        two = replace(one, device=replace(one.device, threads_bandwidth_gain=1.84))
        single = replace(two, device=replace(two.device, cpu_cores=1))
        a, b, c = (roofline.analyse(x).decode for x in (two, single, one))
        return c.mem_s / a.mem_s, b.comp_s / a.comp_s

    assert parse_row(_cpu_row("tightfit", "fp32") | {"hardware": {"name": name, "kind": "cpu",
            "memory_gb": 24, "memory_bandwidth_gbps": 38, "fp16_tflops": 0.1}}).device.amd_cpu
    for engine, quant in (("tightfit", "fp32"), ("hf-transformers", "fp32"),
                          ("hf-transformers", "Q4_K_M")):  # HF dequantises a GGUF file to fp32
        assert gain(engine, quant, name) == (pytest.approx(1.0), pytest.approx(0.5))
        assert gain(engine, quant, "Intel Xeon Gold 6132") == \
            (pytest.approx(1.84), pytest.approx(1.0))
        assert gain(engine, quant, "vm") == (pytest.approx(1.84), pytest.approx(1.0))
        assert gain(engine, quant, name, batch=8) == (pytest.approx(1.84), pytest.approx(1.0))
    for engine, quant in (("tightfit", "int4-g64"), ("tightfit", "Q4_1"), ("llama.cpp", "F16"),
                          ("hf-transformers", "bf16")):  # a bf16 checkpoint: oneDNN, not MKL
        assert gain(engine, quant, name)[0] > 1.5
    assert not hardware.lookup("Core i9-13900K").amd_cpu and hardware.lookup("EPYC 9654").amd_cpu
    assert not hardware.lookup("Radeon RX 7900 XT").amd_cpu  # a GPU, not a CPU
    # the answer says so, and what would use the threads
    from tightfit.predictor import predict

    def notes(hw: str, quant: str = "fp32", engine: str = "tightfit") -> str:
        row = _cpu_row(engine, quant, cpu_cores=8)
        row["hardware"]["name"] = hw
        return " ".join(predict([row])[0]["notes"])

    assert "on one thread on an AMD CPU" in notes(name) and "int8 and int4" in notes(name)
    assert "on one thread" in notes(name, engine="hf-transformers")
    for other in (notes("Intel Xeon Gold 6132"), notes(name, quant="int8")):
        assert "on one thread" not in other


def test_a_looped_transformer_reads_its_layers_once_a_pass(row) -> None:
    """Nanbeige4.2-3B runs its stored layers twice a token, each pass with K/V of its own: its
    decode reads the layers' weights twice and the head once, holds K/V for twice the layers,
    and stores its weights once. Given by hand, `layer_loops` does the same to any shape."""
    from tightfit.predictor import predict
    from tightfit.predictor.scenario import RowError
    row["hardware"] = {"name": "RTX 4090"}
    row["quant"] = "Q4_K_M"
    shape = {"params_b": 3.0, "n_layers": 22, "hidden_size": 2560, "n_heads": 20,
             "n_kv_heads": 4, "vocab_size": 166144, "intermediate_size": 10496}
    once = parse_row({**row, "model": {"name": "plain-3b", **shape}})
    twice = parse_row({**row, "model": {"name": "looped-3b", **shape, "layer_loops": 2}})
    assert (once.model.n_layers, twice.model.n_layers, twice.model.layer_loops) == (22, 44, 2)
    prof = engines.profile("llama.cpp", once.device.device_class, once.quant)
    # weights stored once, K/V for 44 layers
    assert memory.weight_bytes(twice, prof) == memory.weight_bytes(once, prof)
    assert memory.kv_bytes_per_token(twice, prof) == 2 * memory.kv_bytes_per_token(once, prof)
    # the head (2560 x 166144, 14% of the parameters: taken as tied to the embedding) read
    # once, the layers twice
    head = 2560 * 166144
    layers = 3.0e9 - head
    factor = (2 * layers + head) / (layers + head)
    assert memory.loop_read_factor(twice) == pytest.approx(factor)
    assert memory.active_weight_bytes(twice, prof) == pytest.approx(
        factor * memory.active_weight_bytes(once, prof))
    a, b = roofline.analyse(once), roofline.analyse(twice)
    assert b.decode.mem_s == pytest.approx(factor * a.decode.mem_s, rel=0.02)
    assert b.decode.overhead_s > a.decode.overhead_s
    assert b.prefill_flops > 1.8 * a.prefill_flops
    p_once, p_twice = predict([{**row, "model": {"name": "plain-3b", **shape}},
                               {**row, "model": {"name": "looped-3b", **shape, "layer_loops": 2}}])
    assert p_twice["decode_tok_s"] < 0.6 * p_once["decode_tok_s"]
    assert any("22 stored layers run 2 times a token" in n for n in p_twice["notes"])
    # by name: the family's two passes over a size-estimated shape
    named = parse_row({**row, "model": {"name": "Nanbeige_Nanbeige4.2-3B-Q4_K_M.gguf"}}).model
    assert named.layer_loops == 2 and named.n_layers % 2 == 0
    plain = parse_row({**row, "model": {"name": "Nanbeige4.1-3B-Q4_K_M.gguf"}}).model
    assert plain.layer_loops == 1
    with pytest.raises(RowError, match="model.layer_loops"):
        parse_row({**row, "model": {"name": "looped-3b", **shape, "layer_loops": 1.5}})


def test_llama_cpp_puts_a_mixture_s_experts_on_the_host_first(row) -> None:
    """llama.cpp's `--fit` keeps attention, K/V and the dense parts of a mixture of experts on
    the GPU and moves routed-expert tensors to host RAM first, so a token reads only the routed
    experts among those on the host (Qwen3-30B-A3B: ~6%), not a share of whole layers."""
    from dataclasses import replace as dc_replace
    row["hardware"] = {"name": "RTX 3060", "host_memory_gb": 64}
    row["quant"] = "Q4_K_M"
    row["model"] = {"name": "Qwen3-30B-A3B-Instruct-2507-Q4_K_M.gguf"}
    s = parse_row(row)
    prof = engines.profile("llama.cpp", s.device.device_class, s.quant)
    assert prof.experts_to_host
    mem = memory.estimate(s, prof)
    assert 0 < mem.host_expert_bytes == mem.host_bytes
    experts, read = memory.routed_experts(s)
    assert experts / 1e9 == pytest.approx(29.0, abs=0.2) and read == pytest.approx(8 / 128, rel=0.05)
    dec, _, _ = roofline.decode_phase(s, prof, mem)
    timed = memory.active_weight_bytes(s, prof) / prof.moe_bw_rel + memory.kv_bytes(
        s, prof, s.workload.prompt_tokens + s.workload.gen_tokens / 2, read=True)
    host = mem.host_bytes * read / prof.moe_bw_rel
    assert memory.host_read_share(s, prof, mem, timed) == pytest.approx(host / timed)
    # whole layers on the host instead (the same bytes there) read ~1.7x more from host RAM
    layers = dc_replace(prof, experts_to_host=False)
    mem_layers = memory.estimate(s, layers)
    assert mem_layers.host_expert_bytes == 0 and mem_layers.host_bytes == mem.host_bytes
    dec_layers, _, _ = roofline.decode_phase(s, layers, mem_layers)
    assert dec_layers.offload_s > 1.5 * dec.offload_s
    from tightfit.predictor import predict
    notes = predict([row])[0]["notes"]
    assert any("routed experts held in host RAM" in n for n in notes)
    # asked for by the row: whole layers (an explicit -ngl turns --fit off)
    given = parse_row({**row, "workload": {**row["workload"], "moe_offload": "layers"}})
    assert memory.estimate(given, prof).host_expert_bytes == 0
    assert predict([{**row, "workload": {**row["workload"], "moe_offload": "layers"}}])[0][
        "decode_tok_s"] < predict([row])[0]["decode_tok_s"]
    from tightfit.predictor.scenario import RowError
    with pytest.raises(RowError, match="workload.moe_offload"):
        parse_row({**row, "workload": {**row["workload"], "moe_offload": "gpu"}})
    # a dense model too large for the card goes to the host by whole layers as before
    row["model"] = {"name": "Qwen2.5-32B-Instruct-Q4_K_M.gguf"}
    dense = parse_row(row)
    mem = memory.estimate(dense, prof)
    assert mem.host_bytes > 0 and mem.host_expert_bytes == 0
    assert memory.host_read_share(dense, prof, mem, 1e9) == pytest.approx(1 - mem.device_fraction)


def test_a_hybrid_s_recurrent_layers_run_more_graph_operations(row) -> None:
    """Per-layer costs (a CPU thread pool's barriers, kernel launches) follow the operations a
    layer's graph runs: a Mamba-2 or Gated DeltaNet layer ~1.6-1.7 an attention layer's, a short
    convolution 0.9, Falcon-H1's parallel layers 2.4 (the nodes that run in llama.cpp's graphs,
    counted in its own test models). Granite 4.0-H 1B is 40 layers deep, 4 of them attending."""
    from tightfit.predictor import architectures
    from tightfit.predictor.scenario import RowError
    g = architectures.lookup("granite-4.0-h-1b-Q4_K_M.gguf")
    assert (g.n_layers, g.kv_layers, g.params_b) == (40, 4, pytest.approx(1.46))
    assert g.layer_ops == pytest.approx((4 + 36 * 1.7) / 40)
    assert architectures.lookup("Qwen3.5-0.8B").layer_ops == pytest.approx((6 + 18 * 1.6) / 24)
    assert architectures.lookup("qwen3.5-4b").layer_ops > 1.4  # a size estimate of the family
    assert architectures.lookup("Falcon-H1-1.5B-Instruct").layer_ops == 2.4
    assert architectures.lookup("LFM2-1.2B").layer_ops == pytest.approx((6 + 10 * 0.9) / 16)
    for plain in ("Llama-3.2-1B", "Qwen3-4B"):
        assert architectures.lookup(plain).layer_ops == 1.0
    # on a 14-core CPU the barriers are a large share of a small model's step: the same shape
    # with attention-like layers steps faster by exactly the extra per-layer cost
    row.update(hardware={"name": "cpu", "kind": "cpu", "memory_gb": 64, "memory_bandwidth_gbps": 77,
                         "fp16_tflops": 1.0, "cpu_cores": 14},
               model="granite-4.0-h-1b", quant="Q4_K_M")
    hybrid = parse_row(row)
    plain = replace(hybrid, model=replace(hybrid.model, mixer=""))
    prof = engines.profile("llama.cpp", "cpu", "q4_k_m")
    per_layer = prof.layer_overhead_s + prof.sync_s_per_thread_layer * 14
    a, b = roofline.analyse(plain).decode, roofline.analyse(hybrid).decode
    assert b.overhead_s - a.overhead_s == pytest.approx(per_layer * 40 * (g.layer_ops - 1))
    assert (b.mem_s, b.comp_s) == (a.mem_s, a.comp_s)
    assert any("36 of its 40 layers run mamba2, 1.7x the graph operations" in n
               for n in hybrid.notes)
    # a hybrid given by its fields says what its other layers run
    row["model"] = {"name": "my-hybrid", "params_b": 1.5, "n_layers": 40, "hidden_size": 1536,
                    "n_heads": 12, "n_kv_heads": 4, "vocab_size": 100352,
                    "intermediate_size": 4096, "attention_layers": 10, "mixer": "Mamba2"}
    assert parse_row(row).model.layer_ops == pytest.approx((10 + 30 * 1.7) / 40)
    row["model"]["mixer"] = "lstm"
    with pytest.raises(RowError, match="model.mixer"):
        parse_row(row)
    row["model"]["mixer"] = "mamba2"
    del row["model"]["attention_layers"]
    with pytest.raises(RowError, match="model.attention_layers"):
        parse_row(row)


def test_a_batch_adds_each_further_sequence_at_the_prompts_rate() -> None:
    """tightfit's engine on the 2-core EPYC, default model as Q4_1, one thread
    (data/measurements/batch-epyc.jsonl): a step of 16 sequences took 58.9 ms against 9.7 ms
    for one, 3.3 ms a further sequence, where a prompt runs ~3.4 ms a token (296 tok/s at 512
    tokens). The batch model adds each further sequence's FLOPs at the predicted prompt rate:
    the aggregate rate of 16 sequences must be over twice one stream's (measured 2.6x). The
    model before, every sequence at the single stream's matrix-vector rate, said 1.2x."""
    from tightfit.predictor import artefact, core

    model = artefact.load()

    def predicted(batch: int, prompt: int = 30, gen: int = 64) -> core.Prediction:
        s = parse_row({"id": "x", "hardware": {"name": "cpu", "kind": "cpu", "memory_gb": 23.5,
                                               "memory_bandwidth_gbps": 34.0,
                                               "fp16_tflops": 0.1, "cpu_cores": 1},
                       "model": "SmolLM2-135M", "quant": "Q4_1", "engine": "tightfit",
                       "workload": {"prompt_tokens": prompt, "gen_tokens": gen,
                                    "batch": batch}})
        return core.predict_scenario(s, model)

    one, sixteen = predicted(1), predicted(16)
    assert sixteen.decode_tok_s > 2 * one.decode_tok_s
    assert sixteen.tpot_s > one.tpot_s  # each stream's step is longer
    # each further sequence costs its decode FLOPs (the output head's included) at the FLOP
    # rate of a 512-token prompt's prediction
    ref = predicted(1, prompt=core.BATCH_REF_PROMPT, gen=1)
    per_seq = (sixteen.tpot_s - one.tpot_s) / 15
    s1 = parse_row({"id": "x", "hardware": {"name": "cpu", "kind": "cpu", "memory_gb": 23.5,
                                            "memory_bandwidth_gbps": 34.0, "fp16_tflops": 0.1,
                                            "cpu_cores": 1},
                    "model": "SmolLM2-135M", "quant": "Q4_1", "engine": "tightfit",
                    "workload": {"prompt_tokens": 512, "gen_tokens": 1}})
    flops_per_token = roofline.analyse(s1).prefill_flops / 512
    prompt_s_per_flop = 1 / (ref.prefill_tok_s * flops_per_token)
    step_flops = 2 * 134.5e6  # SmolLM2-135M's parameters, the tied head included
    assert per_seq == pytest.approx(step_flops * prompt_s_per_flop, rel=0.1)


def test_tightfits_batch_overlaps_its_further_sequences_with_the_weights_reads() -> None:
    """tightfit's packed CPU kernels multiply each block of weights by every sequence of the
    step in one pass over the weights, so the further sequences' arithmetic hides under the
    reads as a single step's does (EngineProfile.batch_one_pass): on the EPYC, default model
    as Q4_1, one thread, the step grew 9.75 -> 11.86 ms from one sequence to two (2.1 ms) and
    3.5 ms a sequence from 8 to 16 (Gemma 3 as Q4_K_M: 1.2 and 6.2 ms). The model, on a device
    like it at two threads (whose single step is read-bound): a second sequence adds less than
    a ninth does, once the arithmetic dominates the step.
    Where MKL runs a few rows as passes (torch's fp32 on an AMD CPU) and for the engines whose
    further columns are not one pass (HF, llama.cpp), the arithmetic is added after the step."""
    from tightfit.predictor import artefact, core

    model = artefact.load()

    def tpot(batch: int, engine: str = "tightfit", quant: str = "Q4_1",
             name: str = "cpu") -> float:
        s = parse_row({"id": "x", "hardware": {"name": name, "kind": "cpu", "memory_gb": 23.5,
                                               "memory_bandwidth_gbps": 37.7,
                                               "fp16_tflops": 0.2, "cpu_cores": 2},
                       "model": "SmolLM2-135M", "quant": quant, "engine": engine,
                       "workload": {"prompt_tokens": 30, "gen_tokens": 64, "batch": batch}})
        return core.predict_scenario(s, model).tpot_s

    for quant in ("Q4_1", "int8", "int4-g64"):
        t1, t2, t8, t9 = (tpot(b, quant=quant) for b in (1, 2, 8, 9))
        late = t9 - t8  # one further sequence once the arithmetic dominates the step
        assert t2 - t1 < 0.8 * late  # the second hides partly under the reads
        assert late > 0
    assert engines.profile("tightfit", "cpu").batch_one_pass
    assert not engines.profile("tightfit", "discrete_gpu").batch_one_pass
    for engine in ("hf-transformers", "llama.cpp", "tightfit-lite"):
        assert not engines.profile(engine, "cpu").batch_one_pass
    # fp32 on an AMD CPU: MKL's few-row products, each further sequence added whole; on an
    # Intel CPU the same fp32 batch is one pass
    amd = [tpot(b, quant="fp32", name="AMD EPYC 7763") for b in (1, 2, 3)]
    intel = [tpot(b, quant="fp32", name="Intel Xeon Gold 6132") for b in (1, 2, 3)]
    assert amd[2] - amd[1] == pytest.approx(amd[1] - amd[0], rel=0.05)
    assert intel[1] - intel[0] < 0.5 * (amd[1] - amd[0])


def test_llama_cpp_on_a_cpu_pays_a_whole_step_for_the_first_further_sequence() -> None:
    """llama-server on the 2-core EPYC (batch-epyc.jsonl, batch-formats-epyc.jsonl): from one
    sequence in flight to two, the step grew by 0.5-1.6x the one-sequence step (Q8_0, one
    thread: 10.3 -> 26.8 ms; Gemma 3's Q4_K_M: 21.1 -> 45.0) -- ggml's CPU products leave their
    matrix-vector path from two columns on -- and each sequence after that added 0.3-0.7x. The
    batch model charges the first further sequence a whole single-stream step on a CPU; the
    model before charged it the prompt rate (a 2-sequence step 1.3x the one-sequence step,
    Q8_0). On a GPU llama.cpp's matrix-vector kernels take several columns: no jump there."""
    from tightfit.predictor import artefact, core

    model = artefact.load()

    def tpot(batch: int, kind: str = "cpu", quant: str = "Q8_0",
             name: str = "SmolLM2-135M") -> float:
        hw = {"name": "cpu", "kind": "cpu", "memory_gb": 23.5, "memory_bandwidth_gbps": 34.0,
              "fp16_tflops": 0.1, "cpu_cores": 1} if kind == "cpu" else {"name": "RTX 4090"}
        s = parse_row({"id": "x", "hardware": hw, "model": name, "quant": quant,
                       "engine": "llama.cpp",
                       "workload": {"prompt_tokens": 30, "gen_tokens": 64, "batch": batch,
                                    "context_tokens": 8192 // batch}})
        return core.predict_scenario(s, model).tpot_s

    for quant in ("Q8_0", "Q4_K_M"):
        one, two, three = tpot(1, quant=quant), tpot(2, quant=quant), tpot(3, quant=quant)
        assert two >= 2 * one  # a whole further step, and the second sequence's own K/V
        assert three - two < 0.8 * one  # later sequences at the prompt rate
    g1, g2 = tpot(1, "gpu"), tpot(2, "gpu")
    assert g2 < 1.5 * g1
    # a mixture of experts: the whole further step already reads the second sequence's
    # experts; the union's further experts are charged from the third sequence on
    m1, m2, m3 = (tpot(b, quant="Q4_K_M", name="Qwen3-30B-A3B") for b in (1, 2, 3))
    assert 2 * m1 <= m2 < 2.1 * m1 and m3 > m2 + 0.2 * m1


def test_llama_cpp_reserves_one_call_for_a_batch_and_holds_every_sequences_cells() -> None:
    """llama.cpp's reserved compute graph is one call of n_ubatch tokens in all, whatever the
    sequences; its context holds every sequence's cells. llama-server with `-c 8192 -np 16` on
    the default model measured 358-384 MiB from 1 to 16 in flight (batch-epyc.jsonl); given the
    context x batch = 8192, the prediction reads 387-390. Before, the call's activations were
    counted once a sequence: 547 MiB at 16."""
    from tightfit.predictor import artefact, core

    def peak(batch: int) -> float:
        s = parse_row({"id": "x", "hardware": {"name": "cpu", "kind": "cpu", "memory_gb": 23.5,
                                               "memory_bandwidth_gbps": 34.0,
                                               "fp16_tflops": 0.1, "cpu_cores": 2},
                       "model": "SmolLM2-135M", "quant": "Q4_1", "engine": "llama.cpp",
                       "workload": {"prompt_tokens": 30, "gen_tokens": 64, "batch": batch,
                                    "context_tokens": 8192 // batch}})
        return core.predict_scenario(s, artefact.load()).peak_memory_gb * 1024

    assert peak(16) == pytest.approx(peak(1), rel=0.03)
    assert 357 * 0.9 < peak(16) < 384 * 1.1


def test_a_llama_cpp_server_holds_every_slots_cache_whatever_is_in_flight() -> None:
    """llama-server (`-c 8192 -np 16 --kv-unified`) allocates K/V for all its slots at start.
    Gemma 3 270M's window layers then hold the whole context: llama.cpp sizes a unified window
    cache as min(cells, n_swa x slots + n_ubatch) = min(8192, 512 x 16 + 512). Measured on the
    2-core EPYC (batch-epyc.jsonl, batch-holdout-epyc.jsonl): 562-613 MiB from 1 to 16 in flight;
    given the batch alone, one sequence's window (1,024 cells) was counted, -2..-20% (Gemma 3 as
    Q4_0: 15.3% MAPE); given the slots, -1..-10%. A hybrid's recurrent state is held for every
    slot too, but a decode step reads only the batch's."""
    from tightfit.predictor import artefact, core, engines

    def scenario(batch: int, slots: int | None, model: str = "gemma-3-270m",
                 ctx: int = 512) -> core.Scenario:
        w = {"prompt_tokens": 30, "gen_tokens": 64, "batch": batch, "context_tokens": ctx}
        if slots:
            w["slots"] = slots
        return parse_row({"id": "x", "hardware": {"name": "cpu", "kind": "cpu",
                                                  "memory_gb": 23.5,
                                                  "memory_bandwidth_gbps": 34.0,
                                                  "fp16_tflops": 0.1, "cpu_cores": 2},
                          "model": model, "quant": "Q4_0", "engine": "llama.cpp",
                          "workload": w})

    s1, s16 = scenario(1, 16), scenario(16, 16)
    prof = engines.for_scenario(s1)
    # every layer holds all 8,192 cells, whatever the sequences in flight
    assert memory.kv_cells_held(s1, prof, 512) == pytest.approx(8192)
    assert memory.estimate(s1, prof).kv_bytes == memory.estimate(s16, prof).kv_bytes
    # one sequence's window alone: the window and one call on 15 of 18 layers
    alone = memory.kv_cells_held(scenario(1, None, ctx=8192), prof, 8192)
    assert alone == pytest.approx((3 * 8192 + 15 * 1024) / 18)
    # two slots of 4,096: their windows and one call's cells, not a call's cells for each
    two = memory.kv_cells_held(scenario(1, 2, ctx=4096), prof, 4096)
    assert two == pytest.approx((3 * 8192 + 15 * (2 * 512 + 512)) / 18)
    model = artefact.load()
    assert core.predict_scenario(s1, model).peak_memory_gb > \
        core.predict_scenario(scenario(1, None), model).peak_memory_gb + 0.1
    # a hybrid's recurrent state: held for 4 slots, read for the one sequence decoding
    h1, h4 = scenario(1, None, "qwen3.5-0.8b"), scenario(1, 4, "qwen3.5-0.8b")
    state = h1.model.recurrent_state_bytes
    assert state > 0
    hp = engines.for_scenario(h1)
    assert memory.estimate(h4, hp).state_bytes == pytest.approx(4 * state)
    assert roofline.analyse(h4).bytes_per_step == pytest.approx(roofline.analyse(h1).bytes_per_step)


def test_a_batch_of_a_mixture_of_experts_reads_the_union_of_its_routed_experts() -> None:
    """A decode step of B sequences reads the shared weights once and every expert one of its
    sequences routes to: 1 - (1 - r)^B of the routed experts where one token reads r. On the
    DGX Spark (GB10), llama.cpp's public llama-batched-bench table for gpt-oss-20b MXFP4 (PP
    512, TG 32; docs/examples/batched-bench.jsonl) steps 12.5 ms for one sequence and 21.0 ms
    for two (1.68x). The batch model charged a further sequence only its FLOPs at the prompt
    rate (1.02x); it now reads the union's further experts at the step's byte rate."""
    from tightfit.predictor import artefact, core

    model = artefact.load()

    def scenario(batch: int) -> core.Scenario:
        return parse_row({"id": "x", "hardware": {"name": "NVIDIA GB10"}, "model": "gpt-oss-20b",
                          "quant": "MXFP4", "engine": "llama.cpp",
                          "workload": {"prompt_tokens": 512, "gen_tokens": 32, "batch": batch,
                                       "flash_attn": True}})

    one, two = scenario(1), scenario(2)
    prof = engines.for_scenario(one)
    experts, r = memory.routed_experts(one)
    assert experts > 0 and 0 < r < 0.2
    assert memory.routed_experts(two)[1] == pytest.approx(1 - (1 - r) ** 2)
    assert memory.batch_expert_share(r, 32) == pytest.approx(1 - (1 - r) ** 32)
    # one sequence reads its active weights; two read the further experts on top
    w1, w2 = memory.active_weight_bytes(one, prof), memory.active_weight_bytes(two, prof)
    assert w2 > w1 * 1.3
    t1, t2 = (core.predict_scenario(s, model).tpot_s for s in (one, two))
    assert 1.3 < t2 / t1 < 1.9


def test_a_batch_of_llama_cpp_prompts_runs_in_calls_of_all_their_tokens() -> None:
    """llama.cpp packs a batch's prompts into calls of n_ubatch tokens, each call reading the
    weights once: B prompts of p tokens take ceil(B p / n_ubatch) calls, not ceil(p / n_ubatch).
    On the DGX Spark, llama-batched-bench's gpt-oss-120b (PP 4096; docs/examples/
    batched-bench.jsonl) processed 2,413 prompt tokens a second with one sequence and 2,401
    with four; the prediction read the four 2.1x faster than the one before."""
    from tightfit.predictor import artefact, core

    model = artefact.load()

    def prefill(batch: int) -> float:
        s = parse_row({"id": "x", "hardware": {"name": "NVIDIA GB10"}, "model": "gpt-oss-120b",
                       "quant": "MXFP4", "engine": "llama.cpp",
                       "workload": {"prompt_tokens": 4096, "gen_tokens": 32, "batch": batch,
                                    "flash_attn": True}})
        return core.predict_scenario(s, model).prefill_tok_s

    assert prefill(4) == pytest.approx(prefill(1), rel=0.1)


def test_metal_runs_more_than_eight_sequences_on_tiles_of_thirty_two() -> None:
    """llama.cpp on Metal sends a product of more than 8 columns to its matrix-matrix kernel,
    which computes tiles of 32 columns: on an M2 Ultra (llama-batched-bench, docs/examples/
    batched-bench.jsonl) 16 sequences stepped in 95-96% of the time of 32 on every model. A
    batch of 9-32 is charged the FLOPs of 32 there; a CUDA device's batch is not padded."""
    from tightfit.predictor import artefact, core

    model = artefact.load()

    def tpot(batch: int, hw: dict) -> float:
        s = parse_row({"id": "x", "hardware": hw, "model": "Qwen2.5-Coder-7B", "quant": "Q8_0",
                       "engine": "llama.cpp",
                       "workload": {"prompt_tokens": 512, "gen_tokens": 32, "batch": batch,
                                    "flash_attn": True}})
        assert core.batch_columns(s, engines.for_scenario(s)) == (
            32 if hw["name"].startswith("Apple") and 8 < batch <= 32 else batch)
        return core.predict_scenario(s, model).tpot_s

    mac, spark = {"name": "Apple M2 Ultra", "memory_gb": 192}, {"name": "NVIDIA GB10"}
    assert tpot(16, mac) == pytest.approx(tpot(32, mac), rel=0.1)
    assert tpot(8, mac) < 0.8 * tpot(16, mac)
    # unpadded, 16 sequences on the GB10 step in well under the time of 32
    assert tpot(16, spark) / tpot(32, spark) < tpot(16, mac) / tpot(32, mac) - 0.1


def test_a_llama_cpp_placement_set_by_the_row_puts_those_layers_where_ngl_does(row) -> None:
    """llama.cpp's -ngl N (workload.gpu_layers) puts the last N of the layers + the output
    layer on the GPU, the output layer first; the token embedding stays in host RAM; each
    layer's K/V sits with it; --n-cpu-moe N (workload.n_cpu_moe) keeps only the routed experts
    of the first N layers in host RAM. Fewer layers on the card read more from host RAM."""
    from tightfit.predictor import predict
    row["hardware"] = {"name": "RTX 2080", "host_memory_gb": 62}
    row["model"] = {"name": "gemma-2-9b-it-Q4_K_M.gguf"}
    row["workload"] = {"prompt_tokens": 24, "gen_tokens": 176, "context_tokens": 4096}

    def mem(**w):
        s = parse_row({**row, "workload": {**row["workload"], **w}})
        return s, memory.estimate(s, engines.for_scenario(s))

    s, m36 = mem(gpu_layers=36)
    layers = s.model.n_layers
    assert layers == 42
    assert m36.host_layer_share == pytest.approx((layers - 35) / layers) and not m36.head_on_host
    assert 0 < m36.device_fraction < 1 and m36.fits is True and not m36.fits_on_device
    _, m1 = mem(gpu_layers=1)  # the output layer only
    assert m1.host_layer_share == 1 and not m1.head_on_host
    _, m0 = mem(gpu_layers=0)
    assert m0.head_on_host and m0.device_fraction == 0
    _, every = mem(gpu_layers="all")
    assert every.device_fraction == 1 and every.host_layer_share == 0
    _, m43 = mem(gpu_layers=43)  # 42 layers + the output layer: all
    assert m43.device_fraction == 1
    speeds = [predict([{**row, "id": str(n), "workload": {**row["workload"], "gpu_layers": n}}])[0][
        "decode_tok_s"] for n in (0, 20, 36, "all")]
    assert speeds == sorted(speeds) and speeds[-1] > 2 * speeds[2] > 4 * speeds[0]
    notes = predict([{**row, "workload": {**row["workload"], "gpu_layers": 36}}])[0]["notes"]
    assert any("35 of 42 layers on the GPU with the output layer" in n for n in notes)
    # a mixture of experts: --n-cpu-moe keeps experts only, every layer's attention on the card
    row["model"] = {"name": "Qwen3-30B-A3B-Instruct-2507-Q4_K_M.gguf"}
    s, moe = mem(n_cpu_moe=36)
    experts, read = memory.routed_experts(s)
    assert moe.host_layer_share == 0
    assert moe.host_expert_bytes == pytest.approx(experts * s.bits_per_weight / 8 * 36 / 48)
    prof = engines.for_scenario(s)
    step = memory.active_weight_bytes(s, prof) / prof.moe_bw_rel
    assert memory.host_read_share(s, prof, moe, step) == pytest.approx(
        moe.host_expert_bytes * read / prof.moe_bw_rel / step)
    _, fewer = mem(n_cpu_moe=12)
    assert fewer.host_expert_bytes == pytest.approx(moe.host_expert_bytes / 3)


def test_a_set_placement_too_big_for_the_card_does_not_fit_and_says_what_would(row) -> None:
    """No --fit margin with a set placement: a GPU part over the card fails to load (fits
    false), one over it by less than the memory estimate's error is undecided, and the note
    names the largest gpu_layers that keeps it under. Only llama.cpp has these flags."""
    from tightfit.predictor import predict
    from tightfit.predictor.scenario import RowError
    row["hardware"] = {"name": "RTX 2080", "host_memory_gb": 62}
    row["model"] = {"name": "Qwen2.5-14B-Instruct-Q4_K_M.gguf"}
    row["workload"] = {"prompt_tokens": 24, "gen_tokens": 176, "context_tokens": 4096}
    out = predict([{**row, "id": str(n), "workload": {**row["workload"], "gpu_layers": n}}
                   for n in ("all", 40)])
    assert out[0]["fits"] is False and out[1]["fits"] is True
    s = parse_row({**row, "workload": {**row["workload"], "gpu_layers": "all"}})
    most = memory.max_gpu_layers(s, engines.for_scenario(s))
    assert 30 < most < 48
    assert any(f"gpu_layers {most} keeps it under" in n for n in out[0]["notes"])
    over = parse_row({**row, "workload": {**row["workload"], "gpu_layers": most + 1}})
    m = memory.estimate(over, engines.for_scenario(over))
    assert m.gpu_bytes > m.capacity_bytes
    assert m.fits is (None if m.gpu_bytes <= m.capacity_bytes * (1 + memory.SET_PLACEMENT_BAND)
                      else False)
    with pytest.raises(RowError, match="workload.gpu_layers"):
        parse_row({**row, "workload": {"gpu_layers": -1}})
    with pytest.raises(RowError, match="workload.n_cpu_moe"):
        parse_row({**row, "workload": {"n_cpu_moe": 2.5}})
    with pytest.raises(RowError, match="workload.gpu_layers"):
        parse_row({**row, "workload": {"gpu_layers": float("inf")}})
    with pytest.raises(RowError, match="workload.gpu_layers.*not tightfit"):
        parse_row({**row, "engine": "tightfit", "workload": {"gpu_layers": 10}})
    cpu = parse_row({**row, "hardware": {"name": "Ryzen 9 7950X"},
                     "workload": {"gpu_layers": 10}})
    assert any("ignored" in n for n in cpu.notes)
