"""Fill-in-the-middle prompts (texts/fim.py): the tokens found by their text, the prompt's layout with and without
repository tokens, what is kept of long pieces, the tokens that end a middle, and llama-server's `n_indent` rule."""

from __future__ import annotations

import pytest

from specdec_cli.texts.fim import (
    CURRENT_FILE,
    PREFIX_MOST,
    REPO_NAME,
    SNIPPET,
    SUFFIX_MOST,
    FimParts,
    check_extra,
    cut_at_indent,
    fim_end_ids,
    fim_prompt,
    find_fim_tokens,
)

QWEN = {"<|fim_prefix|>": 1, "<|fim_suffix|>": 2, "<|fim_middle|>": 3, "<|fim_pad|>": 4, "<|repo_name|>": 5,
        "<|file_sep|>": 6, "<|endoftext|>": 7}


class Chars:
    """A tokenizer of one token a character (id = code point + 100) beside the special tokens given."""

    def __init__(self, specials: dict, bos: int | None = None):
        self.specials, self.bos_token_id = specials, bos

    def get_vocab(self) -> dict:
        return {**{chr(code): code + 100 for code in range(32, 127)}, **self.specials}

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        marked = add_special_tokens and self.bos_token_id is not None
        return {"input_ids": ([self.bos_token_id] if marked else []) + [ord(character) + 100 for character in text]}


def ids(text: str) -> list[int]:
    return [ord(character) + 100 for character in text]


def test_the_tokens_are_found_by_their_text():
    fim = find_fim_tokens(Chars(QWEN))
    assert (fim.prefix, fim.suffix, fim.middle, fim.pad, fim.repo, fim.file_sep) == (1, 2, 3, 4, 5, 6)
    codellama = find_fim_tokens(Chars({"▁<PRE>": 9, "▁<SUF>": 10, "▁<MID>": 11, "▁<EOT>": 12}))
    assert (codellama.prefix, codellama.suffix, codellama.middle, codellama.repo) == (9, 10, 11, None)
    assert find_fim_tokens(Chars({"<|fim_prefix|>": 1, "<|fim_suffix|>": 2})) is None  # no middle: no FIM
    assert find_fim_tokens(Chars({})) is None


def test_a_repository_level_prompt():
    fim = find_fim_tokens(Chars(QWEN))
    parts = FimParts(prefix="def f(", suffix=")\n", middle="x", extra=(("a.py", "A = 1\n"), ("b.py", "B")))
    assert fim_prompt(Chars(QWEN), fim, parts) == [
        5, *ids(f"{REPO_NAME}\n"), 6, *ids("a.py\n"), *ids("A = 1\n"), 6, *ids("b.py\n"), *ids("B"),
        6, *ids(f"{CURRENT_FILE}\n"), 1, *ids("def f("), *ids("x"), 2, *ids(")\n"), 3]


def test_without_repository_tokens_the_extra_chunks_are_snippets_and_bos_comes_first():
    specials = {"<fim_prefix>": 1, "<fim_suffix>": 2, "<fim_middle>": 3}
    tokenizer = Chars(specials, bos=8)
    fim = find_fim_tokens(tokenizer)
    parts = FimParts(prefix="p", suffix="s", extra=(("a.py", "A"),))
    assert fim_prompt(tokenizer, fim, parts) == [8, *ids(SNIPPET), *ids("A"), 1, *ids("p"), 2, *ids("s"), 3]
    assert fim_prompt(tokenizer, fim, FimParts(prefix="", suffix="")) == [8, 1, 2, 3]


