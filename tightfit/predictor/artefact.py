"""Where the fitted model comes from: the packaged `data/model.json` when its data hash matches the
tables (and its features are still computed), else a cache under
~/.cache/tightfit/predictor/<hash>.json, else a fit (seconds, needs scikit-learn) that is cached.
After changing features, refresh the packaged file: `tightfit predictor fit -o <that path>`.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from tightfit.buildcache import cache_root
from tightfit.predictor import datasets
from tightfit.predictor.models import PredictorModel

PACKAGED = Path(__file__).parent / "data" / "model.json"


def cache_dir() -> Path:
    return cache_root() / "predictor"


def fit_and_save(path: Path | None = None) -> PredictorModel:
    """Fit on all shipped observations and save (default: the cache for this data hash)."""
    from tightfit.predictor import training

    obs, _ = datasets.load_all()
    h = datasets.data_hash()
    model = training.fit_predictor(obs, h)
    model.save(path or cache_dir() / f"{h}.json")
    return model


def _current(model: PredictorModel, h: str) -> bool:
    """Fitted on these tables, with features the code still computes."""
    from tightfit.predictor.features import feature_names

    return model.data_hash == h and all(
        set(m.base) <= set(feature_names(m.phase)) for m in (model.decode, model.prefill))


@lru_cache(maxsize=1)
def load() -> PredictorModel:
    h = datasets.data_hash()
    for path in (PACKAGED, cache_dir() / f"{h}.json"):
        if path.is_file():
            model = PredictorModel.load(path)
            if _current(model, h):
                return model
    return fit_and_save(cache_dir() / f"{h}.json")
