"""How a drafter describes itself to the registry (`DrafterSpec`), and the options every drafter reads from
(`DrafterOptions`).

Each drafter module declares one `SPEC`: its name and help line, the `DrafterOptions` fields it uses, whether it
can be sam's auxiliary (or takes one), the probability floor its drafts stop at, its check (the files it needs,
run before the target loads) and its builder. The registry (drafters/__init__.py) lists the modules and derives
everything else from their specs. A drafter module imports from here, never the registry; one that needs torch or
numpy imports them inside its functions, so the command line can list drafters without loading them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from ..defaults import DEFAULT_AUX, DEFAULT_BUDGET, DEFAULT_L_BIAS

if TYPE_CHECKING:  # pragma: no cover
    from ..decoding.draft import Drafter


@dataclass
class DrafterOptions:
    """The drafter part of a run's settings. Each field is read by the drafters whose SPEC lists it; one set for a
    drafter that does not read it is refused (the registry's `check_options_used`)."""

    index: Optional[str] = None  # static suffix-automaton index file (sam)
    l_bias: int = DEFAULT_L_BIAS  # sam: static match must beat the dynamic one by more than this
    l_threshold: int = 1  # sam: the automata draft from matches at least this long (shorter: the auxiliary's alone)
    aux: str = DEFAULT_AUX  # sam: the auxiliary drafter (recycle, aded, model, pld) or "none"
    pld_max_ngram: int = 3  # pld: longest n-gram to look up
    pld_min_ngram: int = 1  # pld: shortest n-gram to look up
    draft_model: Optional[str] = None  # model: directory of the draft model
    draft_min_prob: float = 0.0  # model: stop a chain when the draft's top probability falls below this
    memory: Optional[str] = None  # sam: an answer-memory directory read as a static index (memory.py)
    aded_time_budget: Optional[float] = None  # aded: seconds of tree search per draft; None = aded.TIME_BUDGET


def draft_length(draft_max: Optional[int]) -> int:
    """The longest draft per step for a drafter built with `draft_max` (GenerationConfig.draft_max, --draft-max):
    itself, or the engine's default budget when it is not given (or 0, no drafting: the engine then asks for
    nothing)."""
    return draft_max or DEFAULT_BUDGET


# The options a drafter may leave unused, in the order they are checked, and how the one-line error names who uses
# them ({users}: the drafters whose specs list the option; {hybrids}: the same as sam's auxiliaries, sam+X). An
# option counts as set when it differs from its default; one that no drafter in play uses is refused, since an
# option silently ignored would measure or answer something else than the user asked for.
UNUSED_OPTION_NOTES = {
    "index": "an index is read by {users}",
    "draft_model": "a draft model is run by {users}, or {hybrids}",
    "draft_min_prob": "only {users} drafts have probabilities",
    "aux": "--aux picks {users}'s auxiliary; a {users}+AUX drafter names its own",
    "memory": "only {users} drafts from the answer memory",
    "l_threshold": "it is {users}'s",
}

# (options, target, draft_max) -> drafter, draft_max being GenerationConfig.draft_max (None: not given); one that
# takes an auxiliary also gets `make_aux`
Build = Callable[..., "Drafter"]


@dataclass(frozen=True)
class DrafterSpec:
    """A drafter as the registry sees it. `check` and `build` import what they need when called."""

    name: str  # on the command line: `--drafter NAME`
    help: str  # one line in `--help` and the REPL's /drafter
    build: Build  # (options, target, draft_max[, make_aux]) -> a Drafter (decoding/draft.py)
    options: tuple[str, ...] = ()  # the DrafterOptions fields it reads
    check: Optional[Callable[[DrafterOptions], None]] = None  # its files checked before the target loads
    aux_rank: Optional[int] = None  # its place among sam's auxiliaries (--aux help, errors); None: never one
    takes_aux: bool = False  # it hands over to an auxiliary drafter (`NAME+AUX`, `--aux`): sam
    min_prob: Optional[float] = None  # its drafts stop below a probability: the floor when --draft-min-prob is 0
