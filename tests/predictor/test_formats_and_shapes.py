from __future__ import annotations

from dataclasses import replace

import pytest

from tightfit.errors import TightfitError
from tightfit.predictor import architectures, formats, hardware


@pytest.mark.parametrize("name,bits", [("F16", 16), ("Q8_0", 8.5), ("Q6_K", 6.5625), ("Q4_0", 4.5),
                                       ("Q4_1", 5.0), ("int4-g128", 4.25), ("int4-g32", 5.0),
                                       ("int8", 8.0), ("fp32", 32.0), ("MXFP4", 4.25)])
def test_bits_per_weight(name: str, bits: float) -> None:
    assert formats.bits_per_weight(name) == bits


def test_k_quant_mixes_sit_between_their_blocks() -> None:
    assert 4.8 <= formats.bits_per_weight("Q4_K_M") <= 4.9
    assert 5.5 <= formats.bits_per_weight("Q5_K_M") <= 5.7


def test_unknown_quant_names_the_value() -> None:
    with pytest.raises(TightfitError, match="Q9_Z"):
        formats.bits_per_weight("Q9_Z")
    with pytest.raises(TightfitError, match="native"):
        formats.bits_per_weight("native")


@pytest.mark.parametrize("fname,quant", [("Qwen3-4B-Q4_K_M.gguf", "q4_k_m"),
                                         ("gemma-4-12B-it-QAT-Q4_0.gguf", "q4_0"),
                                         ("Qwen-AgentWorld-35B-A3B-UD-Q4_K_XL.gguf", "q4_k_xl"),
                                         ("gpt-oss-20b-MXFP4.gguf", "mxfp4"),
                                         ("Llama-3.2-1B-Instruct-4bit", None)])
def test_quant_from_filename(fname: str, quant: str | None) -> None:
    assert formats.quant_from_filename(fname) == quant


@pytest.mark.parametrize("name,base,bits", [("Q4_K_M-f16", "q4_k_m", 16.0),
                                            ("q8_0.BF16", "q8_0", 16.0),
                                            ("Q4_K_M", "Q4_K_M", None),
                                            ("F16", "F16", None), ("int4-g64", "int4-g64", None)])
def test_a_preset_tagged_with_a_float_embedding(name: str, base: str, bits: float | None) -> None:
    assert formats.split_embed_tag(name) == (base, bits)


def test_float_embedding_tag_read_from_file_names() -> None:
    assert formats.embed_bits_from_filename("gemma-2-9b-it-Q4_K_M-fp16.gguf") == 16.0
    assert formats.quant_from_filename("gemma-2-9b-it-Q4_K_M-fp16.gguf") == "q4_k_m"
    for name in ("Meta-Llama-3-8B-Q4_K_M.gguf", "model-f16.gguf", "Qwen3-4B-BF16.gguf"):
        assert formats.embed_bits_from_filename(name) is None


@pytest.mark.parametrize("name,total,active", [
    ("SmolLM2-135M-Instruct-Q4_K_M.gguf", 0.135, None),
    ("internlm2_5-1_8b-chat-Q4_K_M.gguf", 1.8, None),
    ("SmallThinker-4BA0.6B-Instruct.Q4_K_M.gguf", 4.0, 0.6),
    ("Qwen3.5-0.8B-Q4_0.gguf", 0.8, None),
    ("NVIDIA-Nemotron-3-Super-120B-A12B-Q4_K_M.gguf", 120.0, 12.0),
    ("llama3.2:1b", 1.0, None),
])
def test_parse_sizes(name: str, total: float, active: float | None) -> None:
    assert architectures.parse_sizes(name) == (total, active)


def test_known_moe_uses_the_table() -> None:
    spec = architectures.lookup("Qwen3-30B-A3B-Instruct-2507-Q4_K_M.gguf")
    assert spec is not None and spec.shape_known and spec.is_moe
    assert (spec.n_layers, spec.active_params_b) == (48, 3.3)


