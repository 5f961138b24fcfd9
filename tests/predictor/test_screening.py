"""Feature screening finds the real drivers on synthetic data and drops noise."""
from __future__ import annotations

import random

import pytest

from tightfit.predictor import models, screening


def _data(n: int = 240, seed: int = 0):
    rng = random.Random(seed)
    rows, y, groups = [], [], []
    for i in range(n):
        f = {"a": rng.gauss(0, 1), "b": rng.gauss(0, 1), "noise": rng.gauss(0, 1)}
        rows.append(f)
        y.append(0.5 * f["a"] + 0.4 * f["a"] * f["b"] + rng.gauss(0, 0.05))
        groups.append(f"g{i % 12}")
    return rows, y, groups


def test_drops_noise_and_finds_the_cross() -> None:
    rows, y, groups = _data()
    sel = screening.select(rows, y, groups, ["a", "b", "noise"], "decode")
    assert "a" in sel.kept and "noise" not in sel.kept
    assert ("a", "b") in sel.crosses or ("b", "a") in sel.crosses
    assert sel.sensitivity["a"] > 10 * sel.sensitivity["noise"]
    assert sel.cv_r2 > 0.9


def test_model_round_trips_through_json(tmp_path) -> None:
    rows, y, _ = _data(60)
    m = models.fit("decode", rows, y, ["a", "b"], [("a", "b")])
    pm = models.PredictorModel(m, m, "h")
    pm.save(tmp_path / "m.json")
    back = models.PredictorModel.load(tmp_path / "m.json")
    assert back.decode.predict_log(rows[3]) == m.predict_log(rows[3])


def test_inputs_are_clipped_to_the_training_range() -> None:
    rows, y, _ = _data(60)
    m = models.fit("decode", rows, y, ["a"], [])
    far = m.predict_log({"a": 1e6})
    edge = m.predict_log({"a": max(r["a"] for r in rows)})
    assert far == edge


def test_a_device_is_clipped_to_the_range_its_own_class_covered(tmp_path) -> None:
    """GPUs span bandwidth 0..1 with a slope; the only CPUs sat at 0. A CPU at 0.8 gets the
    CPU value, not the GPUs' slope; a GPU at 0.8 still follows the slope; a class never seen
    falls back to the global range. Survives the JSON round trip."""
    rng = random.Random(1)
    rows, y = [], []
    for _ in range(80):
        bw = rng.random()
        rows.append({"bw": bw, "class_gpu": 1.0, "class_cpu": 0.0, "class_edge": 0.0})
        y.append(2.0 * bw)
    for _ in range(20):
        rows.append({"bw": 0.0, "class_gpu": 0.0, "class_cpu": 1.0, "class_edge": 0.0})
        y.append(0.0)
    m = models.fit("decode", rows, y, ["bw"], [])
    cpu = {"bw": 0.8, "class_gpu": 0.0, "class_cpu": 1.0, "class_edge": 0.0}
    gpu = {**cpu, "class_gpu": 1.0, "class_cpu": 0.0}
    edge = {**cpu, "class_cpu": 0.0, "class_edge": 1.0}
    assert m.predict_log(cpu) == m.predict_log({**cpu, "bw": 0.0})
    assert m.predict_log(gpu) > m.predict_log(cpu) + 1.0
    assert m.predict_log(edge) == m.predict_log(gpu)
    pm = models.PredictorModel(m, m, "h")
    pm.save(tmp_path / "m.json")
    assert models.PredictorModel.load(tmp_path / "m.json").decode.predict_log(cpu) == \
        m.predict_log(cpu)


def test_brief_factors_are_candidates_only_where_the_ablation_kept_them() -> None:
    from tightfit.predictor import features

    brief = set(features.BRIEF_FEATURES)
    assert not brief & set(features.candidate_names("decode"))
    assert not brief & set(features.candidate_names("prefill"))  # since the base fixes of 12-05
    assert brief <= set(features.candidate_names("prefill", "all"))
    assert brief <= set(features.candidate_names("decode", "all"))
    assert not brief & set(features.candidate_names("prefill", "none"))


