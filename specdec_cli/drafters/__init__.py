"""Drafter registry: names on the command line -> drafter objects.

Each drafter module declares its `SPEC` (spec.py: name, help, the options it uses, its check and its builder);
this file only lists the modules, one line each, and derives the rest from their specs: `DRAFTERS` (names and
help), sam's auxiliaries (`AUX_CHOICES`), the "option X: drafter Y does not use it" errors, the file checks run
before the target loads and `make_drafter`, the only constructor the CLI, bench and chat use. A drafter added
to `DRAFTER_MODULES` appears everywhere. The drafter modules are light to import (torch and numpy are imported
inside their functions), so listing drafters loads nothing heavy.
"""

from __future__ import annotations

from dataclasses import fields, replace
from importlib import import_module
from typing import TYPE_CHECKING, Optional, Sequence, Union

from ..errors import SpecdecError
from .spec import UNUSED_OPTION_NOTES, DrafterOptions, DrafterSpec
from .target import TargetInfo, TargetWeights, target_info, target_weights

if TYPE_CHECKING:  # pragma: no cover
    from ..decoding.draft import Drafter

__all__ = ["AUX_CHOICES", "DRAFTERS", "HYBRID_HEAD", "SPECS", "DrafterOptions", "DrafterSpec", "TargetInfo",
           "TargetWeights", "check_aux", "check_drafter", "check_drafter_options", "is_drafter", "make_drafter",
           "min_prob_in_force", "split_hybrid", "target_info", "target_weights"]

DRAFTER_MODULES = (  # one line per drafter: its module in this package, in the order help lists them
    "none",
    "pld",
    "sam",
    "recycle",
    "aded",
    "model",
    "eagle",
)

SPECS: dict[str, DrafterSpec] = {spec.name: spec for spec in
                                 (import_module(f"{__name__}.{module}").SPEC for module in DRAFTER_MODULES)}
DRAFTERS = {name: spec.help for name, spec in SPECS.items()}
# `sam+recycle` = sam with recycle as its auxiliary drafter (same as `sam --aux recycle`)
[HYBRID_HEAD] = [name for name, spec in SPECS.items() if spec.takes_aux]
AUX_CHOICES = tuple(sorted((name for name, spec in SPECS.items() if spec.aux_rank is not None),
                           key=lambda name: SPECS[name].aux_rank or 0))  # `sam+none`: the suffix automata alone


def check_aux(aux: str) -> None:
    """A one-line SpecdecError unless `aux` is a drafter sam can hand over to (or "none")."""
    if aux not in AUX_CHOICES:
        raise SpecdecError(f"aux {aux}: the auxiliary drafter must be one of {', '.join(AUX_CHOICES)}", setting="aux")


def split_hybrid(name: str) -> tuple[str, Optional[str]]:
    """`"sam+aded"` -> `("sam", "aded")`; a plain name -> `(name, None)`. Raises on a malformed hybrid."""
    name = name.strip().lower()
    if "+" not in name:
        return name, None
    head, _, aux = name.partition("+")
    if head != HYBRID_HEAD or aux not in AUX_CHOICES:
        raise SpecdecError(f"unknown drafter {name!r}: a hybrid is {HYBRID_HEAD}+AUX with AUX one of "
                           f"{', '.join(AUX_CHOICES)}")
    return head, aux


def drafters_in(name: str, options: DrafterOptions) -> tuple[str, Optional[str]]:
    """The drafter named `name` and the auxiliary it runs with under `options`: a hybrid's own, else `--aux` for a
    drafter that takes one, else None."""
    head, aux = split_hybrid(name)
    takes_aux = head in SPECS and SPECS[head].takes_aux
    return head, aux if aux is not None else (options.aux if takes_aux else None)


def _in_play(name: str, options: DrafterOptions) -> list[DrafterSpec]:
    """The specs of the drafter named `name` and of its auxiliary under `options` ("none" included)."""
    return [SPECS[one] for one in drafters_in(name, options) if one in SPECS]


