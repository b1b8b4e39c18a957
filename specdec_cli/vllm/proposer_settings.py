"""What specdec's vLLM proposer drafts with (`ProposerSettings`), and how those settings travel into vLLM's engine.

vLLM builds a `custom_class` proposer with its own config only, in an engine process that inherits the environment:
`speculative_config` names the class and vLLM's draft length, and `SPECDEC_VLLM_DRAFTER` (a JSON object,
`{"drafter": "sam", "index": "FILE", "memory": "DIR", "min_match": 3}`, all keys optional) carries the rest;
`from_environment` reads it back in the engine. Plain data and light imports: the CLI and `specdec serve` build
these without numpy or torch; the proposer itself is proposer.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Optional

from ..defaults import VLLM_DRAFT_MAX, VLLM_DRAFTERS, VLLM_MIN_MATCH
from ..drafters import DrafterOptions, split_hybrid
from ..errors import SpecdecError
from ..session.run_settings import DrafterSettings

SETTINGS_ENV = "SPECDEC_VLLM_DRAFTER"
MIN_MATCH = VLLM_MIN_MATCH
# the proposer class (in proposer.py) that runs each drafter of VLLM_DRAFTERS
PROPOSER_CLASSES = {"sam": "SamProposer", "sam+pld": "SamProposer", "sam+none": "SamProposer", "pld": "PldProposer"}


def proposer_path(drafter: str) -> str:
    """The dotted class path to give vLLM's speculative_config["model"] for a drafter."""
    return f"{__package__}.proposer.{PROPOSER_CLASSES[drafter]}"


@dataclass(frozen=True)
class ProposerSettings:
    """What the proposer drafts with: a drafter of VLLM_DRAFTERS and its options (a static index, an answer memory),
    the shortest match worth drafting from, and the draft length vLLM asks for (its num_speculative_tokens)."""

    drafter: DrafterSettings = field(default_factory=lambda: DrafterSettings("sam"))
    min_match: int = MIN_MATCH  # draft only a continuation of a match this long (no planner trims drafts in vLLM)
    # vLLM's draft length, from --draft-max (GenerationConfig.draft_max); None: not given, so VLLM_DRAFT_MAX
    num_speculative_tokens: Optional[int] = None

    @property
    def draft_length(self) -> int:
        """vLLM's num_speculative_tokens: --draft-max, else VLLM_DRAFT_MAX."""
        return VLLM_DRAFT_MAX if self.num_speculative_tokens is None else self.num_speculative_tokens

    @staticmethod
    def from_environment(default_drafter: str) -> "ProposerSettings":
        raw = os.environ.get(SETTINGS_ENV, "").strip()
        if not raw:
            return ProposerSettings(DrafterSettings(default_drafter))
        try:
            values = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SpecdecError(f"{SETTINGS_ENV} is not valid JSON ({exc.msg})") from None
        if not isinstance(values, dict) or set(values) - {"drafter", "index", "memory", "min_match"}:
            raise SpecdecError(f"{SETTINGS_ENV} must be a JSON object with drafter, index, memory and min_match keys")
        options = DrafterOptions(index=values.get("index"), memory=values.get("memory"))
        return ProposerSettings(DrafterSettings(str(values.get("drafter") or default_drafter), options),
                                min_match=int(values.get("min_match", MIN_MATCH)))

    def speculative_config(self) -> tuple[dict, dict[str, str]]:
        """vLLM's speculative_config naming this drafter's proposer class, and the environment entry carrying these
        settings into vLLM's engine process (read back by `from_environment`)."""
        name, options = str(self.drafter.name), self.drafter.options
        speculative = {"method": "custom_class", "model": proposer_path(name),
                       "num_speculative_tokens": self.draft_length}
        values: dict = {"drafter": name, "min_match": self.min_match}
        for key, path in (("index", options.index), ("memory", options.memory)):
            if path:
                values[key] = os.path.abspath(os.path.expanduser(path))
        return speculative, {SETTINGS_ENV: json.dumps(values)}

    def check(self) -> None:
        name = self.drafter.name
        if name not in VLLM_DRAFTERS:
            raise SpecdecError(f"drafter {name}: in vLLM specdec drafts with one of {', '.join(VLLM_DRAFTERS)}"
                               " (vLLM verifies chains)", setting="drafter")
        self.check_lengths()
        self.check_index()

    def check_lengths(self) -> None:
        """The draft length and the shortest match, whichever method vLLM drafts with."""
        if self.draft_length < 1:
            raise SpecdecError(f"draft_max must be >= 1, got {self.draft_length}", setting="draft_max")
        if self.min_match < 1:
            raise SpecdecError(f"min_match must be >= 1, got {self.min_match}", setting="min_match")

    def check_index(self) -> None:
        """An index only with sam, which reads it."""
        if self.drafter.options.index and split_hybrid(str(self.drafter.name))[0] != "sam":
            raise SpecdecError("--index is for the sam drafter", setting="index")
