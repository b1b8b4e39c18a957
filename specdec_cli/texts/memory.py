"""The answer memory: every answer `specdec chat` commits, kept per target under $SPECDEC_HOME, for `sam`.

A person's use of one model repeats itself (the same code edited again, the same kinds of questions), and the
corpus that drafts best for a target is its own earlier answers. So each answer's committed token ids are
appended to the target's memory, and the `sam` drafter reads the memory as a static index (drafters/sam.py).

Layout: `$SPECDEC_HOME/memory/NAME-FINGERPRINT/`, one JSON file per answer named `TIME_NS-PID-TOKENS.json`
(format, tokenizer fingerprint, target, a hash of the prompt it answered, the token ids), each written
atomically under a name no other process can pick, so two chats at once lose nothing and a crash loses at
most the answer being written. The memory holds at most `cap` tokens (`SPECDEC_MEMORY_MAX_TOKENS`, default
1,000,000): appending past it deletes the oldest answers first. A file that is corrupt or was written for
another tokenizer is skipped with one line, and the rest is read. `SPECDEC_NO_MEMORY=1` turns the memory off
(nothing read or written), as `--no-memory` does per run. Never pickle: JSON only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from ..errors import SpecdecError
from ..files import check_output_file, read_json_bounded, write_atomic
from ..home import home_folder, specdec_home
from ..target_model.load import models, target_source
from .data_rows import read_rows
from .fingerprint import tokenizer_fingerprint

FORMAT = 1
DEFAULT_CAP = 1_000_000  # tokens
ENV_OFF = "SPECDEC_NO_MEMORY"
ENV_CAP = "SPECDEC_MEMORY_MAX_TOKENS"
_NAME = re.compile(r"^(\d+)-(\d+)-(\d+)\.json$")  # TIME_NS-PID-TOKENS.json
# answers read in this process: (directory, fingerprint) -> file name -> ((size, mtime_ns), token ids, prompt hash)
_READ: dict = {}
_READ_LOCK = threading.Lock()


def memory_enabled() -> bool:
    return os.environ.get(ENV_OFF, "").strip().lower() not in ("1", "true", "yes", "on")


def memory_cap() -> int:
    raw = os.environ.get(ENV_CAP, "").strip()
    if not raw:
        return DEFAULT_CAP
    try:
        cap = int(raw)
    except ValueError:
        raise SpecdecError(f"{ENV_CAP} must be a whole number of tokens, got {raw!r}") from None
    if cap < 0:
        raise SpecdecError(f"{ENV_CAP} must be >= 0, got {cap}")
    return cap


def prompt_hash(prompt_ids: Sequence[int]) -> str:
    """What identifies the prompt an answer answered (the bench checks its own prompts against it)."""
    return hashlib.sha256(",".join(str(int(token)) for token in prompt_ids).encode()).hexdigest()[:16]


def memory_dir(target_name: str, fingerprint: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", target_name).strip("_") or "model"
    return specdec_home() / "memory" / f"{safe}-{fingerprint[:12] or 'unknown'}"


@dataclass
class Recalled:
    """What reading a memory gave: its answers' token ids (oldest first) and what was skipped."""

    answers: list[list[int]] = field(default_factory=list)
    prompt_hashes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "NAME: why", one per skipped file

    @property
    def tokens(self) -> int:
        return sum(len(answer) for answer in self.answers)

    def warning(self) -> Optional[str]:
        if not self.skipped:
            return None
        more = f" (and {len(self.skipped) - 1} more)" if len(self.skipped) > 1 else ""
        return f"memory: skipped {self.skipped[0]}{more}; the rest is used"


