"""The learned part: a ridge regression on the log ratio measured/analytic, one per phase.

Fitted with scikit-learn (imported only when fitting); stored as plain JSON numbers so that
prediction needs neither scikit-learn nor numpy. Features may include crosses "a*b" of two
standardised base features.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from tightfit.predictor.features import ENGINE_FLAGS

ALPHAS = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)


@dataclass(frozen=True)
class ResidualModel:
    """log(measured / analytic) = intercept + sum coef_j * z_j, z standardised (crosses of z's)."""

    phase: str
    base: tuple[str, ...]                 # base features used (standardised)
    crosses: tuple[tuple[str, str], ...]  # products of two standardised base features
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]               # len(base) + len(crosses)
    intercept: float
    alpha: float
    interval: tuple[float, float] = (-0.3, 0.3)  # held-out log-residual quantiles (5%, 95%)
    # The same quantiles for each device class with enough held-out residuals of its own
    # (training.MIN_BAND_ROWS): a CPU's band is not a GPU's. Others take `interval`.
    class_interval: dict[str, tuple[float, float]] = field(default_factory=dict)
    info: dict[str, object] = field(default_factory=dict)
    z_lo: tuple[float, ...] = ()   # standardised training range; inputs are clipped to it so a
    z_hi: tuple[float, ...] = ()   # scenario unlike the data falls back towards the analytic base
    # The same range per device class seen in training ("cpu": (lo, hi)): a device is clipped to
    # what its own class covered, so a CPU unlike every training CPU is not placed by a slope
    # that GPUs and Apple chips taught (a 77 GB/s Xeon extrapolated from a 25 GB/s EPYC along
    # the GPUs' bandwidth trend came out 2.3x too fast).
    class_z: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = field(default_factory=dict)
    # True: a device of a class with no training row gets no residual (the analytic base alone)
    # instead of the slopes other classes taught (features.PHYSICS_FOR_UNSEEN_CLASS).
    unseen_class_physics: bool = False
    # True: the same for a device of a class the training rows do not place (fewer than
    # features.MIN_CLASS_DEVICES devices of it: `known_classes`), e.g. the GB10 when the only
    # other integrated-GPU SoC is a 2-row Intel iGPU (features.PHYSICS_FOR_UNPLACED_CLASS).
    unplaced_class_physics: bool = False
    # Device classes whose level the training rows pin down (a flag of their own, or the
    # reference of the flags, from enough devices: features.MIN_CLASS_DEVICES). A device of
    # any other class gets its class flags at their training mean (z = 0), the average level,
    # instead of the level of whatever few rows shared its all-zero flags. Empty: no rule.
    known_classes: tuple[str, ...] = ()
    # Engines with training rows. A scenario of any other engine gets no residual (the analytic
    # base alone): the intercept is the level of the engines it was fitted on, and without a row
    # the engine's own flag is untrained. Arises when a split holds out every row of an engine
    # (held out by model, the lite runtime's rows are all of the default model: with llama.cpp's
    # CPU level instead of its own, they read 42% decode MAPE). Set for the phases in
    # features.PHYSICS_FOR_UNSEEN_ENGINE; empty: no rule.
    known_engines: tuple[str, ...] = ()

    def predict_log(self, feats: dict[str, float]) -> float:
        if self.known_engines and engine_of(feats) not in self.known_engines:
            return 0.0
        cls = device_class_of(feats)
        if self.unseen_class_physics and self.class_z and cls not in self.class_z:
            return 0.0
        if self.unplaced_class_physics and self.known_classes and cls not in self.known_classes:
            return 0.0
        z = {n: (feats[n] - mu) / sd for n, mu, sd in zip(self.base, self.mean, self.scale)}
        placed = not self.known_classes or cls in self.known_classes
        lo_hi = (self.class_z.get(cls) if placed else None) or (self.z_lo, self.z_hi)
        if lo_hi[0]:
            z = {n: min(hi, max(lo, z[n])) for n, lo, hi in zip(self.base, *lo_hi)}
        if not placed:
            z = {n: 0.0 if n.startswith("class_") else v for n, v in z.items()}
        cols = [z[n] for n in self.base] + [z[a] * z[b] for a, b in self.crosses]
        return self.intercept + sum(c * x for c, x in zip(self.coef, cols))

    def band(self, device_class: str) -> tuple[float, float]:
        """The 5% / 95% held-out log-residual quantiles for a device of this class."""
        return self.class_interval.get(device_class, self.interval)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, object]) -> "ResidualModel":
        return ResidualModel(
            phase=str(d["phase"]), base=tuple(d["base"]),  # type: ignore[arg-type]
            crosses=tuple(tuple(c) for c in d["crosses"]),  # type: ignore[union-attr,misc]
            mean=tuple(d["mean"]), scale=tuple(d["scale"]),  # type: ignore[arg-type]
            coef=tuple(d["coef"]), intercept=float(d["intercept"]),  # type: ignore[arg-type]
            alpha=float(d["alpha"]), interval=tuple(d["interval"]),  # type: ignore[arg-type]
            class_interval={str(k): (float(v[0]), float(v[1]))  # type: ignore[index]
                            for k, v in dict(d.get("class_interval", {})).items()},  # type: ignore[call-overload]
            info=dict(d.get("info", {})),  # type: ignore[call-overload]
            z_lo=tuple(d.get("z_lo", ())), z_hi=tuple(d.get("z_hi", ())),  # type: ignore[arg-type]
            class_z={str(k): (tuple(v[0]), tuple(v[1]))  # type: ignore[index]
                     for k, v in dict(d.get("class_z", {})).items()},  # type: ignore[call-overload]
            unseen_class_physics=bool(d.get("unseen_class_physics", False)),
            unplaced_class_physics=bool(d.get("unplaced_class_physics", False)),
            known_classes=tuple(d.get("known_classes", ())),  # type: ignore[arg-type]
            known_engines=tuple(d.get("known_engines", ())),  # type: ignore[arg-type]
        )


