"""Whether asking a drafter whose drafting costs time (a head's forwards) pays for that time.

A step takes `step_seconds` to verify and commits `step_tokens`; asking the drafter costs `ask_seconds` and adds
`gain` accepted tokens that the step would not have had without it. Asking pays when the step's speed with it
beats the speed without it: step_tokens / (T + c) > (step_tokens - gain) / T, that is gain / step_tokens >
c / (T + c). `AskGate` keeps the decayed means of those four numbers and answers `pays()`: always for the first
WARMUP_ASKS asks, at least once in PROBE_EVERY steps (so a drafter that stopped paying can be seen paying again),
and always when the drafting costs under CHEAP_SHARE of a step.

Pure bookkeeping: nothing here drafts, verifies or reads a clock. Its users: a hybrid's auxiliary
(drafters/merge.py, the gain being the accepted nodes only the auxiliary proposed) and a lone drafter whose drafts
carry their confidence under the drafter's own name (decoding/planner.py, the gain being its accepted tokens; no
built-in drafter's do: a lone `eagle` head's drafts carry none, a hybrid's merged drafts are named after their
sources, and engaging it for `eagle` did not pay, docs/measurements.md).
"""

from __future__ import annotations

from typing import Optional

from .stats import decayed_mean

WARMUP_ASKS = 8  # steps a drafter is asked before its gain is weighed
PROBE_EVERY = 16  # a drafter that does not pay is still asked once in this many steps
CHEAP_SHARE = 0.02  # a drafter costing less than this share of a step is always asked


class AskGate:
    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled  # False: always asked
        self.asks = 0  # steps the drafter was asked
        self.unasked = 0  # steps since it was last asked
        self.ask_seconds: Optional[float] = None  # its drafting call, decayed mean
        self.step_seconds: Optional[float] = None  # the target's verify forward, decayed mean
        self.step_tokens: Optional[float] = None  # tokens a step commits, decayed mean
        self.gain: Optional[float] = None  # accepted tokens only it gave, per step it was asked

    def pays(self) -> bool:
        """Whether to ask it this step."""
        if not self.enabled or self.asks < WARMUP_ASKS or self.unasked + 1 >= PROBE_EVERY:
            return True
        if self.ask_seconds is None or not self.step_seconds or not self.step_tokens or self.gain is None:
            return True
        share = self.ask_seconds / (self.step_seconds + self.ask_seconds)
        return share < CHEAP_SHARE or self.gain > share * self.step_tokens

    def asked(self, asked: bool) -> None:
        """This step asked it (or not)."""
        self.asks, self.unasked = (self.asks + 1, 0) if asked else (self.asks, self.unasked + 1)

    def timed(self, seconds: float) -> None:
        """Its drafting call took `seconds`."""
        self.ask_seconds = decayed_mean(self.ask_seconds, seconds)

    def stepped(self, verify_seconds: float, committed: int) -> None:
        """A step's verify forward took `verify_seconds` and committed `committed` tokens."""
        if verify_seconds > 0:
            self.step_seconds = decayed_mean(self.step_seconds, verify_seconds)
        self.step_tokens = decayed_mean(self.step_tokens, float(committed))

    def gained(self, tokens: int) -> None:
        """On a step that asked it: the accepted tokens only it gave."""
        self.gain = decayed_mean(self.gain, float(tokens))


class SourceGates:
    """A gate per lone drafter source (the planner's, for drafters whose drafts carry their confidence under the
    drafter's name), and the source this step asked."""

    def __init__(self) -> None:
        self.gates: dict[str, AskGate] = {}
        self.asking: Optional[str] = None

    def ask(self, source: str) -> bool:
        """Whether to ask `source` to draft this step (recorded as asked or not)."""
        gate = self.gates.setdefault(source, AskGate())
        ask = gate.pays()
        gate.asked(ask)
        self.asking = source if ask else None
        return ask

    def timed(self, source: str, seconds: float) -> None:
        if self.asking == source:
            self.gates[source].timed(seconds)

    def stepped(self, draft_source: str, accepted: int, committed: int, verify_seconds: float) -> None:
        """A step ended: every gate sees its time and tokens; the asked source, what it gained (its accepted
        tokens where the verified draft was its own, else none)."""
        for gate in self.gates.values():
            gate.stepped(verify_seconds, committed)
        if self.asking is not None:
            self.gates[self.asking].gained(accepted if draft_source == self.asking else 0)
            self.asking = None
