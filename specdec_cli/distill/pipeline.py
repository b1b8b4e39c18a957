"""The distill pipeline's decisions, apart from its display: which target a data file or draft was made
for, where outputs go by default, which prompts evaluate a draft, and how a prompt list is thinned evenly
over its categories. The stages themselves are generate.py, train.py and evaluate.py; cli/distill_cmd.py
runs them with progress bars.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional

from ..defaults import DEFAULT_TARGET
from ..drafters import target_info
from ..drafters.model import read_draft_meta
from ..errors import SpecdecError
from ..files import check_output_file
from ..home import specdec_home, writable_home_folder
from ..target_model.load.target_source import resolve_target
from ..texts.prompts import Conversation, load_prompts
from .answer_features import check_answers_folder
from .evaluate import prompts_from_data, read_report, tokenized
from .generate import check_data_output


def target_spec(target: str) -> str:
    """What to record as the target: an absolute path for files and directories, the name otherwise."""
    path = Path(target).expanduser()
    return str(path.resolve()) if path.exists() else target


def target_of_data(data: str) -> Optional[str]:
    """The target recorded in the first row of a data file (None when unreadable)."""
    try:
        with open(Path(data).expanduser(), encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    return str(json.loads(line).get("target") or "") or None
    except (OSError, ValueError):
        return None
    return None


def target_of_draft(draft_dir: str) -> Optional[str]:
    return str(read_draft_meta(Path(draft_dir).expanduser()).get("target") or "") or None


def usable_target(recorded: Optional[str]) -> str:
    """A recorded target if it can still be resolved, else the default model."""
    if not recorded:
        return DEFAULT_TARGET
    try:
        resolve_target(recorded)
    except SpecdecError:
        return DEFAULT_TARGET
    return recorded


def default_output(target_name: str, kind: str = "student") -> Path:
    """$SPECDEC_HOME/drafts/NAME for a student, NAME-eagle for an EAGLE head (each with its own data file)."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in Path(target_name).name) or "draft"
    return specdec_home() / "drafts" / (safe if kind == "student" else f"{safe}-{kind}")


def pipeline_files(target: str, output: Optional[str], data: Optional[str], kind: str,
                   check_output: Callable[[Path], None]) -> tuple[Path, str]:
    """The pipeline's draft directory and data file, checked before the target loads and answers for minutes:
    `output` (default: `default_output`, its folder under $SPECDEC_HOME made writable) must be the pipeline's to
    replace (`check_output`, the kind's own rule) in a folder that exists; `data` (default: OUTPUT.data.jsonl)
    must be distill data, appended to, or not exist yet."""
    out_dir = Path(output).expanduser() if output else default_output(resolve_target(target).name, kind)
    check_output(out_dir)
    if not output:  # the default place under $SPECDEC_HOME is ours to create
        writable_home_folder("drafts")
    elif not out_dir.parent.is_dir():  # a folder given is never created behind the user's back
        raise SpecdecError(f"output {out_dir}: the folder {out_dir.parent} does not exist", setting="output")
    data_file = data or str(out_dir.parent / f"{out_dir.name}.data.jsonl")
    check_output_file(data_file, "data", own_rule=True)  # appended to: distill/generate.py
    check_data_output(data_file, setting="data")  # a file that is not distill data is refused before the target loads
    if kind == "eagle":  # where answering keeps the target's features for the head (answer_features.py)
        check_answers_folder(data_file)
    return out_dir, data_file


def held_out_prompts(loaded: Any, target_spec: str, draft_dir: str, data: Optional[str], prompts: Optional[str],
                     suite: Optional[str], limit: Optional[int], max_prompts: Optional[int],
                     raw: bool) -> tuple[list[Conversation], str]:
    """A student's held-out prompts (tokenized) and where they came from: a file or a suite, else the held-out rows
    of its data (`data`, or the file its report names)."""
    if prompts or suite:
        items = load_prompts(prompts, suite, limit=limit, max_prompts=max_prompts, first_turns=True)
        return tokenized(loaded.tokenizer, items, raw), (prompts or f"suite {suite}")
    report = read_report(Path(draft_dir).expanduser())
    data = data or (report.get("data") or {}).get("path")
    if not data:
        raise SpecdecError("give the held-out prompts: --data DATA.jsonl, --suite builtin or --prompts FILE")
    holdout = float((report.get("data") or {}).get("holdout", 0.1))
    info = target_info(loaded.model, loaded.tokenizer)
    found = prompts_from_data(data, holdout, info.fingerprint, target_spec)
    return (found[:max_prompts] if max_prompts else found), f"held-out rows of {data}"


def evaluation_items(prompts: Optional[str], suite: Optional[str], max_prompts: Optional[int],
                     limit: Optional[int] = None) -> tuple[list[Conversation], str]:
    """Held-out prompts to score a draft on (a file, or a suite: builtin by default): the first `limit` of each
    category, then at most `max_prompts` spread over the categories; and where they came from."""
    items = load_prompts(prompts, None if prompts else (suite or "builtin"), limit=limit, first_turns=True)
    return spread(items, max_prompts), prompts or f"suite {suite or 'builtin'}"


def spread(items: list[Conversation], max_prompts: Optional[int]) -> list[Conversation]:
    """At most `max_prompts` items, taken round-robin over categories so that every category is represented."""
    if not max_prompts or len(items) <= max_prompts:
        return list(items)
    groups: dict[str, list[Conversation]] = {}
    for item in items:
        groups.setdefault(item.source_category, []).append(item)
    chosen: list[Conversation] = []
    while len(chosen) < max_prompts:
        for group in groups.values():
            if group and len(chosen) < max_prompts:
                chosen.append(group.pop(0))
    return chosen
