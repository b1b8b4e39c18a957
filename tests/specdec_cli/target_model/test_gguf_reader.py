"""GGUF is read one way: target_model/gguf/gguf_file.py parses headers, and every other module of specdec_cli builds on
it (the family check, the metadata, the block decoding). benchmarks/ and tests/ may use gguf-py's writer and
reader to make and inspect files."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "specdec_cli"
READER = "target_model/gguf/gguf_file.py"
# gguf-py's reader, or a header parsed by hand (the magic, read or compared)
PARSING = re.compile(r"GGUFReader|gguf_reader|b[\"']GGUF[\"']|[\"']GGUF[\"']\.encode")
# modules of other branches still reading a header themselves: each must still do so (then it moves off this list)
PENDING: dict[str, str] = {}  # module: why it still parses GGUF itself (none now)


def _parsers() -> set[str]:
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if PARSING.search(path.read_text(encoding="utf-8")):
            found.add(path.relative_to(PACKAGE).as_posix())
    return found


def test_only_gguf_file_parses_gguf_headers():
    parsers = _parsers()
    assert READER in parsers  # (the pattern still finds the reader itself)
    assert parsers - {READER} - set(PENDING) == set()


def test_the_pending_exceptions_are_still_needed():
    assert set(PENDING) <= _parsers(), "a module on PENDING no longer parses GGUF headers: take it off the list"