def device_class_of(feats: dict[str, float]) -> str:
    """The device class a feature dict encodes (its class_* indicator), or ""."""
    for name, value in feats.items():
        if name.startswith("class_") and value == 1.0:
            return name[len("class_"):]
    return ""


def engine_of(feats: dict[str, float]) -> str:
    """The engine a feature dict encodes (its engine_* flag; none set: llama.cpp)."""
    for name, engine in ENGINE_FLAGS.items():
        if feats.get(name) == 1.0:
            return engine
    return "llama.cpp"


def design_matrix(rows: Sequence[dict[str, float]], base: Sequence[str],
                  crosses: Sequence[tuple[str, str]], mean: Sequence[float],
                  scale: Sequence[float]) -> list[list[float]]:
    out = []
    for f in rows:
        z = {n: (f[n] - mu) / sd for n, mu, sd in zip(base, mean, scale)}
        out.append([z[n] for n in base] + [z[a] * z[b] for a, b in crosses])
    return out


def fit(phase: str, rows: Sequence[dict[str, float]], target: Sequence[float],
        base: Sequence[str], crosses: Sequence[tuple[str, str]] = (),
        weights: Sequence[float] | None = None) -> ResidualModel:
    """Fit the residual ridge; alpha by generalised cross-validation (RidgeCV)."""
    from sklearn.linear_model import RidgeCV

    base = list(base)
    if not base:  # intercept only: the weighted mean residual
        w = list(weights) if weights else [1.0] * len(target)
        mu = sum(a * b for a, b in zip(w, target)) / sum(w)
        return ResidualModel(phase, (), (), (), (), (), mu, 0.0)
    mean = [sum(f[n] for f in rows) / len(rows) for n in base]
    scale = [_std([f[n] for f in rows], mu) for n, mu in zip(base, mean)]
    x = design_matrix(rows, base, crosses, mean, scale)
    reg = RidgeCV(alphas=ALPHAS).fit(x, list(target), sample_weight=weights)
    zs = [[(f[n] - mu) / sd for f in rows] for n, mu, sd in zip(base, mean, scale)]
    class_z = {}
    for cls in sorted({device_class_of(f) for f in rows} - {""}):
        idx = [i for i, f in enumerate(rows) if device_class_of(f) == cls]
        class_z[cls] = (tuple(min(z[i] for i in idx) for z in zs),
                        tuple(max(z[i] for i in idx) for z in zs))
    return ResidualModel(phase, tuple(base), tuple(tuple(c) for c in crosses),  # type: ignore[misc]
                         tuple(mean), tuple(scale), tuple(float(c) for c in reg.coef_),
                         float(reg.intercept_), float(reg.alpha_),
                         z_lo=tuple(min(z) for z in zs), z_hi=tuple(max(z) for z in zs),
                         class_z=class_z)


def _std(values: list[float], mu: float) -> float:
    var = sum((v - mu) ** 2 for v in values) / max(len(values), 1)
    return math.sqrt(var) if var > 1e-12 else 1.0


@dataclass(frozen=True)
class PredictorModel:
    """Everything prediction needs: one residual model per phase, plus provenance."""

    decode: ResidualModel
    prefill: ResidualModel
    data_hash: str
    version: int = 1

    def save(self, path: Path) -> None:
        payload = {"version": self.version, "data_hash": self.data_hash,
                   "decode": self.decode.to_dict(), "prefill": self.prefill.to_dict()}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=1, sort_keys=True))

    @staticmethod
    def load(path: Path) -> "PredictorModel":
        d = json.loads(Path(path).read_text())
        return PredictorModel(ResidualModel.from_dict(d["decode"]),
                              ResidualModel.from_dict(d["prefill"]), d["data_hash"],
                              int(d.get("version", 1)))