def test_lfm2_5_files_take_the_lfm2_shapes() -> None:
    # LFM2.5 keeps LFM2's shapes: 1.2B = 1.17e9 in 16 layers, a 65,536-entry tied embedding
    m = architectures.lookup("LFM2.5-1.2B-Instruct-Q4_K_M.gguf")
    assert (m.params_b, m.n_layers, m.vocab_size, m.ties_embeddings) == (1.17, 16, 65536, True)
    assert architectures.lookup("LFM2.5-350M-Q4_K_M.gguf").hidden_size == 1024
    assert architectures.lookup("LFM2.5-2.6B-Q4_K_M.gguf").ties_embeddings
    # ... its mixture of experts too (matched by the whole name, as a mixture is)
    moe = architectures.lookup("LFM2.5-8B-A1B-UD-Q4_K_XL.gguf")
    assert (moe.params_b, moe.active_params_b, moe.kv_layers) == (8.3, 1.5, 6)


def test_a_multimodal_gguf_is_its_language_model() -> None:
    """The audio / vision towers a multimodal model's name counts live in its projector file:
    the GGUF decode reads is the language model (LFM2.5-Audio-1.5B: the 1.2B backbone;
    Qwen3-VL / Qwen3-Omni: the Qwen3 model of that size)."""
    audio = architectures.lookup("LFM2.5-Audio-1.5B-JP-Q4_0.gguf")
    assert (audio.params_b, audio.n_layers, audio.kv_layers) == (1.17, 16, 6)
    omni = architectures.lookup("Qwen3-Omni-30B-A3B-Instruct-Q4_K_M.gguf")
    assert omni.is_moe and (omni.params_b, omni.active_params_b, omni.n_layers) == (30.5, 3.3, 48)
    vl = architectures.lookup("Qwen3VL-2B-Instruct-Q4_K_M.gguf")
    assert (vl.params_b, vl.n_layers, vl.hidden_size) == (1.72, 28, 2048)
    assert architectures.lookup("Qwen3-VL-8B-Instruct-Q4_K_M.gguf").hidden_size == 4096
    assert architectures.lookup("Qwen3-VL-235B-A22B-Instruct").active_params_b == 22.2


def test_qwen3_5_is_not_read_as_qwen3() -> None:
    """Qwen3.5's 4B is a Gated DeltaNet hybrid with a 248k vocabulary, not Qwen3's 4B: the
    family name must not match the start of a later version's."""
    assert architectures.lookup("Qwen3-4B-Q4_K_M.gguf").n_layers == 36
    m = architectures.lookup("Qwen_Qwen3.5-4B-Q4_K_M.gguf")
    assert not m.shape_known and m.vocab_size == 248320 and m.kv_layers == m.n_layers // 4
    # sizes with published configs come from the table, fine-tunes included
    nine = architectures.lookup("Qwen3.5-9B-Claude-4.6-Opus-Reasoning-Distilled-v2.Q8_0.gguf")
    assert nine.shape_known and (nine.n_layers, nine.kv_layers, nine.head_dim) == (32, 8, 256)
    small = architectures.lookup("Qwen3.5-0.8B-Q4_0.gguf")
    assert (small.hidden_size, small.kv_layers, small.ties_embeddings) == (1024, 6, True)
    moe = architectures.lookup("Qwen_Qwen3.5-35B-A3B-Q4_K_M.gguf")
    assert moe.is_moe and (moe.n_layers, moe.kv_layers) == (40, 10)


def test_name_without_size_is_unknown() -> None:
    assert architectures.lookup("BAAI_AREX-Turbo-Q4_K_M.gguf") is None


@pytest.mark.parametrize("name,bw", [("NVIDIA GeForce RTX 5070", 672), ("Apple M4 Pro", 273),
                                     ("M2 Ultra", 800), ("Tesla T4", 320),
                                     ("Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz", 77),
                                     ("Jetson Orin Nano", 68), ("Raspberry Pi 5", 17)])
def test_catalog_lookup(name: str, bw: float) -> None:
    spec = hardware.lookup(name)
    assert spec is not None and spec.bandwidth_gbps == bw


