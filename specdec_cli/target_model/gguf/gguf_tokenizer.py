"""A GGUF's byte-level BPE tokenizer (`tokenizer.ggml.model` "gpt2": SmolLM2, Qwen2.5, ...) written as tokenizer
files from its metadata with the `tokenizers` library alone: the same tokenizer.json, tokenizer_config.json and
chat_template.jinja, byte for byte, that transformers' GGUF converter saves for the file, without importing
transformers (a second or more of a first load, issue 45). tests/specdec_cli/target_model/test_native_first_load.py
compares the files with transformers' for the default model, Qwen2.5-Coder when at hand and the tests' small GGUFs.

What the converter does for such a file, and so what is done here:
- the vocabulary is the token list, each token spelled in GPT-2's byte alphabet (a token with a character outside
  it is spelled as its UTF-8 bytes), the later of two equal spellings keeping the name; the merges are the file's,
  each split at its space; a BPE model with no unknown token, no dropout, no affixes;
- the pre-tokenizer is byte-level with GPT-2's split, or the split the file's `tokenizer.ggml.pre` names (SPLITS)
  followed by a byte-level step without its own; the decoder is byte-level; the post-processor adds the BOS token
  before each sequence where `tokenizer.ggml.add_bos_token` is true (Llama 3's files), else nothing;
- GPT-2's "<|endoftext|>" is an added token, special: the vocabulary's, or one past its end when it has none;
- the tokens the file marks CONTROL (type 3) are added tokens, special (one with a character outside the byte
  alphabet is a mislabel and stays a plain token); USER_DEFINED (type 4) ones are added tokens, not special;
- tokenizer_config.json names the BOS, EOS, unknown and padding tokens by the file's ids.

Anything else returns None, and the caller asks transformers: another tokenizer model (SentencePiece), a
`tokenizer.ggml.pre` this table does not know, an EOS added to every text, a named special token that is not
a CONTROL token, a merge that is not two tokens. Nothing here reads a file other than through GGUFFile.metadata.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

CONTROL, USER_DEFINED = 3, 4
# tokenizer.ggml.pre -> the split transformers' converter puts before the byte-level step (the vocabulary's own
# pre-tokenization, as its tokenizer.json on the Hub writes it)
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                r"|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {"qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
          "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT}
# tokenizer.ggml.pre values the converter leaves on GPT-2's own byte-level split (None: the key is absent)
GPT2_SPLIT = (None, "default", "gpt2", "smollm")
SPECIAL_IDS = (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("unk_token", "unknown_token_id"),
               ("pad_token", "padding_token_id"))
GPT2_DEFAULT = "<|endoftext|>"  # GPT-2's unknown, BOS and EOS token
MODEL_MAX_LENGTH = int(1e30)  # transformers' "no limit"


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> character table: printable Latin-1 bytes stand for themselves, the other 68 take the
    characters from U+0100 up, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    table = {byte: chr(byte) for byte in kept}
    shifted = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + shifted)
            shifted += 1
    return table


@dataclass(frozen=True)
class TokenizerFiles:
    """A built tokenizer and what its files say beside it."""

    tokenizer: Any  # tokenizers.Tokenizer
    settings: dict[str, Any]  # tokenizer_config.json
    chat_template: Optional[str]

    def write(self, folder: Path) -> None:
        """tokenizer.json, tokenizer_config.json and chat_template.jinja (where the file has a template)."""
        self.tokenizer.save(str(folder / "tokenizer.json"))
        text = json.dumps(self.settings, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        (folder / "tokenizer_config.json").write_text(text, encoding="utf-8")
        if self.chat_template is not None:
            (folder / "chat_template.jinja").write_text(self.chat_template, encoding="utf-8")


def tokenizer_files(metadata: dict[str, Any]) -> Optional[TokenizerFiles]:
    """The tokenizer a GGUF's metadata describes (see the module docstring), or None for one this module does
    not build."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    tokens, types = metadata.get("tokenizer.ggml.tokens"), metadata.get("tokenizer.ggml.token_type")
    merges, pre = metadata.get("tokenizer.ggml.merges"), metadata.get("tokenizer.ggml.pre")
    template = metadata.get("tokenizer.chat_template")
    if metadata.get("tokenizer.ggml.model") != "gpt2" or not isinstance(tokens, list) or not tokens \
            or not all(isinstance(token, str) for token in tokens) or types is None or len(types) != len(tokens) \
            or not isinstance(merges, list) or (pre not in SPLITS and pre not in GPT2_SPLIT) \
            or metadata.get("tokenizer.ggml.add_bos_token") not in (None, True, False) \
            or metadata.get("tokenizer.ggml.add_eos_token") \
            or (template is not None and not isinstance(template, str)):
        return None
    types = [int(kind) for kind in types]
    split_merges = [merge.split(" ") for merge in merges if isinstance(merge, str)]
    if len(split_merges) != len(merges) or any(len(pair) != 2 for pair in split_merges):
        return None
    pairs = [(left, right) for left, right in split_merges]
    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {token if set(token) <= alphabet else "".join(spelling[byte] for byte in token.encode("utf-8")): index
             for index, token in enumerate(tokens)}
    settings: dict[str, Any] = {"backend": "tokenizers", "is_local": True, "local_files_only": False,
                                "model_max_length": MODEL_MAX_LENGTH, "tokenizer_class": "TokenizersBackend"}
    for name, key in SPECIAL_IDS:
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        if token_id is None:
            settings[name] = None
            continue
        if type(token_id) is not int or not 0 <= token_id < len(tokens) or types[token_id] != CONTROL \
                or not set(tokens[token_id]) <= alphabet:
            return None
        settings[name] = tokens[token_id]
    try:
        tokenizer = Tokenizer(BPE(vocab=vocab, merges=pairs, dropout=None, continuing_subword_prefix="",
                                  end_of_word_suffix="", fuse_unk=False))
    except Exception:  # merges of tokens not in the vocabulary: transformers' converter says what is wrong
        return None
    split = SPLITS.get(pre) if isinstance(pre, str) else None
    if split is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                           pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                    use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    bos = settings["bos_token"]
    if metadata.get("tokenizer.ggml.add_bos_token") is not True:
        tokenizer.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1", special_tokens=[])
    elif bos is None or ":" in bos or any(character.isspace() for character in bos):
        return None  # (a template piece is "TOKEN:type")
    else:  # BOS before each sequence
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, metadata["tokenizer.ggml.bos_token_id"])])
    # the converter's tokenizer class names GPT2_DEFAULT its unknown, BOS and EOS token before the file's own
    # names replace them, and so adds it as a special token: the vocabulary's (whatever its type), or a new one
    tokenizer.add_special_tokens([AddedToken(GPT2_DEFAULT, normalized=False, special=True)])
    control = [AddedToken(token, normalized=False, special=True) for token, kind in zip(tokens, types)
               if kind == CONTROL and set(token) <= alphabet]
    if control:
        tokenizer.add_special_tokens(control)
    user_defined = [AddedToken(token, normalized=False, special=False) for token, kind in zip(tokens, types)
                    if kind == USER_DEFINED and token in vocab]
    if user_defined:
        tokenizer.add_tokens(user_defined)
    return TokenizerFiles(tokenizer, settings, template)

