"""A short, stable fingerprint of a tokenizer, so an index is only used with the tokenizer it was built for.

`tokenizer_fingerprint(tokenizer)` hashes the vocabulary (token -> id pairs, sorted by id), the special
added tokens (id, text) and the EOS token of a Hugging Face tokenizer; no model is loaded and nothing else
(normaliser, merges, the pad token a caller may set at run time) is read. Two tokenizers with the same
fingerprint map ids to the same strings. The result looks like "sha256:0123456789abcdef".
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def tokenizer_fingerprint(tokenizer: Any) -> str:
    vocab = tokenizer.get_vocab()
    pairs = sorted(((int(token_id), str(token)) for token, token_id in vocab.items()))
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    special = sorted(
        (int(token_id), str(getattr(token, "content", token)))
        for token_id, token in added.items()
        if getattr(token, "special", False)
    )
    if not special:  # tokenizers without added-token records: fall back to the named special tokens
        special = sorted((-1, str(token)) for token in set(getattr(tokenizer, "all_special_tokens", None) or []))
    payload = {"vocab": pairs, "special": special, "eos": str(getattr(tokenizer, "eos_token", None))}
    digest = hashlib.sha256(json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    return "sha256:" + digest.hexdigest()[:16]