def check_drafter(name: str) -> None:
    """Raise a one-line SpecdecError unless `name` is a drafter `make_drafter` can build."""
    head, _ = split_hybrid(name)
    if head not in DRAFTERS:
        raise SpecdecError(f"unknown drafter {name!r}; choose one of: {', '.join(DRAFTERS)}, {HYBRID_HEAD}+AUX")


def check_drafter_options(name: Union[str, Sequence[str]], options: DrafterOptions) -> None:
    """What can be checked of the options of a drafter (or of several that run with the same options, as bench's
    do) before the target loads: every option set is used by one of them (`check_options_used`), the files they
    will open exist and are what they claim to be (each spec's `check`), and the drafter a hybrid needs is named
    (a tokenizer match is checked at build)."""
    names = [name] if isinstance(name, str) else list(name)
    check_options_used(names, options)
    for one in names:
        _, aux = drafters_in(one, options)
        if aux is not None:
            check_aux(aux)
        for spec in _in_play(one, options):
            if spec.check is not None:
                spec.check(options)


def _options_used(name: str, options: DrafterOptions) -> set[str]:
    """The DrafterOptions fields the drafter named `name` reads under `options`: its own and its auxiliary's; a
    hybrid `sam+AUX` names its auxiliary, so it does not read `--aux`."""
    used = {option for spec in _in_play(name, options) for option in spec.options}
    if split_hybrid(name)[1] is not None:
        used.discard("aux")
    return used


def check_options_used(names: Sequence[str], options: DrafterOptions) -> None:
    """A one-line error for an option none of `names` uses (`--index` with pld, `--draft-model` with sam, ...): an
    option silently ignored would measure or answer something else than the user asked for. An option counts as
    set when it differs from its default (`--aux none`, the default, cannot be told from no --aux)."""
    used = set().union(*(_options_used(name, options) for name in names))
    defaults = {option.name: option.default for option in fields(DrafterOptions)}
    chosen = ", ".join(names) or "no drafter"
    for setting, note in UNUSED_OPTION_NOTES.items():
        value, default = getattr(options, setting), defaults[setting]
        if value == default or (default is None and not value) or setting in used:
            continue
        users = [spec.name for spec in SPECS.values() if setting in spec.options]
        hybrids = [f"{HYBRID_HEAD}+{user}" for user in users if user in AUX_CHOICES]
        shown = note.format(users=" and ".join(users), hybrids=" and ".join(hybrids))
        raise SpecdecError(f"{setting} {value}: {chosen} does not use it ({shown})", setting=setting)


def min_prob_in_force(name: str, options: DrafterOptions) -> Optional[float]:
    """The probability floor a drafter (or hybrid) named `name` drafts with under `options`: --draft-min-prob, or
    the drafter's own default when it is 0; None for drafters that have no floor (retrieval and tables)."""
    for spec in _in_play(name, options):
        if spec.min_prob is not None:
            return options.draft_min_prob or spec.min_prob
    return None


def is_drafter(name: str) -> bool:
    """True for a registered drafter name or a valid `sam+AUX` hybrid."""
    try:
        check_drafter(name)
    except SpecdecError:
        return False
    return True


def make_drafter(name: str, options: DrafterOptions, target: TargetInfo,
                 draft_max: Optional[int] = None) -> "Drafter":
    """The drafter named `name` (a hybrid `sam+AUX` too) built from its spec for this target, drafting at most
    `draft_max` tokens a step (GenerationConfig.draft_max; None: its own default). A drafter that takes an auxiliary
    builds it when it is ready for it, through `make_aux` (None for "none")."""
    head, aux = split_hybrid(name)
    check_drafter(head)
    spec = SPECS[head]
    if aux is not None:
        options = replace(options, aux=aux)
    if not spec.takes_aux:
        return spec.build(options, target, draft_max)

    def make_aux() -> Optional["Drafter"]:
        if not options.aux or options.aux == "none":
            return None
        check_aux(options.aux)
        return make_drafter(options.aux, options, target, draft_max)

    return spec.build(options, target, draft_max, make_aux=make_aux)
