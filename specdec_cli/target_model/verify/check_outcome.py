"""What came of one of the engine's self-checks (exact verification, token trees), as a typed value.

A check is in one state: "off" (not asked for), "not checked" (not run yet), "on" (exact verification in force),
"failed", "chains only" (trees not attempted for this model) or "passed"; `detail` says what is in force, or why
not. Code decides on `state`; `text()` renders the outcome for displays and JSON (bench's `exact_check` and
`tree_check` settings): the state, then ": detail" when there is one. This file runs no check (exact_setup.py
and tree_check.py do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

CheckState = Literal["off", "not checked", "on", "failed", "chains only", "passed"]


@dataclass(frozen=True)
class CheckOutcome:
    state: CheckState
    detail: str = ""  # what is in force ("on"), or why not ("failed", "chains only"); empty for the others

    def text(self) -> str:
        """"state" or "state: detail", as displays and JSON show it."""
        return f"{self.state}: {self.detail}" if self.detail else self.state