def test_a_measured_cpu_is_described_by_the_rated_equivalent_of_its_copy_rate() -> None:
    """Catalog devices are rated figures; a measured one keeps its copy rate and is given
    copy / COPY_OF_PEAK. A bandwidth given by hand over it is rated, and drops the copy."""
    vm = hardware.lookup("Generic 2-core cloud VM (AVX2)")
    assert vm is not None and vm.copy_bandwidth_gbps == 22
    assert vm.bandwidth_gbps == pytest.approx(22 / hardware.COPY_OF_PEAK, abs=0.01)
    assert vm.host_bandwidth_gbps == vm.bandwidth_gbps and vm.fp16_tflops == pytest.approx(0.116)
    assert hardware.lookup("Ryzen 9 7950X").copy_bandwidth_gbps is None  # type: ignore[union-attr]
    given = hardware.with_overrides(vm, bandwidth_gbps=40.0)
    assert given.bandwidth_gbps == 40.0 and given.copy_bandwidth_gbps is None
    assert hardware.with_overrides(vm, memory_gb=8.0).copy_bandwidth_gbps == 22
    # nor does a measured gain of its threads over one thread's copy
    measured = hardware.measured_cpu("vm", 24, 20.0, 200.0, 2, 48.0, 1.84)
    assert hardware.with_overrides(measured, bandwidth_gbps=40.0).threads_bandwidth_gain == 1.0
    assert hardware.with_overrides(measured, memory_gb=8.0).threads_bandwidth_gain == 1.84


def test_catalog_does_not_guess_unknown_devices() -> None:
    assert hardware.lookup("Quantum Potato 9000") is None
    assert hardware.lookup("RTX 9999") is None


@pytest.mark.parametrize("name,entry,bw", [
    ("RTX 4070 Ti", "GeForce RTX 4070 Ti", 504), ("RTX 4070 SUPER", "GeForce RTX 4070 SUPER", 504),
    ("Radeon RX 7900 GRE", "Radeon RX 7900 GRE", 576), ("RX 7900 XT", "Radeon RX 7900 XT", 800),
    ("NVIDIA GeForce RTX 4090 Laptop GPU", "GeForce RTX 4090 Laptop GPU", 576),
    ("RTX 4090 Mobile", "GeForce RTX 4090 Laptop GPU", 576),
    ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090", 1008),
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 3350), ("NVIDIA H100 PCIe", "H100 PCIe", 2000),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB", 2039), ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB", 1935),
    ("Jetson Orin Nano Super", "Jetson Orin Nano Super 8GB", 102),
    ("AMD Ryzen AI Max+ 395 w/ Radeon 8060S", "Radeon 8060S (Ryzen AI Max+ 395)", 256),
    ("AMD Ryzen 9 7950X 16-Core Processor", "Ryzen 9 7950X", 83),
    ("NVIDIA H100", "H100 SXM", 3350), ("RTX 2070", "GeForce RTX 2070", 448),
    ("RTX 2070 SUPER", "GeForce RTX 2070 SUPER", 448), ("RX 6800", "Radeon RX 6800", 512),
    ("GTX 1050", "GeForce GTX 1050", 112), ("GTX 1050 Ti", "GeForce GTX 1050 Ti", 112),
    ("Intel(R) Arc(TM) 140V GPU (16GB)", "Arc Graphics 130V/140V (integrated)", 136),
    ("AMD Radeon 890M Graphics", "Radeon 890M (integrated)", 120),
    ("Radeon 860M", "Radeon 840M / 860M Graphics", 120),
    # CPUs as /proc/cpuinfo and lscpu print them; X3D / HS / U / K / H parts kept apart
    ("AMD Ryzen 7 5800X3D 8-Core Processor", "Ryzen 7 5800X3D", 51),
    ("AMD Ryzen 7 5800X 8-Core Processor", "Ryzen 7 5800X", 51),
    ("AMD Ryzen 7 7840HS w/ Radeon 780M Graphics", "Ryzen 7 7840HS", 90),
    ("AMD Ryzen 7 7840U w/ Radeon 780M Graphics", "Ryzen 7 7840U", 102),
    ("13th Gen Intel(R) Core(TM) i5-13600K", "Core i5-13600K", 90),
    ("12th Gen Intel(R) Core(TM) i7-12700H", "Core i7-12700H", 77),
    ("12th Gen Intel(R) Core(TM) i7-12700K", "Core i7-12700K", 77),
    ("11th Gen Intel(R) Core(TM) i7-1165G7 @ 2.80GHz", "Core i7-1165G7", 68),
    ("Intel(R) Core(TM) Ultra 9 185H", "Core Ultra 9 185H", 120),
    ("Intel(R) Xeon(R) Gold 6248R CPU @ 3.00GHz", "Xeon Gold 6248R", 141),
    ("AMD Ryzen Threadripper PRO 5995WX 64-Cores", "Ryzen Threadripper PRO 5995WX", 204),
    ("Ampere Altra Max M128-30", "Ampere Altra Max", 204),
    ("NVIDIA B200", "B200", 8000), ("Quadro RTX 8000", "Quadro RTX 8000", 672),
    # older desktop CPUs; an Intel F part (no integrated GPU) is the same CPU as its sibling
    ("Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz", "Core i7-8700", 42.7),
    ("Intel(R) Core(TM) i7-8700K CPU @ 3.70GHz", "Core i7-8700K", 42.7),
    ("Intel(R) Core(TM) i5-10400F CPU @ 2.90GHz", "Core i5-10400", 42.7),
    ("13th Gen Intel(R) Core(TM) i9-13900KF", "Core i9-13900K", 90),
    ("AMD Ryzen 5 3600 6-Core Processor", "Ryzen 5 3600", 51.2),
    ("AMD Ryzen 7 5700G with Radeon Graphics", "Ryzen 7 5700G", 51.2),
])
def test_catalog_tells_variants_apart(name: str, entry: str, bw: float) -> None:
    """A variant token (Ti, SUPER, GRE, XT, laptop, SXM/PCIe) must agree, so a name is never
    taken for the sibling card with other memory or bandwidth."""
    spec = hardware.lookup(name)
    assert spec is not None and (spec.name, spec.bandwidth_gbps) == (entry, bw)