def test_device_rate_features_are_left_out_of_decode_unless_asked_for() -> None:
    """Decode's residual does not see the compute-rate features (they move with a CPU run's
    thread count; the analytic base carries that), prefill's does; the ablation puts them back."""
    from tightfit.predictor import features

    rates = set(features.RATE_FEATURES)
    assert not rates & set(features.candidate_names("decode"))
    # prefill's compute share is near 1 on every row: a lever, not a rate (PHASE_EXCLUDED)
    assert rates - {"share_compute"} <= set(features.candidate_names("prefill"))
    assert "share_compute" not in features.candidate_names("prefill", "all", "all")
    assert rates <= set(features.candidate_names("decode", rates="all"))
    with pytest.raises(ValueError, match="rates must be"):
        features.candidate_names("decode", rates="some")


def test_a_cpu_run_on_more_threads_is_predicted_faster_in_decode() -> None:
    """The packaged model on this machine's description at 1 and 2 threads: a 4-bit decode,
    which the data show 1.47-1.57x faster on two threads (int4-g64, default model), must come
    out clearly faster on two (the model before the fused-kernel priors said 1.22x). Bandwidth:
    the machine's 24.8 GB/s copy rate as its rated equivalent (hardware.COPY_OF_PEAK)."""
    from tightfit.predictor import predict
    from tightfit.predictor.hardware import COPY_OF_PEAK

    rows = [{"id": f"t{n}", "hardware": {"name": "cpu", "kind": "cpu", "memory_gb": 23.5,
                                         "memory_bandwidth_gbps": 24.8 / COPY_OF_PEAK,
                                         "fp16_tflops": 0.0925 * n, "cpu_cores": n},
             "model": "SmolLM2-135M", "quant": "int4-g64", "engine": "tightfit",
             "workload": {"prompt_tokens": 128, "gen_tokens": 128}} for n in (1, 2)]
    one, two = predict(rows)
    assert "error" not in one and "error" not in two
    assert two["decode_tok_s"] > 1.35 * one["decode_tok_s"]


def test_two_crosses_sharing_a_part_keep_it_once() -> None:
    """y = a x c + b x c with c alone worth nothing: both crosses are found, and c, brought in by
    each, is one column of the fit (it was two, a fit unlike the one CV had scored)."""
    rng = random.Random(1)
    rows, y, groups = [], [], []
    for i in range(300):
        f = {"a": rng.gauss(0, 1), "b": rng.gauss(0, 1), "c": rng.gauss(0, 1)}
        rows.append(f)
        y.append(0.6 * f["a"] * f["c"] + 0.6 * f["b"] * f["c"] + 0.3 * f["a"]
                 + rng.gauss(0, 0.05))
        groups.append(f"g{i % 12}")
    sel = screening.select(rows, y, groups, ["a", "b", "c"], "decode")
    pairs = {frozenset(p) for p in sel.crosses}
    assert {frozenset(("a", "c")), frozenset(("b", "c"))} <= pairs
    assert len(sel.kept) == len(set(sel.kept)) and "c" in sel.kept


def test_features_named_always_survive_screening() -> None:
    """The residual is keyed by engine: an engine flag that device-grouped CV cannot judge (here
    pure noise, so its sensitivity is near zero) is still kept when named in `always`."""
    rows, y, groups = _data()
    sel = screening.select(rows, y, groups, ["a", "b", "noise"], "decode", always=("noise",))
    assert "noise" in sel.kept and "a" in sel.kept


