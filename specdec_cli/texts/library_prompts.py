"""The `library` prompt suite: training prompts written from the Python standard library this process runs on.

A trained drafter learns from the target's answers to prompts like its users'; the `distill` suite's templates give
about 300 of them, too few for a head (docs/measurements.md). Here every public function and class of a fixed list of
standard-library modules that carries a docstring yields prompts of four kinds, the way people ask a code model:
- code: "Write a Python function `name(signature)` that ..." from the docstring's first paragraph (code from scratch);
- explain: the function's own source, "Explain what this code does";
- summarize: a long docstring, "Summarize ... in two sentences";
- qa: "What does `module.name` do, and when would I use it?".
Ids are `library-KIND-module.name`; the order is a seeded shuffle, so the first N are a mix of every kind. The
prompts depend on the Python version's library text, never on the network, and none is a benchmark's prompt (the
builtin suite and Spec-Bench are written apart). This module only writes prompts; answering them is distill's.
"""

from __future__ import annotations

import importlib
import inspect
import random
import re
import textwrap
from typing import Any, Iterator

MODULES = ("argparse", "base64", "bisect", "calendar", "collections", "colorsys", "csv", "datetime", "difflib",
           "email.utils", "fnmatch", "fractions", "functools", "glob", "gzip", "hashlib", "heapq", "html",
           "http.cookies", "ipaddress", "itertools", "json", "logging", "mimetypes", "operator", "os.path",
           "pathlib", "pprint", "queue", "random", "re", "secrets", "shlex", "shutil", "statistics", "string",
           "struct", "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize", "urllib.parse", "uuid",
           "warnings", "zipfile", "zlib")
MAX_SOURCE_LINES = 40  # longer functions make prompts longer than an answer is worth
MIN_DOC_CHARS = 40


def _members(module: Any) -> Iterator[tuple[str, Any]]:
    for name, member in sorted(vars(module).items()):
        if name.startswith("_") or not (inspect.isfunction(member) or inspect.isclass(member)):
            continue
        if getattr(member, "__module__", None) != module.__name__:
            continue  # re-exported from elsewhere: asked about where it is defined
        yield name, member


def _first_paragraph(doc: str) -> str:
    paragraph = doc.strip().split("\n\n")[0]
    return re.sub(r"\s+", " ", paragraph).strip()


def _signature(name: str, member: Any) -> str:
    """`name(signature)`, a default that prints as an object's address (`<function f at 0x7f...>`) written `...`:
    the address changes from run to run, and a suite's prompts must not."""
    try:
        signature = f"{name}{inspect.signature(member)}"
    except (TypeError, ValueError):
        return f"{name}(...)"
    return re.sub(r"<[^<>]* at 0x[0-9a-fA-F]+>", "...", signature)


def _source(member: Any) -> str:
    try:
        lines = inspect.getsource(member).splitlines()
    except (OSError, TypeError):
        return ""
    return textwrap.dedent("\n".join(lines)) if 3 <= len(lines) <= MAX_SOURCE_LINES else ""


def _prompts_for(module_name: str, name: str, member: Any) -> Iterator[tuple[str, str]]:
    """(kind, prompt) pairs for one function or class."""
    doc = inspect.getdoc(member) or ""
    first = _first_paragraph(doc)
    qualified = f"{module_name}.{name}"
    if len(first) < MIN_DOC_CHARS:
        return
    if inspect.isfunction(member):
        yield "code", (f"Write a Python function `{_signature(name, member)}` without using the standard library's "
                       f"`{qualified}`. It should do this: {first}")
        source = _source(member)
        if source:
            yield "explain", f"Explain what this Python code does, step by step:\n\n```python\n{source}\n```"
    if len(doc) >= 4 * MIN_DOC_CHARS:
        yield "summarize", f"Summarize this documentation of `{qualified}` in two sentences:\n\n{doc.strip()}"
    yield "qa", f"What does `{qualified}` do in Python, and when would I use it? Give a short example."


def library_prompts(seed: int = 0) -> list[tuple[str, str, str]]:
    """(id, kind, prompt) for the standard library's documented functions and classes, seeded shuffle, ids unique
    (texts/prompts.py makes them the `library` suite's conversations)."""
    conversations: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a trimmed Python
            continue
        for name, member in _members(module):
            for kind, prompt in _prompts_for(module_name, name, member):
                if prompt not in seen:
                    seen.add(prompt)
                    conversations.append((f"library-{kind}-{module_name}.{name}", kind, prompt))
    random.Random(seed).shuffle(conversations)
    return conversations