def test_catalog_has_no_laptop_part_for_a_desktop_only_entry() -> None:
    # no laptop RTX 3080 in the catalog: better an error than the desktop card's 760 GB/s
    assert hardware.lookup("RTX 3080 Laptop GPU") is None
    assert "GeForce RTX 3080" in hardware.closest_names("RTX 3080 Laptop GPU")


@pytest.mark.parametrize("name,mem", [("RTX 4060 Ti 16GB", 16), ("Tesla V100-SXM2-32GB", 32),
                                      ("Raspberry Pi 5 16GB", 16), ("M4 Max 128GB", 128),
                                      ("Apple M3 Max 48 GB", 48), ("A100 40GB", 40),
                                      ("Jetson AGX Orin 32GB", 32)])
def test_memory_size_in_the_name_sets_memory(name: str, mem: float) -> None:
    spec = hardware.lookup(name)
    assert spec is not None and spec.memory_gb == mem
    assert hardware.memory_in_name(name) == mem and hardware.memory_in_name("RTX 4060 Ti") is None


def test_apple_core_count_scales_compute() -> None:
    small, big = hardware.apple_chip("M2 Max", 30), hardware.apple_chip("M2 Max", 38)
    assert big.fp16_tflops / small.fp16_tflops == pytest.approx(38 / 30)
    assert small.device_class == "apple" and small.bandwidth_gbps == 400


@pytest.mark.parametrize("name,total,active", [
    ("Mixtral-8x7B-Instruct-v0.1-Q4_K_M.gguf", 46.7, 12.9), ("Llama-4-Scout-17B-16E-Instruct", 108.6, 17.2),
    ("DeepSeek-R1", 671.0, 37.0), ("DeepSeek-V3-0324", 671.0, 37.0), ("GLM-4.5-Air", 106.9, 12.0),
    ("Kimi-K2-Instruct", 1026.0, 32.6), ("Qwen3-235B-A22B-Instruct-2507", 235.1, 22.2),
    ("Llama-3.3-70B-Instruct", 70.6, 70.6), ("DeepSeek-R1-Distill-Qwen-7B", 7.62, 7.62),
])
def test_mixtures_of_experts_by_name_are_not_read_as_dense(name: str, total: float,
                                                           active: float) -> None:
    """A Mixtral or Llama 4 name once came out dense (8x7B: 44.8B all active; Scout: 17B in
    all), so its decode was predicted ~3.5x too slow and Scout's memory 6x too small."""
    m = architectures.lookup(name)
    assert m is not None and m.shape_known
    assert (m.params_b, m.active_params_b) == pytest.approx((total, active))