def test_llama_cpp_computes_q4_0_faster_on_a_cpu_only() -> None:
    """ggml repacks Q4_0 for its CPU kernels (measured 2.4-3.0x prefill, 1.26-1.29x decode
    against Q4_1 on this machine): the analytic base knows it on CPUs, not on GPUs."""
    from tightfit.predictor.roofline import analyse
    from tightfit.predictor.scenario import parse_row

    def rates(kind: str, quant: str) -> tuple[float, float]:
        hw = {"name": "x", "kind": kind, "memory_gb": 24, "memory_bandwidth_gbps": 25,
              "fp16_tflops": 0.2 if kind == "cpu" else 20, "cpu_cores": 2}
        s = parse_row({"id": "q", "hardware": hw, "model": "SmolLM2-135M", "quant": quant,
                       "engine": "llama.cpp",
                       "workload": {"prompt_tokens": 512, "gen_tokens": 128}})
        b = analyse(s)
        return 512 / b.prefill.total, 1 / b.decode.total

    (p40, d40), (p41, d41) = rates("cpu", "Q4_0"), rates("cpu", "Q4_1")
    assert p40 > 1.8 * p41 and d40 > d41
    (g40, _), (g41, _) = rates("gpu", "Q4_0"), rates("gpu", "Q4_1")
    assert g40 / g41 < 1.2


def test_the_lite_runtime_prompts_float_weights_slower_than_blocks() -> None:
    """Its prompt kernel multiplies float weights against f32 activations (measured 0.7x the
    Q4_1 rate) and Q8_0 blocks with integer dot products (1.1x): compute time follows."""
    from tightfit.predictor.roofline import analyse
    from tightfit.predictor.scenario import parse_row

    def comp_s(quant: str) -> float:
        hw = {"name": "x", "kind": "cpu", "memory_gb": 24, "memory_bandwidth_gbps": 25,
              "fp16_tflops": 0.2, "cpu_cores": 2}
        s = parse_row({"id": "q", "hardware": hw, "model": "SmolLM2-135M", "quant": quant,
                       "engine": "tightfit-lite",
                       "workload": {"prompt_tokens": 512, "gen_tokens": 128}})
        return analyse(s).prefill.comp_s

    assert comp_s("F16") == pytest.approx(comp_s("Q4_1") / 0.7)
    assert comp_s("Q8_0") == pytest.approx(comp_s("Q4_1") / 1.1)
    assert comp_s("Q4_0") == pytest.approx(comp_s("Q4_1"))


def test_prefill_gives_a_class_it_never_saw_the_analytic_base_alone(tmp_path) -> None:
    """With `unseen_class_physics` (prefill's residual), a device of a class with no training
    row gets no correction; seen classes keep theirs; it survives the JSON round trip. The
    packaged model sets it for prefill only."""
    from dataclasses import replace

    from tightfit.predictor import artefact

    rows = [{"bw": 0.1 * i, "class_gpu": 0.0, "class_cpu": 1.0, "class_edge": 0.0}
            for i in range(20)]
    m = replace(models.fit("prefill", rows, [0.5 + r["bw"] for r in rows], ["bw"], []),
                unseen_class_physics=True)
    cpu = rows[5]
    edge = {**cpu, "class_cpu": 0.0, "class_edge": 1.0}
    assert abs(m.predict_log(cpu) - 1.0) < 0.1 and m.predict_log(edge) == 0.0
    pm = models.PredictorModel(m, m, "h")
    pm.save(tmp_path / "m.json")
    assert models.PredictorModel.load(tmp_path / "m.json").prefill.predict_log(edge) == 0.0
    shipped = artefact.load()
    assert shipped.prefill.unseen_class_physics and not shipped.decode.unseen_class_physics


def test_decode_gives_a_class_placed_by_one_device_the_analytic_base_alone(tmp_path) -> None:
    """With `unplaced_class_physics` (decode's residual), a device of a class the training rows
    hold fewer than two devices of gets no correction, though one device of it was in the
    training rows; placed classes keep theirs; it survives the JSON round trip. The shipped
    model, fitted through `training.fit_phase`, carries the flag for decode only."""
    from dataclasses import replace

    from tightfit.predictor import artefact, training

    rows = [{"bw": 0.1 * i, "class_cpu": 1.0, "class_unified_soc": 0.0} for i in range(20)]
    m = replace(models.fit("decode", rows, [0.5 + r["bw"] for r in rows], ["bw"], []),
                unplaced_class_physics=True, known_classes=("cpu",))
    cpu = rows[5]
    soc = {**cpu, "class_cpu": 0.0, "class_unified_soc": 1.0}
    assert abs(m.predict_log(cpu) - 1.0) < 0.1 and m.predict_log(soc) == 0.0
    assert replace(m, unplaced_class_physics=False).predict_log(soc) != 0.0  # the rule acts
    pm = models.PredictorModel(m, m, "h")
    pm.save(tmp_path / "m.json")
    assert models.PredictorModel.load(tmp_path / "m.json").decode.predict_log(soc) == 0.0
    shipped = artefact.load()
    assert shipped.decode.unplaced_class_physics and not shipped.prefill.unplaced_class_physics
    # every class of the shipped fit is placed: its decode answers keep the residual
    assert set(shipped.decode.known_classes) >= {"apple", "cpu", "discrete_gpu", "unified_soc"}
    assert training.features.PHYSICS_FOR_UNPLACED_CLASS == ("decode",)