def test_long_pieces_keep_the_text_nearest_the_gap():
    tokenizer = Chars(QWEN)
    fim = find_fim_tokens(tokenizer)
    prefix, suffix = "a" * 2000 + "b" * PREFIX_MOST, "c" * (SUFFIX_MOST - 4) + "d" * 3000
    prompt = fim_prompt(tokenizer, fim, FimParts(prefix=prefix, suffix=suffix, middle="xy"))
    body = prompt[prompt.index(1):]
    assert body == [1, *ids("b" * PREFIX_MOST), *ids("xy"), 2, *ids("c" * (SUFFIX_MOST - 4)), 3]
    # under a bound on the whole prompt, the extra context gives way, keeping its end
    parts = FimParts(prefix="p", suffix="s", extra=(("a.py", "0123456789"),))
    whole = fim_prompt(tokenizer, fim, parts)
    assert fim_prompt(tokenizer, fim, parts, most=None) == whole
    core = fim_prompt(tokenizer, fim, FimParts(prefix="p", suffix="s"))
    extra = whole[: len(whole) - (len(core) - len([5, *ids(f"{REPO_NAME}\n"), 6, *ids(f"{CURRENT_FILE}\n")]))]
    for room in (0, 3, len(extra), len(extra) + 5):
        trimmed = fim_prompt(tokenizer, fim, parts, most=len(whole) - len(extra) + room)
        kept = min(room, len(extra))
        assert trimmed == extra[len(extra) - kept:] + whole[len(extra):]
    bos = Chars({"<fim_prefix>": 1, "<fim_suffix>": 2, "<fim_middle>": 3}, bos=8)  # BOS counts, never gives way
    snippets = FimParts(prefix="p", suffix="s", extra=(("a.py", "0123"),))
    assert fim_prompt(bos, find_fim_tokens(bos), snippets, most=8) == [8, *ids("23"), 1, *ids("p"), 2, *ids("s"), 3]


def test_what_ends_a_middle():
    tokenizer = Chars(QWEN)
    assert fim_end_ids(tokenizer, find_fim_tokens(tokenizer)) == (4, 5, 6, 7)
    plain = Chars({"<PRE>": 1, "<SUF>": 2, "<MID>": 3})
    assert fim_end_ids(plain, find_fim_tokens(plain)) == ()


@pytest.mark.parametrize("text, n_indent, cut", [
    ("x\n    y", 4, None),  # enough indentation
    ("x\n  y", 4, 4),  # too little: the answer ends before the `y`, its indentation kept
    ("no newline at all", 4, None),  # the first line is never judged
    ("x\n    y\nz", 4, 8),  # the third line
    ("x\n\ty", 2, 3),  # a tab is one character
    ("x\n\n    y", 2, 2),  # an empty line is indented less than anything
    ("x\n   ", 4, None),  # a line of blanks alone is not judged yet
    ("x\ny", 0, None),  # 0: no rule
])
def test_n_indent_ends_the_answer_where_llama_server_does(text, n_indent, cut):
    assert cut_at_indent(text, n_indent) == cut


def test_input_extra_is_checked():
    assert check_extra([{"filename": "a.py", "text": "A"}, {"text": "B"}]) == (("a.py", "A"), ("tmp", "B"))
    for bad in ([{"filename": "a.py"}], ["text"], [{"text": "A", "filename": 3}]):
        with pytest.raises(ValueError):
            check_extra(bad)


def test_judging_from_the_last_line_end_finds_the_cut_a_whole_scan_finds():
    """The server judges a growing answer from the last line end it saw (server/answering.py): against brute force
    (every prefix scanned whole), the same first length at which a cut appears."""
    import random

    generator = random.Random(5)
    for _ in range(300):
        text = "".join(generator.choice("ab \t\n") for _ in range(generator.randrange(1, 40)))
        n_indent = generator.randrange(1, 4)
        whole = next((k for k in range(1, len(text) + 1) if cut_at_indent(text[:k], n_indent) is not None), None)
        judged, found = 0, None
        for k in range(1, len(text) + 1):
            if cut_at_indent(text[:k][judged:], n_indent) is not None:
                found = k
                break
            judged = max(judged, text[:k].rfind("\n"))
        assert found == whole, (text, n_indent)