@pytest.mark.parametrize("name,layers,hidden,kv,vocab,active", [
    # popular models that had been estimated from their size (Qwen2.5-72B as 85 layers of 8384
    # with a 128k vocabulary; Command R and Phi-3.5-MoE not at all)
    ("Qwen2.5-72B-Instruct-Q4_K_M.gguf", 80, 8192, 8, 152064, 72.7),
    ("QwQ-32B", 64, 5120, 8, 152064, 32.8),
    ("DeepSeek-R1-Distill-Llama-70B", 80, 8192, 8, 128256, 70.6),
    ("Llama-2-70b-chat", 80, 8192, 8, 32000, 69.0), ("CodeLlama-34b-Instruct", 48, 8192, 8, 32000, 33.7),
    ("OLMo-2-1124-7B-Instruct", 32, 4096, 32, 100352, 7.3), ("Yi-1.5-6B-Chat", 32, 4096, 4, 64000, 6.06),
    ("Qwen1.5-14B-Chat", 40, 5120, 40, 152064, 14.2), ("granite-3.3-8b-instruct", 40, 4096, 8, 49155, 8.17),
    ("c4ai-command-r-08-2024", 40, 8192, 8, 256000, 32.3), ("c4ai-command-r-plus", 64, 12288, 8, 256000, 104.0),
    ("Phi-3.5-MoE-instruct", 32, 4096, 8, 32064, 6.6),
    # the first Gemma's 2B is not Gemma 2's (18 layers with one K/V head, not 26 with four)
    ("gemma-2b-it", 18, 2048, 1, 256000, 2.51), ("gemma-1.1-7b-it", 28, 3072, 16, 256000, 8.54),
    ("gemma-2-2b-it", 26, 2304, 4, 256000, 2.61),
    ("Qwen2-72B-Instruct", 80, 8192, 8, 152064, 72.7), ("DeepSeek-R1-Distill-Qwen-32B", 64, 5120, 8, 152064, 32.8),
    ("Mistral-Large-Instruct-2411-Q4_K_M.gguf", 88, 12288, 8, 32768, 123.0),
])
def test_popular_models_take_their_published_shapes(name: str, layers: int, hidden: int, kv: int,
                                                    vocab: int, active: float) -> None:
    m = architectures.lookup(name)
    assert m is not None and m.shape_known
    assert (m.n_layers, m.hidden_size, m.n_kv_heads, m.vocab_size) == (layers, hidden, kv, vocab)
    assert m.active_params_b == pytest.approx(active)


def test_an_unknown_nxm_merge_gets_two_experts_active() -> None:
    total, active = architectures.parse_sizes("some-4x7B-merge")
    assert total == pytest.approx(22.4) and active == pytest.approx(22.4 * (0.035 + 0.965 / 2))


def test_mla_models_cache_576_values_per_layer() -> None:
    # llama.cpp caches DeepSeek's compressed latent (512) and rope key (64); V is a view of it
    assert architectures.lookup("DeepSeek-V3").kv_elements_per_token() == 61 * 576


@pytest.mark.parametrize("name,cores,mem,bw", [
    ("Apple M3 Max 16-core CPU 40-core GPU 128GB", 40, 128, 400),
    ("M3 Max 30-core GPU 36GB", 30, 36, 300), ("M4 Max 32-core GPU", 32, 36, 410),
    ("M4 Pro 14-core CPU 20-core GPU 48GB unified memory", 20, 48, 273),
    ("Apple M2 Ultra with 76-core GPU", 76, 64, 800),
])
def test_apple_configurations_as_apple_names_them(name: str, cores: int, mem: float,
                                                  bw: float) -> None:
    spec = hardware.lookup(name)
    assert spec is not None and spec.device_class == "apple"
    assert (spec.compute_units, spec.memory_gb, spec.bandwidth_gbps) == (cores, mem, bw)