def test_a_class_flag_needs_two_devices_of_its_class() -> None:
    from tightfit.predictor import training

    def row(cls: str) -> dict[str, float]:
        return {"class_cpu": float(cls == "cpu"), "class_unified_soc": float(cls == "unified_soc"),
                "class_apple": float(cls == "apple"), "log_bandwidth": 3.0}

    names = ["log_bandwidth", "class_cpu", "class_unified_soc", "class_apple"]
    one_igpu = training.Sample([row("cpu"), row("cpu"), row("unified_soc"), row("unified_soc")],
                               [0.0] * 4, ["xeon", "epyc", "arc", "arc"], [1.0] * 4)
    # two CPUs keep class_cpu; one iGPU (two rows of it) does not make a class; no Apple rows
    assert training.supported(names, one_igpu) == ["log_bandwidth", "class_cpu"]
    two = training.Sample(one_igpu.rows + [row("unified_soc")], [0.0] * 5,
                          one_igpu.groups + ["gb10"], [1.0] * 5)
    assert training.supported(names, two) == ["log_bandwidth", "class_cpu", "class_unified_soc"]


def test_a_device_of_a_class_the_data_cannot_place_gets_the_average_class_level(tmp_path) -> None:
    # Two classes with their own level (gpu +1, cpu -1) and one device of a third class (+3)
    # whose rows are the only ones with both flags at zero. A device of that third class, or of
    # a class never seen, must not inherit the one device's level: it gets the average.
    from dataclasses import replace

    rows, y = [], []
    for cls, level, n in (("gpu", 1.0, 30), ("cpu", -1.0, 30), ("edge", 3.0, 4)):
        for i in range(n):
            rows.append({"bw": 0.01 * i, "class_gpu": float(cls == "gpu"),
                         "class_cpu": float(cls == "cpu"), "class_edge": float(cls == "edge")})
            y.append(level)
    plain = models.fit("decode", rows, y, ["bw", "class_gpu", "class_cpu"])
    edge = rows[-1]
    assert plain.predict_log(edge) > 2.0  # the ridge gives the all-zero flags the edge device's level
    m = replace(plain, known_classes=("cpu", "gpu"))
    assert abs(m.predict_log(rows[0]) - 1.0) < 0.2 and abs(m.predict_log(rows[30]) + 1.0) < 0.2
    # z = 0 for the class flags: the intercept (bw's z is ~0 for the last edge row)
    bw_z = (edge["bw"] - plain.mean[0]) / plain.scale[0]
    assert abs(m.predict_log(edge) - (plain.intercept + plain.coef[0] * bw_z)) < 1e-9
    assert abs(m.predict_log(edge) - 0.2) < 0.5 and abs(plain.predict_log(edge) - m.predict_log(edge)) > 1.5
    pm = models.PredictorModel(m, m, "h")
    pm.save(tmp_path / "m.json")
    assert models.PredictorModel.load(tmp_path / "m.json").decode.predict_log(edge) == m.predict_log(edge)


def test_fitting_records_the_classes_with_enough_devices() -> None:
    from tightfit.predictor import artefact, training

    shipped = artefact.load()
    for phase in (shipped.decode, shipped.prefill):
        assert "cpu" in phase.known_classes and "apple" in phase.known_classes
    smp = training.Sample([{"class_cpu": 1.0, "class_edge": 0.0}] * 3 + [{"class_cpu": 0.0, "class_edge": 1.0}],
                          [0.0] * 4, ["a", "b", "b", "c"], [1.0] * 4)
    assert sorted(c for c, d in training._class_devices(smp).items() if len(d) >= 2) == ["cpu"]


