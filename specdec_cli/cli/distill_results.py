"""What `specdec distill` shows when a draft is done: the evaluation's table and the commands that use the draft.

Display only (Rich, stdout); the numbers come from specdec_cli.distill's evaluation, the stages from
distill_stages.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..defaults import DEFAULT_TARGET
from .common import console


def show_evaluation(evaluation: dict, draft_dir: str) -> None:
    """The evaluation as a table (a head: its trees and chains; a student: before and after training)."""
    from rich.table import Table

    source = evaluation.get("source") or "prompts"
    table = Table(title=f"Draft vs target on {evaluation['prompts']} held-out prompts ({source})", title_justify="left")
    table.add_column("draft")
    for name in ("agreement", "1-TVD", "tau", "accepted", "by position", "tok/s"):
        table.add_column(name, justify="right")
    names = ({"before": "untrained, trees", "after_chain": "trained, chains", "after": "trained, trees"}
             if "after_chain" in evaluation else {"before": "untrained", "after": "distilled"})  # (a head: both)
    for label, name in names.items():
        score = evaluation.get(label)
        if score:
            positions = " ".join(f"{value:.0%}" for value in (score.get("per_position_acceptance") or [])[:5])
            table.add_row(name, f"{score['agreement']:.1%}", f"{score['sampling_acceptance']:.1%}",
                          f"{score['mean_accepted_tokens']:.2f}", f"{score['acceptance_rate']:.1%}", positions,
                          f"{score['tokens_per_second']:.1f}")
    console().print(table)
    console().print("[dim]agreement: top-1 agreement with the target along its answers; 1-TVD: expected per-token "
                    "acceptance when sampling; tau: mean tokens per target forward (plain decoding = 1); accepted: "
                    "share of drafted tokens accepted; by position: acceptance of draft positions 1-5 (tree depths)"
                    f"[/dim]\n[dim]report: {Path(draft_dir) / 'distill_report.json'}[/dim]")


def show_usage(draft_dir: str, target_spec: str, stages: Any) -> None:
    """The commands that use the draft, one a line, to copy; `stages` (distill_stages.py) names its drafter and
    bench methods."""
    target = "" if target_spec == DEFAULT_TARGET else f" --target {target_spec}"
    console().print("\nUse the draft:")
    # whole commands, one a line, to copy (markup off: a path may hold brackets)
    console().print(f"  specdec chat{target} --drafter {stages.drafter} --draft-model {draft_dir} --prompt \"...\"",
                    soft_wrap=True, markup=False)
    console().print(f"  specdec bench{target} --drafters none,{stages.bench_methods} --draft-model {draft_dir}",
                    soft_wrap=True, markup=False)