@pytest.mark.parametrize("tag,table_key", [
    ("mixtral:8x7b", "mixtral-8x7b"), ("llama4:scout", "llama-4-scout-17b-16e"),
    ("qwen3:30b", "qwen3-30b-a3b"), ("qwen3-coder:30b", "qwen3-30b-a3b"),
    ("qwen3:235b", "qwen3-235b-a22b"), ("deepseek-coder-v2:16b", "deepseek-coder-v2-lite"),
    ("deepseek-r1:14b", "qwen2.5-14b"), ("deepseek-r1:70b", "llama-3.3-70b"),
    ("gemma3n:e4b", "gemma-3n-e4b"), ("phi4:14b", "phi-4"), ("phi3:mini", "phi-3-mini"),
    ("qwen3:32b", "qwen3-32b"), ("qwen3.5:35b-mlx", "qwen3.5-35b-a3b"),
])
def test_ollama_tags_take_the_table_shape(tag: str, table_key: str) -> None:
    """ollama's name:size tags: `deepseek-coder-v2:16b` is the 2.4B-active Lite MoE, not a
    dense 16B; `qwen3:30b` the 30B-A3B."""
    m, want = architectures.lookup(tag), architectures.KNOWN[table_key]
    assert m is not None and (m.params_b, m.active_params_b, m.n_layers) == \
        (want.params_b, want.active_params_b, want.n_layers)


def test_k_quant_widths_off_the_256_block_take_the_quantizers_fallback(row) -> None:
    """llama.cpp stores a tensor whose rows are not whole 256-weight blocks in a 32-block type
    (Q4_K -> Q5_0, Q6_K -> Q8_0): Gemma 3 270M's Q4_K_M file (hidden 640) holds 65% of its
    body that way, 5.43 bits a weight by its tensor list; Llama 3 8B (4096) none."""
    from tightfit.predictor import formats
    from tightfit.predictor.scenario import parse_row, stored_bits

    row["model"] = {"name": "gemma-3-270m"}
    s = parse_row(row)
    assert 5.3 < s.bits_per_weight < 5.5
    assert formats.shape_fallback_share(640, 1024, 256, 2048) == pytest.approx(
        640 * (1024 + 512 + 4096) / (640 * (1024 + 512 + 4096) + 1024 * 640 + 2048 * 640))
    row["model"] = {"name": "Meta-Llama-3-8B"}  # 4096 wide: no fallback, the preset's mix
    assert parse_row(row).bits_per_weight == pytest.approx(
        formats.mixed_preset_bits("q4_k_m", 4096, 4096, 1024, 14336, 32, 32,
                                  8.03e9 - 2 * 128256 * 4096))
    row["model"] = {"name": "gemma-3-270m"}
    row["quant"] = "Q4_0"  # already a 32-block type: nothing to fall back from
    assert parse_row(row).bits_per_weight == 4.5
    row["quant"] = "Q6_K"
    assert parse_row(row).bits_per_weight > 7.5
    # an estimated shape is not trusted with this: its widths (multiples of 64) take no fallback
    from tightfit.predictor import architectures
    guess = architectures.estimate_shape("x", 0.3)
    assert guess.hidden_size % 256 and 4.7 < stored_bits("q4_k_m", guess) < 4.85


def test_fallback_bits_match_the_real_gemma_3_270m_file(row) -> None:
    """The packaged Gemma 3 270M Q4_K_M file, tensor by tensor: its decoder weights (all but the
    token embedding) average the bits the predictor now gives the model, within 3%."""
    gguf = pytest.importorskip("gguf")
    from tightfit.engine.loader.resolve import resolve_model
    from tightfit.predictor.scenario import parse_row

    reader = gguf.GGUFReader(str(resolve_model("gemma3")))
    n = bits = 0.0
    for t in reader.tensors:
        if t.name == "token_embd.weight" or len(t.shape) < 2:
            continue
        n += int(t.n_elements)
        bits += 8.0 * int(t.n_bytes)
    row["model"] = {"name": "gemma-3-270m"}
    assert parse_row(row).bits_per_weight == pytest.approx(bits / n, rel=0.001)
    assert bits / n > 4.85 * 1.08  # the preset's average would be 10% short


