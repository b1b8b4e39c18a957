"""A bench run's report and its files: `BenchReport` (environment, settings, cost curve, result rows,
per-prompt rows) as JSON or CSV, written atomically, with output paths checked before the run."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from ..files import write_atomic
from .metrics import RESULT_FIELDS, ResultRow, TurnRun


@dataclass
class BenchReport:
    environment: dict
    settings: dict
    results: list[ResultRow]
    per_prompt: list[dict]
    runs: list[TurnRun] = field(default_factory=list, repr=False)
    cost_curve: Optional[dict] = None  # the verify-cost curve: at the start and as refined by the run

    def as_json(self) -> dict:
        return {
            "environment": self.environment,
            "settings": self.settings,
            "cost_curve": self.cost_curve,
            "results": [row.as_json() for row in self.results],
            "per_prompt": self.per_prompt,
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
