"""A GGUF's tokenizer, as its in-place cache keeps it, read with the `tokenizers` library alone.

The first load of a GGUF in place saves its tokenizer beside the blocks (tokenizer.json, tokenizer_config.json,
chat_template.jinja: gguf_model.py; built by gguf_tokenizer.py where it can, by transformers' GGUF converter
otherwise: the same files). transformers then reads those
files back as a `TokenizersBackend` whose encoding and decoding are the Rust tokenizer's own calls; importing
transformers for that costs a second or more of start-up (issue 45). `NativeTokenizer` reads the same files with
`tokenizers` and answers what specdec asks of a tokenizer (calling it on text, `encode`, `decode`, the special
tokens and their ids, the vocabulary, the chat template: texts/chat_template.py renders it) by the same calls.

`load_native_tokenizer(folder)` returns None for a tokenizer_config.json that asks for anything transformers
would do beyond those calls (another tokenizer class, clean-up of decoded spaces, added BOS or EOS tokens
re-templated, ...): such a folder is read by transformers, as before.
tests/specdec_cli/target_model/test_native_tokenizer.py compares both tokenizers on many texts, every token id and
the chat templates, for the default model, Qwen2.5-Coder and the tests' small GGUFs.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from tokenizers import Tokenizer

from ...files import read_json_bounded

SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
# tokenizer_config.json keys that change nothing in encoding or decoding
PLAIN_KEYS = {"backend", "is_local", "local_files_only", "model_max_length", "tokenizer_class", "name_or_path",
              "padding_side", "truncation_side", "model_input_names", "chat_template", "extra_special_tokens",
              *SPECIAL_NAMES}
FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def load_native_tokenizer(folder: Path) -> Optional["NativeTokenizer"]:
    """The folder's tokenizer read with `tokenizers`, or None when transformers must read it (module docstring)."""
    try:
        settings = read_json_bounded(folder / "tokenizer_config.json")
    except (OSError, ValueError):
        return None
    if not isinstance(settings, dict) or settings.get("tokenizer_class") not in CLASSES:
        return None
    extra = {key for key, value in settings.items() if key not in PLAIN_KEYS}
    extra -= {key for key in ("clean_up_tokenization_spaces", "split_special_tokens") if settings.get(key) is False}
    if extra or settings.get("extra_special_tokens") or not (folder / "tokenizer.json").is_file():
        return None
    template_file = folder / "chat_template.jinja"
    template = template_file.read_text(encoding="utf-8") if template_file.is_file() else settings.get("chat_template")
    return NativeTokenizer(Tokenizer.from_file(str(folder / "tokenizer.json")), settings, template, folder)


def _content(value: Any) -> Optional[str]:
    """A special token as tokenizer_config.json writes it (a string, or an AddedToken's dict) -> its text."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class NativeTokenizer:
    """transformers' TokenizersBackend's answers, by the same `tokenizers` calls (see the module docstring)."""

    def __init__(self, backend: Tokenizer, settings: dict[str, Any], chat_template: Optional[str], folder: Path):
        self.backend_tokenizer = backend
        self.chat_template = chat_template
        self.name_or_path = str(folder)
        self._folder = folder
        self.special_tokens_map: dict[str, str] = {}
        for name in SPECIAL_NAMES:
            token = _content(settings.get(name))
            if token is not None:
                self.special_tokens_map[name] = token
        self.added_tokens_decoder = backend.get_added_tokens_decoder()

    def _token_id(self, name: str) -> Optional[int]:
        token = self.special_tokens_map.get(name)
        return None if token is None else self.backend_tokenizer.token_to_id(token)

    bos_token = property(lambda self: self.special_tokens_map.get("bos_token"))
    eos_token = property(lambda self: self.special_tokens_map.get("eos_token"))
    unk_token = property(lambda self: self.special_tokens_map.get("unk_token"))
    pad_token = property(lambda self: self.special_tokens_map.get("pad_token"))
    bos_token_id = property(lambda self: self._token_id("bos_token"))
    eos_token_id = property(lambda self: self._token_id("eos_token"))
    unk_token_id = property(lambda self: self._token_id("unk_token"))
    pad_token_id = property(lambda self: self._token_id("pad_token"))

    @property
    def all_special_tokens(self) -> list[str]:
        return list(dict.fromkeys(self.special_tokens_map.values()))

    def __call__(self, text: Union[str, Sequence[str]], add_special_tokens: bool = True,
                 return_attention_mask: bool = True, verbose: bool = True) -> dict[str, Any]:
        """transformers' call: one text's ids (and attention mask), or a list of texts' lists (`verbose` is
        transformers' warning switch: nothing here warns)."""
        if isinstance(text, str):
            encodings = [self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens)]
        elif self.backend_tokenizer.padding is None and self.backend_tokenizer.truncation is None:
            encodings = self.backend_tokenizer.encode_batch(list(text), add_special_tokens=add_special_tokens)
        else:  # never padded or cut, as transformers' call without padding= or truncation=
            encodings = [self.backend_tokenizer.encode(item, add_special_tokens=add_special_tokens) for item in text]
        ids = [list(encoding.ids) for encoding in encodings]
        masks = [list(encoding.attention_mask) for encoding in encodings]
        one = isinstance(text, str)
        result: dict[str, Any] = {"input_ids": ids[0] if one else ids}
        if return_attention_mask:
            result["attention_mask"] = masks[0] if one else masks
        return result

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, token_ids: Union[int, Sequence[int]], skip_special_tokens: bool = False) -> str:
        ids = [token_ids] if isinstance(token_ids, int) else [int(token) for token in token_ids]
        return self.backend_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, token_ids: Union[int, Sequence[int]]) -> Any:
        if isinstance(token_ids, int):
            return self.backend_tokenizer.id_to_token(token_ids)
        return [self.backend_tokenizer.id_to_token(int(token)) for token in token_ids]

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def get_chat_template(self) -> str:
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        return self.chat_template

    def save_pretrained(self, folder: Union[str, Path]) -> None:
        """Copy the tokenizer's files (as transformers wrote them) into `folder`."""
        target = Path(folder)
        target.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            if (self._folder / name).is_file():
                shutil.copyfile(self._folder / name, target / name)
