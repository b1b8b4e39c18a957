"""The shared command-line options: help generated from the registries, one meaning per flag.

Walks every command Typer builds (including `distill`'s subcommands), so a new command or drafter is covered
without editing this file.
"""

from __future__ import annotations

import re
from typing import Any

import typer.main

from specdec_cli.cli import app
from specdec_cli.defaults import VLLM_DRAFTERS
from specdec_cli.drafters import AUX_CHOICES, DRAFTERS, HYBRID_HEAD
from specdec_cli.texts.prompts import SUITES


def all_commands() -> list[tuple[str, Any]]:
    """(path, command) for every command and group of the CLI, e.g. ("specdec distill train", <Command>).
    Typer vendors its own click, so commands and options are recognised by their attributes."""
    found: list[tuple[str, Any]] = []

    def walk(path: str, command: Any) -> None:
        found.append((path, command))
        if hasattr(command, "commands"):
            for name, child in command.commands.items():
                walk(f"{path} {name}", child)

    walk("specdec", typer.main.get_command(app))
    return found


def options_named(flag: str) -> list[tuple[str, str]]:
    """(command path, help) of every option spelled `flag` in any command."""
    return [(path, param.help or "") for path, command in all_commands() for param in command.params
            if getattr(param, "param_type_name", "") == "option" and flag in param.opts]


def names_in(help_text: str) -> set[str]:
    return set(re.findall(r"[a-z][a-z0-9.-]*", help_text.lower()))


def test_every_registered_drafter_is_in_every_drafter_help():
    declared = options_named("--drafter") + options_named("--drafters")
    assert len(declared) >= 4  # chat, bench, distill, distill generate
    for path, help_text in declared:
        if path == "specdec serve":  # with --engine vllm, a subset: vLLM's own registry
            assert all(name in help_text for name in ("none", *VLLM_DRAFTERS)), help_text
        missing = [name for name in DRAFTERS if name not in names_in(help_text)]
        assert not missing, f"{path}: help of the drafter option misses {missing}"
        assert f"{HYBRID_HEAD}+" in help_text, f"{path}: help does not mention the hybrid"


def test_every_auxiliary_is_in_every_aux_help():
    declared = options_named("--aux")
    assert len(declared) >= 2  # chat, bench
    for path, help_text in declared:
        missing = [name for name in AUX_CHOICES if name not in names_in(help_text)]
        assert not missing, f"{path}: --aux help misses {missing}"


def test_every_suite_is_in_every_suite_help():
    declared = options_named("--suite") + options_named("--eval-suite")
    assert declared
    for path, help_text in declared:
        missing = [name for name in SUITES if name not in names_in(help_text)]
        assert not missing, f"{path}: suite help misses {missing}"


def test_limit_means_per_category_everywhere():
    declared = options_named("--limit")
    assert len(declared) >= 3  # bench, distill, distill generate, distill evaluate
    assert {help_text for _, help_text in declared} == {"Keep the first N prompts of each category."}


def test_shared_options_have_one_help():
    """Options that mean the same thing everywhere are declared once, so their help cannot drift apart."""
    for flag in ("--dtype", "--weights", "--threads", "--index", "--top-p", "--top-k", "--raw", "--kd-loss"):
        helps = {help_text for path, help_text in options_named(flag)}
        assert len(helps) == 1, f"{flag} has {len(helps)} different helps: {sorted(helps)}"