def test_q4_k_m_bits_follow_the_quantizers_choice_of_tensors() -> None:
    """llama-quantize's Q4_K_M stores attn_v and ffn_down in Q6_K for the layers its
    use_more_bits picks (about half) and the rest in Q4_K, so a grouped-query model's small V
    averages fewer bits than an MHA model's. The weight bytes predicted for public Q4_K_M files
    come within 0.5% of the sizes listed for them, where the preset's one average (4.85 bits)
    was 0.8-1.3% high on all but one."""
    from tightfit.predictor import engines, formats, memory
    from tightfit.predictor.scenario import parse_row

    # use_more_bits: n/8 first, the last eighth, every third between
    assert formats.more_bits_share(18) == pytest.approx(9 / 18)  # the 270M file's 9 of 18
    assert formats.more_bits_share(48) == pytest.approx(24 / 48)
    listed_gb = {"Yi-1.5-34B-Chat": 20.66, "Qwen2.5-14B-Instruct": 8.99,
                 "Meta-Llama-3.1-8B-Instruct": 4.92, "Mistral-7B-Instruct-v0.3": 4.37,
                 "Qwen2.5-32B-Instruct": 19.85, "Phi-3-mini-4k-instruct": 2.39}
    old_off = []
    for name, gb in listed_gb.items():
        s = parse_row({"id": name, "model": {"name": name}, "quant": "Q4_K_M",
                       "engine": "llama.cpp", "hardware": {"name": "RTX 4090"},
                       "workload": {"prompt_tokens": 16, "gen_tokens": 16}})
        prof = engines.for_scenario(s)
        assert memory.weight_bytes(s, prof) / 1e9 == pytest.approx(gb, rel=0.005), name
        old = memory.weight_bytes(replace(s, bits_per_weight=4.85), prof) / 1e9
        old_off.append(old / gb - 1)
    assert sum(o > 0.007 for o in old_off) >= 4
    # Phi's fused attn_qkv is typed as attn_v: Phi-3-mini's file averages ~5 bits
    assert parse_row({"id": "p", "model": {"name": "Phi-3-mini-4k-instruct"}, "quant": "Q4_K_M",
                      "engine": "llama.cpp", "hardware": {"name": "RTX 4090"}}
                     ).bits_per_weight > 4.95


def test_gemma_4_full_attention_layers_hold_their_own_k_v_size(row) -> None:
    """Gemma 4 31B: 50 layers on a 1024-token window with 16 K/V heads of 256, 10 full layers
    with 4 of 512 (half a window layer's K/V a token). At 4,096 tokens llama.cpp holds the
    window + 512 cells on the window layers and the whole context on the full ones."""
    from tightfit.predictor import engines, memory
    from tightfit.predictor.scenario import parse_row

    row.update(model={"name": "gemma-4-31B-it-Q4_K_M.gguf"}, quant="Q4_K_M", engine="llama.cpp",
               workload={"prompt_tokens": 64, "gen_tokens": 64, "context_tokens": 4096})
    s = parse_row(row)
    assert s.model.full_kv_scale == 0.5 and s.model.window_layers == 50
    window = 2 * 16 * 256 * 2  # bytes a token in a window layer, f16
    want = 50 * 1536 * window + 10 * 4096 * window * 0.5
    assert memory.kv_bytes(s, engines.for_scenario(s), 4096) == pytest.approx(want)
    # at every size the full layers' K/V a token is what their heads make it
    from tightfit.predictor import architectures
    for name, kv_heads in (("gemma-4-12b", 1), ("gemma-4-26b-a4b", 2), ("gemma-4-31b", 4)):
        m = architectures.KNOWN[name]
        assert m.full_kv_scale * m.n_kv_heads * m.head_dim == kv_heads * 512


def test_full_kv_scale_can_be_given_and_is_checked(row) -> None:
    from tightfit.predictor.scenario import RowError, parse_row

    row.update(model={"name": "gemma-3-1b", "full_kv_scale": 0.5}, quant="Q4_K_M",
               engine="llama.cpp")
    assert parse_row(row).model.full_kv_scale == 0.5
    row["model"]["full_kv_scale"] = -1
    with pytest.raises(RowError, match="model.full_kv_scale"):
        parse_row(row)