def test_a_two_die_chip_is_flagged_and_the_decode_residual_keeps_the_flag(row) -> None:
    from tightfit.predictor import artefact, features, hardware, roofline
    from tightfit.predictor.scenario import parse_row

    assert hardware.lookup("Apple M2 Ultra").dies == 2 and hardware.lookup("M2 Max").dies == 1
    row["hardware"] = {"name": "M3 Ultra", "memory_gb": 192}
    ultra = parse_row(row)
    assert features.features(ultra, roofline.analyse(ultra), "decode")["multi_die"] == 1.0
    row["hardware"] = {"name": "M3 Max", "memory_gb": 64}
    assert features.features(parse_row(row), roofline.analyse(parse_row(row)), "decode")["multi_die"] == 0.0
    row["hardware"] = {"name": "some-board", "kind": "gpu", "memory_gb": 64,
                       "memory_bandwidth_gbps": 800, "fp16_tflops": 50, "dies": 2}
    assert parse_row(row).device.dies == 2
    shipped = artefact.load().decode
    assert "multi_die" in shipped.base
    # the shipped residual puts a two-die chip below its one-die twin
    with_flag = features.features(ultra, roofline.analyse(ultra), "decode")
    assert shipped.predict_log(with_flag) < shipped.predict_log({**with_flag, "multi_die": 0.0}) - 0.1


def test_a_die_count_outside_the_plausible_range_names_the_field(row) -> None:
    from tightfit.predictor.scenario import RowError, parse_row

    row["hardware"]["dies"] = -2
    with pytest.raises(RowError, match="hardware.dies"):
        parse_row(row)


def test_an_engine_without_training_rows_gets_the_analytic_base_alone(tmp_path) -> None:
    """Fitted on llama.cpp and tightfit rows only, a lite-runtime row gets no residual (its
    flag untrained, the intercept another engine's level); seen engines keep theirs; the rule
    survives the JSON round trip. The packaged model applies it in decode (all four engines
    known), not in prefill."""
    from dataclasses import replace

    from tightfit.predictor import artefact, features, roofline
    from tightfit.predictor.engines import ENGINES
    from tightfit.predictor.scenario import parse_row

    for engine in ENGINES:  # every engine's features name it back
        sc = parse_row({"id": "x", "hardware": {"name": "Ryzen 9 7950X"},
                        "model": "SmolLM2-135M", "quant": "Q4_1", "engine": engine})
        assert models.engine_of(features.features(sc, roofline.analyse(sc), "decode")) == engine
    rows, y = [], []
    for engine, level in (("llama.cpp", -0.3), ("tightfit", 0.2)):
        for i in range(20):
            rows.append({"bw": 0.05 * i, "engine_hf": 0.0, "engine_lite": 0.0,
                         "engine_tightfit": float(engine == "tightfit")})
            y.append(level)
    plain = models.fit("decode", rows, y, ["bw", "engine_tightfit", "engine_lite"])
    m = replace(plain, known_engines=("llama.cpp", "tightfit"))
    lite = {**rows[0], "engine_lite": 1.0}
    assert models.engine_of(lite) == "tightfit-lite" and models.engine_of(rows[0]) == "llama.cpp"
    assert plain.predict_log(lite) < -0.2  # without the rule: llama.cpp's level
    assert m.predict_log(lite) == 0.0
    assert abs(m.predict_log(rows[0]) + 0.3) < 0.1 and abs(m.predict_log(rows[20]) - 0.2) < 0.1
    pm = models.PredictorModel(m, m, "h")
    pm.save(tmp_path / "m.json")
    assert models.PredictorModel.load(tmp_path / "m.json").decode.predict_log(lite) == 0.0
    shipped = artefact.load()
    assert set(shipped.decode.known_engines) == set(ENGINES) and not shipped.prefill.known_engines
    assert features.PHYSICS_FOR_UNSEEN_ENGINE == ("decode",)
