"""Fill-in-the-middle prompts: a code model's prefix, suffix and middle tokens found in its vocabulary, and the
prompt that asks it for the text between a prefix and a suffix.

A model trained for fill-in-the-middle (Qwen2.5-Coder, StarCoder, CodeLlama, DeepSeek-Coder, ...) reads

    [BOS] extra context  <PRE> prefix  <SUF> suffix  <MID>

and writes the middle, ending it with an end-of-text token (or one of its FIM padding or file tokens). Where the
vocabulary has the repository and file-separator tokens of repository-level training (Qwen2.5-Coder's
`<|repo_name|>` and `<|file_sep|>`), the extra context is laid out as files of a repository, as llama-server lays
out its /infill prompt:

    <REPO>myproject\\n <SEP>name\\n text ... <SEP>filename\\n <PRE> prefix ...

else each extra chunk follows a "--- snippet ---" line. (A BOS, where the tokenizer puts one, comes first;
llama-server puts the extra context before it.) `middle` (llama-server's /infill `prompt`) continues the prefix:
the text already typed at the cursor. The tokens are found by their text (`ROLE_TEXTS`), as llama.cpp finds them
in a GGUF without FIM metadata; a model without all three of prefix, suffix and middle has none.

What it keeps when the pieces are long: the prefix's last PREFIX_MOST tokens, the suffix's first SUFFIX_MOST, and
of the extra context the end that fits a bound on the whole prompt. Not here: the requests that carry the pieces
(server/requests.py, server/llama_api.py) and generating the middle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

# the texts each role's token has in the vocabularies of the code models people run
ROLE_TEXTS = {
    "prefix": ("<|fim_prefix|>", "<fim_prefix>", "<fim-prefix>", "<PRE>", "▁<PRE>", "<｜fim▁begin｜>"),
    "suffix": ("<|fim_suffix|>", "<fim_suffix>", "<fim-suffix>", "<SUF>", "▁<SUF>", "<｜fim▁hole｜>"),
    "middle": ("<|fim_middle|>", "<fim_middle>", "<fim-middle>", "<MID>", "▁<MID>", "<｜fim▁end｜>"),
    "pad": ("<|fim_pad|>", "<fim_pad>", "<fim-pad>"),
    "repo": ("<|repo_name|>", "<repo_name>", "<reponame>"),
    "file_sep": ("<|file_sep|>", "<file_sep>"),
}
END_TEXTS = ("<|endoftext|>", "<EOT>", "▁<EOT>", "<|end_of_text|>")  # a FIM answer's end where it is not the chat's EOS
REPO_NAME = "myproject"  # the repository's name in a repository-level prompt (llama-server's)
CURRENT_FILE = "filename"  # the file being edited, which the request does not name (llama-server's placeholder)
SNIPPET = "\n\n--- snippet ---\n\n"  # before each extra chunk without repository tokens
PREFIX_MOST = 1536  # the prefix's last tokens kept ...
SUFFIX_MOST = 512  # ... and the suffix's first (less the middle's and the two tokens around it)


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's fill-in-the-middle token ids (None where it has no such token)."""

    prefix: int
    suffix: int
    middle: int
    pad: Optional[int] = None
    repo: Optional[int] = None
    file_sep: Optional[int] = None


@dataclass(frozen=True)
class FimParts:
    """What a request asks to fill: the text before and after the gap, what was typed at it, and other files."""

    prefix: str
    suffix: str
    middle: str = ""
    extra: tuple[tuple[str, str], ...] = ()  # (file name, text) of other files, before the prefix


def find_fim_tokens(tokenizer: Any) -> Optional[FimTokens]:
    """The tokenizer's FIM tokens, or None unless it has a prefix, a suffix and a middle token."""
    vocab = tokenizer.get_vocab()
    found: dict[str, Optional[int]] = {}
    for role, texts in ROLE_TEXTS.items():
        found[role] = next((int(vocab[text]) for text in texts if text in vocab), None)
    prefix, suffix, middle = found.pop("prefix"), found.pop("suffix"), found.pop("middle")
    if prefix is None or suffix is None or middle is None:
        return None
    return FimTokens(prefix, suffix, middle, **found)


def fim_end_ids(tokenizer: Any, fim: FimTokens) -> tuple[int, ...]:
    """Tokens that end a middle beside the model's own EOS: its FIM padding and file tokens, and its end of text."""
    vocab = tokenizer.get_vocab()
    ends = [fim.pad, fim.repo, fim.file_sep, *(vocab.get(text) for text in END_TEXTS)]
    return tuple(sorted({int(token) for token in ends if token is not None}))


def _ids(tokenizer: Any, text: str) -> list[int]:
    return [int(token) for token in tokenizer(text, add_special_tokens=False)["input_ids"]] if text else []


def _bos(tokenizer: Any) -> list[int]:
    """[BOS] where the tokenizer puts one before a text, else []."""
    bos = getattr(tokenizer, "bos_token_id", None)
    marked = tokenizer("a", add_special_tokens=True)["input_ids"]
    return [int(bos)] if bos is not None and len(marked) and int(marked[0]) == int(bos) else []


def fim_prompt(tokenizer: Any, fim: FimTokens, parts: FimParts, most: Optional[int] = None) -> list[int]:
    """The prompt's token ids (prefix-suffix-middle order). `most`: at most this many tokens in all, the extra
    context giving way (its end kept; None: all of it)."""
    middle = _ids(tokenizer, parts.middle)
    prefix = _ids(tokenizer, parts.prefix)[-PREFIX_MOST:]
    suffix = _ids(tokenizer, parts.suffix)[: max(0, SUFFIX_MOST - 2 - len(middle))]
    extra: list[int] = []
    repo, sep = fim.repo, fim.file_sep
    if repo is not None and sep is not None:  # a repository's files
        extra += [repo, *_ids(tokenizer, f"{REPO_NAME}\n")]
        for name, text in parts.extra:
            extra += [sep, *_ids(tokenizer, f"{name}\n"), *_ids(tokenizer, text)]
        extra += [sep, *_ids(tokenizer, f"{CURRENT_FILE}\n")]
    else:
        for _, text in parts.extra:
            extra += [*_ids(tokenizer, SNIPPET), *_ids(tokenizer, text)]
    core = [fim.prefix, *prefix, *middle, fim.suffix, *suffix, fim.middle]
    bos = _bos(tokenizer)
    if most is not None:
        extra = extra[len(extra) - max(0, min(most - len(bos) - len(core), len(extra))):]
    return [*bos, *extra, *core]


def cut_at_indent(text: str, n_indent: int) -> Optional[int]:
    """Where an answer ends under llama-server's `n_indent`: the first line after the first whose first character
    that is not a space or tab comes before column `n_indent` ends the answer before that character (the line's
    indentation stays); None when no line does (a line of blanks alone is not judged yet)."""
    if n_indent <= 0:
        return None
    start = text.find("\n")
    while start >= 0:
        position = start + 1
        while position < len(text) and text[position] in " \t":
            position += 1
        if position < len(text) and position - (start + 1) < n_indent:
            return position
        start = text.find("\n", start + 1)
    return None


def check_extra(chunks: Sequence[Any]) -> tuple[tuple[str, str], ...]:
    """llama-server's `input_extra` ([{"filename", "text"}]) as (name, text) pairs; ValueError naming the fault."""
    pairs = []
    for chunk in chunks:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise ValueError("each chunk must be an object with a string 'text'")
        name = chunk.get("filename", "tmp")
        if not isinstance(name, str):
            raise ValueError("a chunk's 'filename' must be a string")
        pairs.append((name, chunk["text"]))
    return tuple(pairs)
