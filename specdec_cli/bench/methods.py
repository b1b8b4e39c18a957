"""Which rows a bench run has: method names on the command line -> `Method`s in running order.

`none` (plain decoding through the same engine, the baseline) always comes first, then the drafters, the
oracle rows (`oracle-K`: a drafter replaying the baseline's answer in K-token drafts, the ceiling at that
length) and the reference rows (`native`: plain decoding on the model's own kernels where verification is
row-invariant; `hf`: transformers' own `generate`; `hf-pld`: its prompt lookup decoding; `llama.cpp`: llama.cpp's
plain decoding of the same GGUF through its Python binding; `llama.cpp-pld`: the binding's prompt lookup decoding;
`llama-server`: llama.cpp's own server binary, plainly or with `llama-server:TYPE` its n-gram speculative decoding,
or a server already running at `http://HOST:PORT`).
Names only: nothing here loads a model or runs anything.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional, Sequence

from ..drafters import DRAFTERS, is_drafter
from ..errors import SpecdecError
from .llama_server_names import LLAMA_SERVER, SPEC_TYPES, is_server_name, is_url, parse_url

BASELINE = "none"
NATIVE = "native"  # plain decoding with the model's own kernels, where verification is row-invariant
REFERENCES = {
    NATIVE: "plain decoding through the same engine on the model's own kernels (row-invariant verification off): "
            "the fastest plain decoding in this dtype; added by itself when verification is row-invariant",
    "hf": "transformers generate, greedy: plain decoding outside specdec",
    "hf-pld": "transformers prompt lookup decoding, prompt_lookup_num_tokens=10",
    "llama.cpp": "llama.cpp's plain greedy decoding of the same GGUF through its Python binding (llama-cpp-python; "
                 "skipped when absent)",
    "llama.cpp-pld": "the Python binding's prompt lookup decoding (llama-cpp-python's LlamaPromptLookupDecoding, "
                     "10 tokens)",
    LLAMA_SERVER: "llama.cpp's own server (the llama-server binary) decoding the same GGUF plainly, timed by its "
                  "own per-request timings (skipped when the binary is absent)",
    **{f"{LLAMA_SERVER}:{kind}": f"llama-server with --spec-type {kind} (its n-gram speculative decoding)"
       for kind in SPEC_TYPES},
}
LLAMA_CPP_KIND = "llama.cpp"
LLAMA_SERVER_KIND = LLAMA_SERVER
EXTERNAL_KINDS = ("hf", LLAMA_CPP_KIND, LLAMA_SERVER_KIND)  # rows decoded outside specdec's engine
HF_PLD_TOKENS = 10
ORACLE = "oracle"
DEFAULT_ORACLE_LENGTHS = (2, 4, 8, 16)
WARMUP_MAX_NEW_TOKENS = 16
OVERALL = "overall"



@dataclass(frozen=True)
class Method:
    name: str  # the row label: none, pld, sam, oracle-8, hf, hf-pld, llama.cpp, llama-server, llama-server@HOST:PORT
    kind: str  # "engine" (a registered drafter), "oracle", "native" (plain, own kernels), "hf" (generate),
    # "llama.cpp" (llama-cpp-python on the same GGUF) or "llama-server" (llama.cpp's server binary)
    draft_length: int = 0  # oracle: tokens per draft
    url: str = ""  # llama-server rows at a server already running: its base URL

    @property
    def drafter(self) -> str:
        return self.name if self.kind == "engine" else BASELINE if self.kind == NATIVE else ""


def split_names(text: Optional[str | Sequence[str]]) -> list[str]:
    """'none, pld,sam' -> ['none', 'pld', 'sam'] (lists of such strings are flattened)."""
    if text is None:
        return []
    parts = [text] if isinstance(text, str) else list(text)
    return [name.strip().lower() for part in parts for name in str(part).split(",") if name.strip()]


def parse_lengths(text: Optional[str | Sequence[int]]) -> list[int]:
    if text is None:
        return []
    items = split_names(text) if isinstance(text, str) else [str(item) for item in text]
    lengths: list[int] = []
    for item in items:
        try:
            value = int(item)
        except ValueError:
            raise SpecdecError(f"oracle_lengths takes whole numbers such as 2,4,8, got {item!r}",
                               setting="oracle_lengths") from None
        if value < 1:
            raise SpecdecError(f"oracle_lengths must be >= 1, got {value}", setting="oracle_lengths")
        if value not in lengths:
            lengths.append(value)
    return lengths


def warn_repeated(repeated: Sequence[str]) -> None:
    """One warning naming the methods given more than once, whose repeats were dropped; none where none was."""
    if repeated:
        named = ", ".join(repr(name) for name in dict.fromkeys(repeated))
        warnings.warn(f"dropped the repeated method{'s' if len(set(repeated)) > 1 else ''} {named}: each method is "
                      "benchmarked once", stacklevel=3)


def resolve_methods(
    drafters: Sequence[str], references: Sequence[str] = (), oracle_lengths: Sequence[int] = ()
) -> list[Method]:
    """The method list in running order: `none` first (always), drafters, oracle rows, reference rows.

    `hf` and `hf-pld` may be named among the drafters or the references alike. A name given more than once has
    one row, with one warning naming it."""
    engine: list[str] = []
    refs: list[str] = []
    repeated: list[str] = []  # names given again, dropped
    urls: dict[str, str] = {}  # row name -> base URL of a llama.cpp server already running
    for name in [*drafters, *references]:
        if is_url(name):
            url, name = parse_url(name)
            urls[name] = url
        if name in REFERENCES or name in urls:
            (refs if name not in refs else repeated).append(name)
        elif is_server_name(name):
            choices = ", ".join(f"{LLAMA_SERVER}:{kind}" for kind in SPEC_TYPES)
            raise SpecdecError(f"unknown llama-server mode {name!r}; choose from: {LLAMA_SERVER}, {choices}, "
                               "or a server's address http://HOST:PORT")
        elif is_drafter(name):
            (engine if name not in engine else repeated).append(name)
        elif name == ORACLE or name.startswith(ORACLE + "-"):
            raise SpecdecError("oracle rows come from --oracle (and --oracle-lengths), not from --drafters")
        else:
            choices = ", ".join([*DRAFTERS, "sam+AUX", *REFERENCES, "http://HOST:PORT"])
            raise SpecdecError(f"unknown method {name!r}; choose from: {choices}")
    warn_repeated(repeated)
    names = [BASELINE] + [name for name in engine if name != BASELINE]
    methods = [Method(name, "engine") for name in names]
    methods += [Method(f"{ORACLE}-{length}", ORACLE, length) for length in oracle_lengths]
    methods += [Method(name, reference_kind(name), url=urls.get(name, "")) for name in refs]
    return methods


def reference_kind(name: str) -> str:
    if name == NATIVE:
        return NATIVE
    if name == LLAMA_SERVER or name.startswith((LLAMA_SERVER + ":", LLAMA_SERVER + "@")):
        return LLAMA_SERVER_KIND
    return LLAMA_CPP_KIND if name.startswith(LLAMA_CPP_KIND) else "hf"