class Memory:
    """One target's memory directory."""

    def __init__(self, directory: str | Path, fingerprint: str, target: str = "", cap: Optional[int] = None):
        self.directory = Path(directory).expanduser()
        self.fingerprint = fingerprint
        self.target = target
        self.cap = memory_cap() if cap is None else cap

    def _files(self) -> list[tuple[int, int, Path]]:
        """(time_ns, tokens, path) of every answer file, oldest first."""
        if not self.directory.is_dir():
            return []
        files = []
        for path in self.directory.iterdir():
            match = _NAME.match(path.name)
            if match:
                files.append((int(match.group(1)), int(match.group(3)), path))
        return sorted(files)

    def append(self, tokens: Sequence[int], prompt_ids: Sequence[int] = ()) -> Optional[Path]:
        """Store one answer (atomically), then evict the oldest answers beyond the cap. Empty answers and a
        cap of 0 store nothing."""
        tokens = [int(token) for token in tokens]
        if not tokens or self.cap <= 0:
            return None
        document = {"format": FORMAT, "fingerprint": self.fingerprint, "target": self.target,
                    "prompt": prompt_hash(prompt_ids) if prompt_ids else "", "time": time.time(), "tokens": tokens}
        path = self.directory / f"{time.time_ns()}-{os.getpid()}-{len(tokens)}.json"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)  # ours to create, under $SPECDEC_HOME
        except OSError as error:
            raise SpecdecError(f"memory {self.directory}: cannot create it ({error.strerror or error})") from None
        write_atomic(path, json.dumps(document, separators=(",", ":")))
        self.evict()
        return path

    def evict(self) -> int:
        """Delete the oldest answers until at most `cap` tokens remain; returns how many were deleted."""
        files = self._files()
        total = sum(tokens for _, tokens, _ in files)
        deleted = 0
        for _, tokens, path in files:
            if total <= self.cap:
                break
            try:
                path.unlink()
            except FileNotFoundError:  # another process evicted it first
                pass
            total -= tokens
            deleted += 1
        return deleted

    def recall(self) -> Recalled:
        """Every answer this memory holds for this tokenizer; corrupt or foreign files are skipped. A file read
        before in this process (the same name, size and time: answer files are written once, under names no
        one else picks) is not read again: a server rebuilds its drafter from the memory after every answer."""
        recalled = Recalled()
        with _READ_LOCK:
            known = _READ.setdefault((str(self.directory.absolute()), self.fingerprint), {})
            listed = set()
            for _, _, path in self._files():
                listed.add(path.name)
                self._recall_one(path, known, recalled)
            for gone in set(known) - listed:  # evicted: never recalled again
                del known[gone]
        return recalled

    def _recall_one(self, path: Path, known: dict, recalled: Recalled) -> None:
        stamp = None
        try:
            status = path.stat()
            stamp = (status.st_size, status.st_mtime_ns)
            held = known.get(path.name)
            if held is not None and held[0] == stamp:
                recalled.answers.append(held[1].tolist())
                recalled.prompt_hashes.append(held[2])
                return
        except FileNotFoundError:
            return  # evicted meanwhile
        except OSError:
            pass  # read below, which says why
        tokens = self._read_one(path, recalled)
        if tokens is not None and stamp is not None and max(tokens, default=0) < 2**63:
            known[path.name] = (stamp, array("q", tokens), recalled.prompt_hashes[-1])

    def _read_one(self, path: Path, recalled: Recalled) -> Optional[list[int]]:
        """One answer file's token ids (appended to `recalled`), or None where it was skipped."""
        try:
            document = read_json_bounded(path)
            tokens = document["tokens"]
            if document.get("format") != FORMAT:
                raise ValueError(f"format {document.get('format')}")
            if document.get("fingerprint") != self.fingerprint:
                raise ValueError("written for another tokenizer")
            if not isinstance(tokens, list) or not all(isinstance(token, int) and token >= 0 for token in tokens):
                raise ValueError("token ids are not whole numbers")
        except FileNotFoundError:
            return None  # evicted meanwhile
        except (OSError, ValueError, KeyError, TypeError) as error:
            reason = str(error) if isinstance(error, ValueError) and str(error) else "corrupt"
            recalled.skipped.append(f"{path.name}: {reason}")
            return None
        recalled.answers.append(tokens)
        recalled.prompt_hashes.append(str(document.get("prompt", "")))
        return tokens

    def info(self) -> dict:
        files = self._files()
        times = [stamp for stamp, _, _ in files]
        size = sum(path.stat().st_size for _, _, path in files if path.exists())
        return {"directory": str(self.directory), "answers": len(files),
                "tokens": sum(tokens for _, tokens, _ in files), "bytes": size, "cap_tokens": self.cap,
                "oldest": min(times) / 1e9 if times else None, "newest": max(times) / 1e9 if times else None}

    def clear(self) -> int:
        """Delete every answer; returns how many."""
        files = self._files()
        for _, _, path in files:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
        return len(files)


