"""Predicted-vs-measured plots for docs/predictor.md (matplotlib, imported only here)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

COLOURS = {"apple": "tab:blue", "llmfit": "tab:orange", "design": "tab:green",
           "tightfit": "tab:red"}  # tightfit: this project's own measurements


def scatter(pairs: Sequence[Any], metric: str, title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tightfit.predictor.evaluate import predicted

    fig, ax = plt.subplots(figsize=(5.2, 5.0), dpi=110)
    sel = [(o, predicted(o, p)) for o, p in pairs if o.metric == metric]
    for src, colour in COLOURS.items():
        pts = [(o.value, v) for o, v in sel if o.source == src and v]
        if pts:
            ax.scatter([a for a, _ in pts], [b for _, b in pts], s=12, alpha=0.7, c=colour,
                       label=f"{src} ({len(pts)})")
    vals = [o.value for o, _ in sel] + [v for _, v in sel if v]
    lo, hi = min(vals) * 0.7, max(vals) * 1.4
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    for f in (0.9, 1.1):
        ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel=f"measured {metric}",
           ylabel=f"predicted {metric}", title=title)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
