"""PNG charts of a bench report (`specdec bench --plot DIR`); matplotlib is optional and imported lazily.

- speedup.png: speedup over `none` by category (and overall), one bar per method, a line at 1.0;
- acceptance.png: per-position acceptance (overall) of every method that drafts;
- cost_curve.png: the verify-cost curve the engine planned with (ms per forward of N rows, as measured or
  stored at the start, and as the run's own steps refined it), when any method drafted.
Files are written atomically (temporary file, then rename). Nothing here prints.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ..errors import SpecdecError
from ..files import check_output_file, expect_output, write_atomic

INSTALL = "pip install matplotlib"  # or: pip install 'specdec-cli[plot]'
BASELINE = "none"
OVERALL = "overall"


def require_matplotlib() -> Any:
    """The pyplot module on the non-interactive Agg backend, or a one-line error naming the install command."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SpecdecError(f"plot needs matplotlib: {INSTALL}", setting="plot") from None
    return plt


PLOT_FILES = ("speedup.png", "acceptance.png", "cost_curve.png")


def check_plot_dir(path: str | Path, force: bool = False) -> Path:
    """The charts' folder (made when written if it is not there yet); a chart file already in it is replaced only
    when specdec wrote it and nobody changed it since, or with `force` (a FIFO or a device never: files.py)."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise SpecdecError(f"plot {path}: not a directory", setting="plot")
    for name in PLOT_FILES:
        if path.is_dir():
            check_output_file(path / name, "plot", force=force, force_flag="--force")
        else:  # a folder made for them: the charts are recorded as specdec's once written
            expect_output(path / name)
    return path


def write_plots(document: dict, out_dir: str | Path) -> list[Path]:
    """Write the charts for a bench JSON document into out_dir (created if needed); returns their paths."""
    plt = require_matplotlib()
    out_dir = Path(out_dir).expanduser()
    if out_dir.exists() and not out_dir.is_dir():
        raise SpecdecError(f"plot {out_dir}: not a directory", setting="plot")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecdecError(f"plot {out_dir}: cannot create the directory ({exc.strerror or exc})",
                           setting="plot") from exc
    results = document.get("results", [])
    title = _title(document.get("environment", {}))
    written = [
        _save(plt, _speedup_figure(plt, results, title), out_dir / "speedup.png"),
        _save(plt, _acceptance_figure(plt, results, title), out_dir / "acceptance.png"),
    ]
    if document.get("cost_curve"):
        written.append(_save(plt, _cost_figure(plt, document["cost_curve"], title), out_dir / "cost_curve.png"))
    return written


def _title(env: dict) -> str:
    parts = [env.get("model"), env.get("dtype"), env.get("device"), env.get("cpu"), (env.get("date") or "")[:10]]
    return " · ".join(str(part) for part in parts if part)


def _speedup_figure(plt: Any, results: list[dict], title: str) -> Any:
    categories = list(dict.fromkeys(row["category"] for row in results))
    methods = [name for name in dict.fromkeys(row["method"] for row in results) if name != BASELINE]
    lookup = {(row["method"], row["category"]): row for row in results}
    width = 0.8 / max(1, len(methods))
    bars = len(categories) * max(1, len(methods))
    figure, axes = plt.subplots(figsize=(min(16.0, max(6.0, 0.3 * bars + 2.5)), 4.5))
    for position, method in enumerate(methods):
        xs, heights, errors = [], [], []
        for index, category in enumerate(categories):
            row = lookup.get((method, category))
            if row is None or row.get("speedup") is None:
                continue
            xs.append(index - 0.4 + width * (position + 0.5))
            heights.append(row["speedup"])
            errors.append(row.get("speedup_std") or 0.0)
        axes.bar(xs, heights, width=width, label=method, yerr=errors if any(errors) else None, capsize=2)
    axes.axhline(1.0, color="black", linewidth=1, linestyle="--", label="none (plain decoding)")
    axes.set_xticks(range(len(categories)))
    axes.set_xticklabels(categories, rotation=20, ha="right")
    axes.set_ylabel("speedup over plain decoding (x)")
    axes.set_title(f"Speedup by category\n{title}", fontsize=9)
    axes.legend(fontsize=8, ncols=2)
    figure.tight_layout()
    return figure


def _acceptance_figure(plt: Any, results: list[dict], title: str) -> Any:
    figure, axes = plt.subplots(figsize=(6.5, 4.5))
    drew = False
    for row in results:
        curve = row.get("per_position_acceptance") or []
        if row["category"] != OVERALL or not curve:
            continue
        dashed = str(row["method"]).startswith("oracle-")  # the ceiling rows, drawn apart from real drafters
        axes.plot(range(1, len(curve) + 1), curve, marker="o", markersize=3, label=row["method"],
                  linestyle="--" if dashed else "-", alpha=0.6 if dashed else 1.0)
        drew = True
    if not drew:
        axes.text(0.5, 0.5, "no method drafted any tokens", ha="center", va="center", transform=axes.transAxes)
    axes.set_ylim(-0.03, 1.05)
    axes.set_xlabel("draft position")
    axes.set_ylabel("share of steps whose draft token there was accepted")
    axes.set_title(f"Per-position acceptance (all prompts)\n{title}", fontsize=9)
    if drew:
        axes.legend(fontsize=8)
    figure.tight_layout()
    return figure


def _cost_figure(plt: Any, curve: dict, title: str) -> Any:
    figure, axes = plt.subplots(figsize=(7, 4))
    origin = {"measured": "measured before the run", "cache": "stored for this machine"}.get(
        curve.get("origin", ""), "at the start")
    for key, label, style in (("start_ms", origin, "o--"),
                              ("end_ms", "refined by the run's steps", "s-")):
        points = [(rows, ms) for rows, ms in zip(curve["rows"], curve[key]) if ms is not None]
        axes.plot([rows for rows, _ in points], [ms for _, ms in points], style, markersize=4, label=label)
    axes.set_xscale("log", base=2)
    ticks = [rows for rows in (1, 2, 4, 8, 16, 32, 64) if rows <= max(curve["rows"])]
    axes.set_xticks(ticks, [str(rows) for rows in ticks])
    axes.set_xlabel("rows in one target forward (1 = a plain step; k drafted tokens = k + 1 rows)")
    axes.set_ylabel("milliseconds")
    axes.set_ylim(bottom=0)
    axes.set_title(f"Verify cost t(N)\n{title}", fontsize=9)
    axes.legend(fontsize=8)
    figure.tight_layout()
    return figure


def _save(plt: Any, figure: Any, path: Path) -> Path:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120)
    plt.close(figure)
    return write_atomic(path, buffer.getvalue())
