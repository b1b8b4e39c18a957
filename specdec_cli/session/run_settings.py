"""One run's settings, composed once: how the target loads, which drafter drafts with which options, how answers
are generated. `chat`, `bench`, `serve` and the vLLM proposers hold these components (a field holding the
component), never copies of their fields; each entry point's own settings keep only what is theirs (bench: its
rows and repeats; chat: its system message; serve: the server's address).

- `LoadSettings` (target_model/load/load_settings.py): target, device, dtype, weights; each value checked when made.
- `DrafterSettings`: a drafter's name and its `DrafterOptions` (drafters/); `check` refuses an unknown drafter, an
  option it does not use and a file it cannot open, in a millisecond.
- `GenerationConfig` (decoding/generation_config.py): length, sampling, seed, and the draft length (`draft_max`,
  the one setting for the engine's per-step budget and the drafter's longest draft).
- `RunSettings`: the three together, with row-invariant verification and raw prompts; `check` runs every check
  above in one order, before anything slow.

Plain data, no heavy imports: the CLI builds these before torch loads. Nothing here loads or runs anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional, Sequence

from ..decoding.generation_config import GenerationConfig
from ..defaults import DEFAULT_DRAFTER
from ..drafters import DrafterOptions, check_drafter, check_drafter_options
from ..errors import SpecdecError
from ..target_model.load.load_settings import LoadSettings


@dataclass(frozen=True)
class DrafterSettings:
    """Which drafter drafts, and with which options."""

    name: Optional[str] = DEFAULT_DRAFTER  # a drafter or sam+AUX; None where each row names its own (bench)
    options: DrafterOptions = field(default_factory=DrafterOptions)

    def check(self, names: Sequence[str] = ()) -> None:
        """The drafter (or `names`, several that draft with these options) is registered, every option set is used
        by one of them, and the files they open are what they claim to be (drafters.check_drafter_options)."""
        chosen = list(names) or ([self.name] if self.name is not None else [])
        if self.options.l_threshold < 0:
            raise SpecdecError(f"l_threshold must be >= 0, got {self.options.l_threshold}", setting="l_threshold")
        for name in chosen:
            check_drafter(name)
        check_drafter_options(chosen, self.options)


@dataclass(frozen=True)
class RunSettings:
    """Everything one run with the target is made from, checked once by `check` before the model loads."""

    load: LoadSettings = field(default_factory=LoadSettings)
    drafter: DrafterSettings = field(default_factory=DrafterSettings)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    exact: Optional[bool] = None  # row-invariant verification; None = on in 16-bit dtypes and block weights
    raw: bool = False  # prompts as they are, without the chat template

    def check(self, drafters: Sequence[str] = ()) -> None:
        """What can be checked without the model, so a bad setting fails in the first second: the load values
        (checked as LoadSettings was made), the drafter (or `drafters`, each row's) and its options, then the
        generation settings (generation_config.py's messages)."""
        self.drafter.check(drafters)
        self.generation.check()


def run_settings(drafter: Optional[str] = DEFAULT_DRAFTER, **values: Any) -> RunSettings:
    """One run's settings from values named as the fields of RunSettings and its components (target, dtype, index,
    draft_max, max_new_tokens, exact, ...): each value goes to the one type that declares it (no two declare the same
    name), the rest keep their defaults. The command line builds every command's settings through here, so no flag
    is mapped twice."""
    parts: dict[type, Any] = {component: component(**take_fields(component, values)) for component in COMPONENTS}
    own = take_fields(RunSettings, values)
    if values:
        raise TypeError(f"no run setting is named {', '.join(sorted(values))}")
    return RunSettings(parts[LoadSettings], DrafterSettings(drafter, parts[DrafterOptions]), parts[GenerationConfig],
                       **own)


COMPONENTS = (LoadSettings, DrafterOptions, GenerationConfig)  # what `run_settings` fills by field name


def take_fields(kind: type, values: dict[str, Any]) -> dict[str, Any]:
    """The entries of `values` named as fields of the dataclass `kind`, taken out of `values`."""
    return {one.name: values.pop(one.name) for one in fields(kind) if one.name in values}
