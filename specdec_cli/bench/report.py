"""A bench run's report and its files: `BenchReport` (environment, settings, cost curve, result rows,
per-prompt rows) as JSON or CSV, written atomically; `ReportFiles` (--json-out, --csv, --plot) checked before the
run (`check`) and written after it (`ReportPaths.write`). Nothing here prints or renders a table."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from ..files import check_output_file, write_atomic
from .metrics import RESULT_FIELDS, ResultRow, TurnRun
from .plots import check_plot_dir, require_matplotlib, write_plots


@dataclass
class BenchReport:
    environment: dict
    settings: dict
    results: list[ResultRow]
    per_prompt: list[dict]
    runs: list[TurnRun] = field(default_factory=list, repr=False)
    cost_curve: Optional[dict] = None  # the verify-cost curve: at the start and as refined by the run
    batched: list[dict] = field(default_factory=list)  # --batch N: each engine row's first turns N at a time

    def as_json(self) -> dict:
        return {
            "environment": self.environment,
            "settings": self.settings,
            "cost_curve": self.cost_curve,
            "results": [row.as_json() for row in self.results],
            "per_prompt": self.per_prompt,
            "batched": self.batched,
        }


def to_json_text(report: BenchReport | dict) -> str:
    document = report.as_json() if isinstance(report, BenchReport) else report
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def write_json(report: BenchReport | dict, path: str | Path) -> Path:
    return write_atomic(path, to_json_text(report))


def csv_text(results: Sequence[ResultRow | dict], columns: Sequence[str] = RESULT_FIELDS) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for item in results:
        row = item.as_json() if isinstance(item, ResultRow) else item
        cells = []
        for key in columns:
            value = row.get(key)
            if isinstance(value, list):
                value = " ".join(f"{item:.4f}" for item in value)
            cells.append("" if value is None else value)
        writer.writerow(cells)
    return buffer.getvalue()


def write_csv(results: Sequence[ResultRow | dict], path: str | Path, columns: Sequence[str] = RESULT_FIELDS) -> Path:
    return write_atomic(path, csv_text(results, columns))


def report_document(report: BenchReport, loaded: Any) -> dict:
    """The report as JSON, with what the load of the target (`loaded`, a LoadedTarget) chose and why."""
    document = report.as_json()
    document["environment"]["dtype_choice"] = loaded.dtype_reason
    document["environment"]["weights"] = loaded.weights_reason
    document["environment"]["load"] = loaded.load_line
    if loaded.weights == "dense":  # the kernel threads matter only where the kernels compute the target
        document["environment"]["kernel_threads"] = document["environment"]["kernel_path"] = None
        document["environment"]["kv_cache"] = None  # (transformers' own cache)
    if loaded.device != "cpu":  # the device engine's cache is in its compute dtype, not the native decoder's
        document["environment"]["kv_cache"] = str(loaded.dtype).replace("torch.", "")
    return document


@dataclass(frozen=True)
class ReportPaths:
    """The report's files, checked: `write` writes each one asked for and returns their paths, charts last."""

    json: Optional[Path] = None
    csv: Optional[Path] = None
    plot: Optional[str] = None  # a folder of charts

    def write(self, document: dict, columns: Sequence[str] = RESULT_FIELDS) -> list[Path]:
        if self.json:
            write_json(document, self.json)
        if self.csv:
            write_csv(document["results"], self.csv, columns)
        charts = write_plots(document, self.plot) if self.plot else []
        return [path for path in (self.json, self.csv) if path] + charts


@dataclass(frozen=True)
class ReportFiles:
    """Where a bench's report goes besides the table: --json-out, --csv and --plot; `force` replaces files that
    specdec did not write (files.check_output_file's rule)."""

    json_out: Optional[str] = None
    csv_out: Optional[str] = None
    plot: Optional[str] = None
    force: bool = False

    def check(self) -> ReportPaths:
        """Every path checked before the run (and matplotlib there for --plot): a bad one fails in the first
        second, not after the run."""
        json_path = check_output_file(self.json_out, "json_out", force=self.force, force_flag="--force") \
            if self.json_out else None
        csv_path = check_output_file(self.csv_out, "csv", force=self.force, force_flag="--force") \
            if self.csv_out else None
        if self.plot:
            require_matplotlib()
            check_plot_dir(self.plot, self.force)
        return ReportPaths(json_path, csv_path, self.plot)
