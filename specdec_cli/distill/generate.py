"""Seq-KD data: the target answers prompts through the speculative engine; one JSONL row per answer.

Prompts come from a file (Spec-Bench `question.jsonl` or plain `{"prompt": ...}` rows, read by
specdec_cli.prompts; any other file: one prompt per non-blank line) or a suite: `builtin` and `humaneval`
(specdec_cli.prompts) or `distill`, a few hundred training prompts made here from templates and topic lists
(chat, writing, explanations, code, arithmetic word problems, translation, summarisation), deliberately
disjoint from the builtin benchmark suite so that a draft trained on them can be measured on it.

Each row (see `DataRow`) holds the prompt, its category and id, the answer text and token ids (EOS included
when the target produced it), the prompt token ids as fed to the target, the finish reason, the sampling
temperature, and the target's name and tokenizer fingerprint. Rows are appended one at a time and fsynced;
a rerun skips prompts already answered, and a last line cut short by a crash is dropped before appending.
The rows carry `prompt` and `answer`, so the file is also a corpus for `specdec build-index`.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..errors import SpecdecError

DATA_FORMAT = 1
SUITE_DISTILL = "distill"
SUITES = (SUITE_DISTILL, "builtin", "humaneval")


@dataclass(frozen=True)
class PromptItem:
    text: str
    category: str = "prompts"
    id: str = ""


@dataclass
class DataRow:
    prompt: str
    category: str
    id: str
    answer: str
    answer_ids: list[int]
    prompt_ids: list[int]
    finish_reason: str
    target: str
    fingerprint: str
    temperature: float = 0.0
    format: int = DATA_FORMAT

    def as_json(self) -> dict:
        return asdict(self)


@dataclass
class GenerateProgress:
    done: int  # prompts answered in this run
    total: int  # prompts to answer in this run (already answered ones excluded)
    new_tokens: int  # answer tokens written in this run
    seconds: float
    mean_accepted_tokens: float  # of the speculative runs so far (generation speed, not draft quality)
    last: Optional[DataRow] = None

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class GenerateSummary:
    path: str
    written: int  # rows appended by this run
    skipped: int  # prompts already answered in the file
    rows: int  # rows in the file now
    new_tokens: int
    seconds: float
    mean_accepted_tokens: float
    warnings: list[str] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


# ---------------------------------------------------------------------------------------------- prompts


def load_prompts(path: Optional[str] = None, suite: Optional[str] = None, limit: Optional[int] = None) -> list[PromptItem]:
    """Prompts from a file or a suite (exactly one), first turns only, duplicates dropped, first `limit`."""
    if (path is None) == (suite is None):
        raise SpecdecError("give either --prompts FILE or --suite NAME")
    if limit is not None and limit < 1:
        raise SpecdecError(f"limit must be >= 1, got {limit}", setting="limit")
    if suite is not None:
        items = _suite(suite)
    else:
        items = _prompt_file(path)
    seen: set[str] = set()
    unique = []
    for item in items:
        if item.text not in seen:
            seen.add(item.text)
            unique.append(item)
    return unique[:limit] if limit is not None else unique


def _suite(name: str) -> list[PromptItem]:
    name = name.strip().lower()
    if name == SUITE_DISTILL:
        return distill_prompts()
    if name not in SUITES:
        raise SpecdecError(f"unknown suite {name!r}; choose one of: {', '.join(SUITES)} (or give --prompts FILE)")
    from ..prompts import load_suite

    return [_from_conversation(conversation) for conversation in load_suite(name)]


def _from_conversation(conversation: Any) -> PromptItem:
    category = getattr(conversation, "subcategory", "") or conversation.category
    return PromptItem(conversation.turns[0], category, str(conversation.id))


def _prompt_file(path: str) -> list[PromptItem]:
    file = Path(path).expanduser()
    if not file.exists():
        raise SpecdecError(f"{path}: no such file")
    if not file.is_file():
        raise SpecdecError(f"{path}: not a file")
    if file.suffix.lower() == ".jsonl":
        from ..prompts import load_prompt_file

        return [_from_conversation(conversation) for conversation in load_prompt_file(file)]
    lines = [line.strip() for line in _read_text(file).splitlines()]
    items = [PromptItem(line.replace("\\n", "\n"), "prompts", str(number))
             for number, line in enumerate(lines, start=1) if line]
    if not items:
        raise SpecdecError(f"{path}: no prompts (the file is empty)")
    return items


def _read_text(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SpecdecError(f"{file}: not UTF-8 text (byte {exc.start})") from exc
    except OSError as exc:
        raise SpecdecError(f"{file}: cannot read ({exc.strerror or exc})") from exc


# The `distill` suite: training prompts from templates. Written for this project; kept apart from the
# builtin benchmark prompts so that held-out measurements on those stay honest.

_CONCEPTS = [
    "photosynthesis", "compound interest", "the water cycle", "inflation", "a black hole", "machine learning",
    "the immune system", "plate tectonics", "supply and demand", "climate change", "the Pythagorean theorem",
    "a blockchain", "natural selection", "the greenhouse effect", "an operating system", "vaccination",
    "the stock market", "electric circuits", "the French Revolution", "recursion in programming", "gravity",
    "the Internet", "a neural network", "democracy", "the speed of light", "DNA", "renewable energy",
    "a credit score", "the Renaissance", "sleep cycles", "probability", "a hash table", "the moon's phases",
    "caffeine", "encryption", "a volcano", "the scientific method", "public key cryptography", "tides",
    "the human heart", "a compiler", "opportunity cost", "the Roman Empire", "solar panels", "antibiotics",
    "a database index", "the placebo effect", "ocean currents", "version control", "cloud computing",
]
_ACTIVITIES = [
    "learning a new language", "running a first 5k race", "saving money on groceries", "studying for exams",
    "starting a vegetable garden", "working from home", "cooking for one person", "keeping a journal",
    "preparing for a job interview", "travelling on a budget", "learning to play the guitar",
    "reducing screen time", "organising a small closet", "public speaking", "making friends in a new city",
    "getting better sleep", "writing a cover letter", "training a puppy", "reading more books",
    "planning a birthday party", "staying focused while studying", "learning to code", "camping for the first time",
    "taking better photos with a phone", "managing stress at work",
]
_FORMS = ["poem", "short story", "product description", "thank-you note", "limerick", "diary entry",
          "motivational speech", "haiku sequence", "news headline and summary", "dialogue between two friends"]
_SUBJECTS = ["a rainy afternoon", "an old lighthouse", "a lost cat", "the first day of school", "a robot learning to paint",
             "a mountain sunrise", "a busy train station", "a forgotten birthday", "a small bakery", "the last leaf of autumn",
             "a time traveller", "a chess tournament", "a winter market", "a broken umbrella", "a library at midnight"]
_CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "counts the words in a sentence", "removes duplicates from a list while keeping the order",
    "finds the largest element of a list without using max()", "checks whether a string is a palindrome",
    "merges two sorted lists into one sorted list", "converts Celsius to Fahrenheit",
    "returns the factorial of a number", "flattens a nested list", "counts how often each character appears",
    "computes the average of a list of numbers", "finds the second smallest number in a list",
    "checks whether two strings are anagrams", "returns all even numbers from a list",
    "implements binary search on a sorted list", "capitalizes the first letter of every word",
    "computes the greatest common divisor of two numbers", "transposes a matrix given as a list of lists",
    "validates that a string is a simple email address", "sums the digits of an integer",
    "rotates a list by k positions", "reads a text file and returns its number of lines",
    "groups a list of words by their first letter",
]
_LANGUAGES = ["JavaScript", "Python", "C", "Go", "Rust"]
_SENTENCES = [
    "The library opens at nine o'clock every morning.", "My brother bought a new bicycle last week.",
    "It is going to rain tomorrow afternoon.", "We need more chairs for the meeting room.",
    "The museum is closed on Mondays.", "She has been learning to play the piano for two years.",
    "Could you tell me where the train station is?", "The soup is too hot to eat right now.",
    "Our neighbours are moving to another city.", "This book is much more interesting than the film.",
    "The children played in the garden until sunset.", "Please turn off the lights when you leave.",
    "The price of coffee has gone up again.", "I forgot my umbrella at the office.",
    "The concert was cancelled because of the storm.", "He writes a letter to his grandmother every month.",
    "The new bridge will be finished next year.", "Fresh bread is sold at the market on Saturdays.",
    "The doctor said I should drink more water.", "We watched the stars from the roof of the house.",
]
_TARGET_LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese"]
_FACTS = [
    "The town council approved a plan to build a new public park near the river.",
    "The park will include a playground, walking paths and a small pond.",
    "Construction is expected to begin in the spring and last about eight months.",
    "Some residents worry that the project will increase traffic in the area.",
    "The council says that new bus routes will reduce the number of cars.",
    "A local bakery has started delivering bread to customers by bicycle.",
    "The owner says the bicycles are cheaper to run than a delivery van.",
    "Customers can order online until eight o'clock in the evening.",
    "The bakery now employs three delivery riders, all of them students.",
    "Researchers studied the sleep of two hundred teenagers for six months.",
    "They found that students who slept more than eight hours had better grades.",
    "Teenagers who used their phones late at night slept less on average.",
    "The researchers recommend switching off screens an hour before bed.",
    "A small company released an app that helps people track their water use.",
    "Users who checked the app daily cut their water use by about ten percent.",
    "The company plans to add features for tracking electricity next year.",
    "The city library will extend its opening hours during the exam period.",
    "Extra study rooms will be available and can be booked in advance.",
    "Volunteers will offer free tutoring in mathematics on weekday evenings.",
    "The library hopes the programme will become a permanent service.",
]
_ITEMS = ["apples", "notebooks", "concert tickets", "bus passes", "coffee cups", "pencils", "plants", "T-shirts"]
_NAMES = ["Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jonas"]


def distill_prompts(seed: int = 0) -> list[PromptItem]:
    """The `distill` suite: deterministic, shuffled across categories so that any prefix is a mix."""
    rng = random.Random(seed)
    items: list[PromptItem] = []

    def add(category: str, text: str) -> None:
        items.append(PromptItem(text, category, f"{category}-{sum(1 for item in items if item.category == category) + 1}"))

    explain = ["Explain {} in simple terms.", "What is {}? Give a short answer with one example.",
               "Describe {} to a ten-year-old.", "Give three key facts about {}.",
               "What are common misconceptions about {}?"]
    for number, concept in enumerate(_CONCEPTS):
        add("qa", explain[number % len(explain)].format(concept))
        add("qa", explain[(number + 2) % len(explain)].format(concept))
    tips = ["Give me five practical tips for {}.", "What mistakes do beginners make when {}?",
            "Make a simple one-week plan for {}.", "What are the benefits of {}? Answer briefly."]
    for number, activity in enumerate(_ACTIVITIES):
        add("chat", tips[number % len(tips)].format(activity))
        add("chat", tips[(number + 1) % len(tips)].format(activity))
    for number, subject in enumerate(_SUBJECTS):
        for form in (_FORMS[number % len(_FORMS)], _FORMS[(number + 3) % len(_FORMS)]):
            add("writing", f"Write a {form} about {subject}.")
    for number, task in enumerate(_CODE_TASKS):
        add("code", f"Write a Python function that {task}. Include a short docstring.")
        if number % 2 == 0:
            add("code", f"Write a function in {_LANGUAGES[number % len(_LANGUAGES)]} that {task}, and explain it briefly.")
    for number in range(30):
        name, item = _NAMES[number % len(_NAMES)], _ITEMS[number % len(_ITEMS)]
        price, count, extra = rng.randint(2, 15), rng.randint(3, 12), rng.randint(2, 9)
        templates = [
            f"{name} buys {count} {item} at ${price} each and pays with a ${(price * count // 10 + 1) * 10} bill. "
            f"How much change does {name} get? Explain step by step.",
            f"A box holds {count} {item}. How many {item} are in {extra} boxes plus {price} loose ones? Show your work.",
            f"{name} reads {count} pages a day. How many days does a book of {count * extra + price} pages take? "
            "Explain your reasoning.",
        ]
        add("math", templates[number % 3])
    for number, sentence in enumerate(_SENTENCES):
        for language in (_TARGET_LANGUAGES[number % 5], _TARGET_LANGUAGES[(number + 2) % 5]):
            add("translation", f"Translate into {language}: {sentence}")
    for start in range(0, len(_FACTS), 2):
        chosen = rng.sample(_FACTS, 4)
        passage = " ".join(chosen)
        style = ["in one sentence", "in two sentences", "as three bullet points", "for a busy reader"][start // 2 % 4]
        add("summarization", f"Summarize the following text {style}.\n\n{passage}")
    rng.shuffle(items)
    return items


# ---------------------------------------------------------------------------------------------- rows


def _token_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(token, int) and token >= 0 for token in value)


def read_rows(path: str, fingerprint: Optional[str] = None, target_name: Optional[str] = None,
              allow_empty: bool = False, warnings: Optional[list[str]] = None) -> list[dict]:
    """The rows of a data file; a last line cut short by a crash is ignored. Checks the target fingerprint."""
    file = Path(path).expanduser()
    if not file.exists():
        if allow_empty:
            return []
        raise SpecdecError(f"{path}: no such data file (make one with `specdec distill generate`)")
    if not file.is_file():
        raise SpecdecError(f"{path}: not a file")
    text = _read_text(file)
    lines = text.split("\n")
    rows: list[dict] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        last = number == len(lines)  # no newline after it: possibly cut short
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if last:
                break
            raise SpecdecError(f"{path}, line {number}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict) or not _token_list(row.get("answer_ids")) or not _token_list(row.get("prompt_ids")):
            raise SpecdecError(f"{path}, line {number}: not a distillation row (no prompt_ids / answer_ids token lists)")
        rows.append(row)
    if not rows and not allow_empty:
        raise SpecdecError(f"{path}: the data file has no rows (run `specdec distill generate` first)")
    fingerprints = {str(row.get("fingerprint", "")) for row in rows}
    if len(fingerprints) > 1:
        raise SpecdecError(f"{path}: rows from several tokenizers ({', '.join(sorted(fingerprints))}); use one file per target")
    if rows and fingerprint is not None:
        theirs = fingerprints.pop()
        if theirs != fingerprint:
            raise SpecdecError(
                f"{path} was generated by target {rows[0].get('target', '?')!r} (tokenizer {theirs}), "
                f"not by {target_name or 'this target'!s} (tokenizer {fingerprint}); use a data file made by this target"
            )
        names = {str(row.get("target", "")) for row in rows}
        if target_name and warnings is not None and names != {target_name}:
            warnings.append(f"{path} was generated by {', '.join(sorted(names))} (same tokenizer as {target_name})")
    return rows


def _repair_tail(file: Path) -> None:
    """Drop a last line without its newline (a row cut short by a crash) so appends stay one row a line."""
    if not file.exists() or file.stat().st_size == 0:
        return
    with open(file, "rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return
        data_end = handle.seek(0, os.SEEK_END)
        position = data_end
        chunk = 4096
        while position > 0:  # find the last newline from the end
            step = min(chunk, position)
            position -= step
            handle.seek(position)
            block = handle.read(step)
            index = block.rfind(b"\n")
            if index >= 0:
                handle.truncate(position + index + 1)
                return
        handle.truncate(0)


def append_row(file: Path, row: DataRow) -> None:
    line = json.dumps(row.as_json(), ensure_ascii=False) + "\n"
    with open(file, "a", encoding="utf-8") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


# ---------------------------------------------------------------------------------------------- generating


def generate_data(
    model: Any,
    tokenizer: Any,
    target_name: str,
    prompts: Sequence[PromptItem],
    out_path: str,
    *,
    drafter: str = "pld",
    drafter_options: Any = None,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    draft_max: Optional[int] = None,
    raw: bool = False,
    system: Optional[str] = None,
    on_progress: Optional[Callable[[GenerateProgress], None]] = None,
) -> GenerateSummary:
    """Answer every prompt not yet in `out_path` and append one row per answer."""
    from dataclasses import replace

    from ..chat import format_prompt, target_info
    from ..drafters import DrafterOptions, make_drafter
    from ..engine import Engine, GenerationConfig

    if not prompts:
        raise SpecdecError("no prompts to answer")
    file = Path(out_path).expanduser()
    if file.exists() and not file.is_file():
        raise SpecdecError(f"{out_path}: not a file")
    if file.parent and not file.parent.exists():
        file.parent.mkdir(parents=True, exist_ok=True)
    info = target_info(model, tokenizer)
    warnings: list[str] = []
    _repair_tail(file)
    existing = read_rows(str(file), info.fingerprint, target_name, allow_empty=True, warnings=warnings)
    answered = {str(row.get("prompt")) for row in existing}
    todo = [item for item in prompts if item.text not in answered]
    options = drafter_options or DrafterOptions(draft_max=draft_max)
    drafter_object = make_drafter(drafter, options, info)
    engine = Engine(model, tokenizer)
    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                              eos_token_ids=info.eos_token_ids)
    if draft_max is not None:
        config = replace(config, budget=draft_max)
    config.check()
    started = time.perf_counter()
    new_tokens = steps = committed = 0
    for done, item in enumerate(todo, start=1):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": item.text}]
        prompt_ids = format_prompt(tokenizer, messages, raw)
        if temperature > 0:
            config = replace(config, seed=seed + len(existing) + done)
        if hasattr(drafter_object, "reset"):
            drafter_object.reset()
        generation = engine.generate(prompt_ids, drafter_object, config)
        answer = tokenizer.decode(generation.tokens, skip_special_tokens=True)
        row = DataRow(item.text, item.category, item.id, answer, [int(t) for t in generation.tokens],
                      [int(t) for t in prompt_ids], generation.finish_reason, target_name, info.fingerprint,
                      float(temperature))
        append_row(file, row)
        new_tokens += len(generation.tokens)
        steps += generation.stats.steps
        committed += generation.stats.mean_accepted_tokens * generation.stats.steps
        if on_progress is not None:
            on_progress(GenerateProgress(done, len(todo), new_tokens, time.perf_counter() - started,
                                         committed / steps if steps else 0.0, row))
    return GenerateSummary(str(file), len(todo), len(prompts) - len(todo), len(existing) + len(todo), new_tokens,
                           time.perf_counter() - started, committed / steps if steps else 0.0, warnings)