def open_memory(target: str) -> tuple["Memory", Any]:
    """The memory of a target named as `--target` names it, and its tokenizer (loaded, no model)."""
    home_folder("memory")  # a home that is a file: one line now, not an empty memory after loading the tokenizer
    tokenizer = models.load_tokenizer(target)
    fingerprint = tokenizer_fingerprint(tokenizer)
    name = target_source.resolve_target(target).name
    return Memory(memory_dir(name, fingerprint), fingerprint, name), tokenizer


def check_export_output(path: str | Path, force: bool = False) -> Path:
    """Before the tokenizer loads: the export's folder exists, and an existing file there is replaced only when
    it is an unchanged earlier output of specdec (files.written_here) or with `force`."""
    # PATH is an argument: no --path flag to name
    return check_output_file(path, "the export file", flag=False, force=force, force_flag="--force")


def export_corpus(memory: Memory, tokenizer: Any, path: str | Path) -> int:
    """Write every remembered answer as a JSON line {"text": ...} (a `build-index` corpus); returns how many."""
    recalled = memory.recall()
    decode = tokenizer.decode
    lines = [json.dumps({"text": decode(answer, skip_special_tokens=True)}, ensure_ascii=False)
             for answer in recalled.answers]
    write_atomic(path, "".join(line + "\n" for line in lines))
    return len(lines)


IMPORT_PIECE = 2048  # a corpus is remembered in answers of at most this many tokens


def import_file(memory: Memory, tokenizer: Any, path: str) -> tuple[int, int]:
    """Remember a `distill generate` output (its answers, checked against the tokenizer) or any corpus (text,
    JSONL, a folder; tokenized once, kept in pieces). Returns (answers added, tokens added)."""
    rows = _generate_rows(path, memory.fingerprint)
    answers: list[tuple[list[int], list[int]]] = []
    if rows is not None:
        answers = [([int(t) for t in row["answer_ids"]], [int(t) for t in row["prompt_ids"]]) for row in rows]
    else:
        from .corpus import iter_documents, tokenize_documents
        from .corpus_inputs import CorpusStats, resolve_inputs

        stats = CorpusStats()
        ids, _ = tokenize_documents(iter_documents(resolve_inputs([path], stats=stats), "text", stats), tokenizer)
        answers = [([int(t) for t in ids[start : start + IMPORT_PIECE]], []) for start in range(0, len(ids),
                                                                                                 IMPORT_PIECE)]
    if not answers:
        raise SpecdecError(f"empty corpus: no text in {path}; nothing to remember")
    added = tokens = 0
    for answer, prompt in answers:
        if memory.append(answer, prompt) is not None:
            added += 1
            tokens += len(answer)
    return added, tokens


def _generate_rows(path: str, fingerprint: str) -> Optional[list[dict]]:
    """The rows of a `distill generate` file (checked against the tokenizer), or None for any other input."""
    file = Path(path).expanduser()
    if file.suffix != ".jsonl" or not file.is_file():
        return None
    with open(file, encoding="utf-8", errors="replace") as handle:
        first = handle.readline()
    try:
        row = json.loads(first)
    except ValueError:
        return None
    if not isinstance(row, dict) or "answer_ids" not in row or "prompt_ids" not in row:
        return None

    return read_rows(str(file), fingerprint)
