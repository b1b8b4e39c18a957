"""The `distill` prompt suite: training prompts for `specdec distill generate`, made from the word lists and
templates in `specdec_cli/data/distill_suite.json` (written for this project, and kept apart from the
builtin benchmark prompts so that held-out measurements on those stay honest). Deterministic for a seed,
shuffled across categories so that any prefix is a mix. Prompts only: answering them is generate.py's.
"""

from __future__ import annotations

import json
import random
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .generate import PromptItem


@lru_cache(maxsize=1)
def suite_data() -> dict:
    return json.loads(resources.files("specdec_cli").joinpath("data/distill_suite.json").read_text(encoding="utf-8"))


def distill_prompts(seed: int = 0) -> list["PromptItem"]:
    from .generate import PromptItem

    data = suite_data()
    rng = random.Random(seed)
    items: list[PromptItem] = []
    counts: dict[str, int] = {}

    def add(category: str, text: str) -> None:
        counts[category] = counts.get(category, 0) + 1
        items.append(PromptItem(text, category, f"{category}-{counts[category]}"))

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
    rng.shuffle(items)
    return items