def test_layers_that_share_an_earlier_layers_k_v_hold_none(row) -> None:
    """Gemma 3n E4B: llama.cpp's gemma3n.cpp holds K/V in the first 20 of its 35 layers; the
    last 15 attend to it. Held K/V is 20/35 of every layer's; what a decode step reads is not
    cut (every layer still attends)."""
    from dataclasses import replace

    from tightfit.predictor import engines, memory
    from tightfit.predictor.scenario import RowError, parse_row

    row.update(model={"name": "gemma-3n-E4B-it-Q4_K_M.gguf"}, quant="Q4_K_M",
               engine="llama.cpp",
               workload={"prompt_tokens": 64, "gen_tokens": 64, "context_tokens": 32768})
    s = parse_row(row)
    prof = engines.for_scenario(s)
    unshared = replace(s, model=replace(s.model, kv_shared_layers=0))
    assert s.model.kv_shared_layers == 15
    assert memory.kv_bytes(s, prof, 32768) == pytest.approx(
        memory.kv_bytes(unshared, prof, 32768) * 20 / 35)
    assert memory.kv_bytes(s, prof, 32768, read=True) == memory.kv_bytes(
        unshared, prof, 32768, read=True)
    assert any("K/V held by 20 of 35 layers" in n for n in s.notes)
    row["model"] = {"name": "gemma-3n-E4B-it", "kv_shared_layers": 35}
    with pytest.raises(RowError, match="model.kv_shared_layers"):
        parse_row(row)


def test_every_k_quant_preset_follows_its_per_layer_types() -> None:
    """Q2_K to Q6_K as llama-quantize types each tensor (Q2_K: attn_v at Q4_K on a grouped-query
    model, ffn_down and attn_output at Q3_K; Q3_K_M: attn_v Q5_K / Q4_K, ffn_down Q5_K in the
    first 1/16 then Q4_K, attn_output Q4_K; ...): the weights of public Llama 3.1 8B and
    Qwen2.5-14B files within 0.5% of their listed sizes. Q2_K's one average (2.625 bits, its
    base type) was 9% short, enough to call a file that does not fit a fit."""
    from tightfit.predictor import engines, formats, memory
    from tightfit.predictor.scenario import parse_row

    listed = {("Meta-Llama-3.1-8B-Instruct", "Q2_K"): 3.18,
              ("Meta-Llama-3.1-8B-Instruct", "Q3_K_M"): 4.02,
              ("Meta-Llama-3.1-8B-Instruct", "Q4_K_S"): 4.69,
              ("Meta-Llama-3.1-8B-Instruct", "Q5_K_M"): 5.73,
              ("Qwen2.5-14B-Instruct", "Q2_K"): 5.77, ("Qwen2.5-14B-Instruct", "Q3_K_L"): 7.92,
              ("Qwen2.5-14B-Instruct", "Q5_K_S"): 10.27}
    for (name, quant), gb in listed.items():
        s = parse_row({"id": "k", "model": {"name": name}, "quant": quant,
                       "engine": "llama.cpp", "hardware": {"name": "RTX 4090"}})
        prof = engines.for_scenario(s)
        assert memory.weight_bytes(s, prof) / 1e9 == pytest.approx(gb, rel=0.005), (name, quant)
        if quant == "Q2_K":
            old = replace(s, bits_per_weight=formats.bits_per_weight(quant))
            assert memory.weight_bytes(old, prof) / 1e9 < 0.92 * gb


def test_trained_contexts_from_the_table_and_from_a_name_tag() -> None:
    """The table's trained context for families with one value at every size; a variant named
    by its context ("-128k", "-16K") takes the name's; a family without one stays unknown (0)."""
    from tightfit.predictor.architectures import lookup

    cases = {"Meta-Llama-3-8B-Instruct": 8192, "Llama-3.1-70B-Instruct": 131072,
             "gemma-2-9b-it": 8192, "gemma-3-1b-it": 32768, "gemma-3-12b-it": 131072,
             "phi-4": 16384, "Phi-4-mini-instruct": 131072, "gpt-oss-20b": 131072,
             "Phi-3-mini-4k-instruct": 4096, "Phi-3-mini-128k-instruct": 131072,
             "Yi-1.5-9B-Chat-16K": 16384, "Qwen2.5-7B-Instruct": 0, "Yi-1.5-9B-Chat": 0}
    assert {n: lookup(n).trained_context for n in cases} == cases
