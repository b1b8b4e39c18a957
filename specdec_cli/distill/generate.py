"""Seq-KD data: the target answers prompts through the speculative engine; one JSONL row per answer.

Prompts are specdec_cli.texts.prompts' (a file, or a suite: `distill`, a few hundred training prompts deliberately
disjoint from the builtin benchmark suite so that a draft trained on them can be measured on it, `builtin` or
`humaneval`); the first turn of each is answered.

Each row (see `DataRow`) holds the prompt, its category and id, the answer text and token ids (EOS included
when the target produced it), the prompt token ids as fed to the target, the finish reason, the sampling
temperature, and the target's name and tokenizer fingerprint. Rows are appended one at a time and fsynced;
a rerun skips prompts already answered, and a last line cut short by a crash is dropped before appending.
A file that is not this command's data for this target is refused, untouched (`check_data_output`).
The rows carry `prompt` and `answer`, so the file is also a corpus for `specdec build-index`. Answering in batches
with `keep_features`, the target's features along each answer go beside the file (answer_features.py), each
answer's before its row, for an EAGLE head's training.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..drafters import DrafterOptions, make_drafter, target_info
from ..errors import SpecdecError
from ..files import check_output_file, lock_output
from ..target_model.load.load_settings import LoadSettings
from ..texts.data_rows import read_rows, read_text
from ..texts.fingerprint import tokenizer_fingerprint
from ..texts.prompt_ids import format_prompt
from ..texts.prompts import Conversation
from ..vllm import runner as vllm_runner
from ..vllm.runner import VllmPhase, VllmSettings
from .answer_features import AnswerFeatures, answers_folder, computed_by
from .batched import greedy_batches

DATA_FORMAT = 1


@dataclass
class DataRow:
    prompt: str
    category: str
    id: str
    answer: str
    answer_ids: list[int]
    prompt_ids: list[int]
    finish_reason: str
    target: str
    fingerprint: str
    temperature: float = 0.0
    format: int = DATA_FORMAT

    def as_json(self) -> dict:
        return asdict(self)


@dataclass
class GenerateProgress:
    done: int  # prompts answered in this run
    total: int  # prompts to answer in this run (already answered ones excluded)
    new_tokens: int  # answer tokens written in this run
    seconds: float
    mean_accepted_tokens: float  # of the speculative runs so far (generation speed, not draft quality)
    last: Optional[DataRow] = None

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class GenerateSummary:
    path: str
    written: int  # rows appended by this run
    skipped: int  # prompts already answered in the file
    rows: int  # rows in the file now
    new_tokens: int
    seconds: float
    mean_accepted_tokens: float
    warnings: list[str] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


def repair_tail(file: Path) -> None:
    """Drop a last line without its newline (a row cut short by a crash) so appends stay one row a line."""
    if not file.exists() or file.stat().st_size == 0:
        return
    with open(file, "rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return
        data_end = handle.seek(0, os.SEEK_END)
        position = data_end
        chunk = 4096
        while position > 0:  # find the last newline from the end
            step = min(chunk, position)
            position -= step
            handle.seek(position)
            block = handle.read(step)
            index = block.rfind(b"\n")
            if index >= 0:
                handle.truncate(position + index + 1)
                return
        handle.truncate(0)


ROW_START = '{"prompt": '  # how every row this command writes begins (json.dumps of DataRow)


def check_data_output(out_path: str, fingerprint: Optional[str] = None, target_name: Optional[str] = None,
                      warnings: Optional[list[str]] = None, setting: str = "output") -> Path:
    """The -o of `distill generate`, before anything is written: a new (or empty) file, or one holding this
    command's rows (with `fingerprint`: this target's), to resume. Anything else (another file, another target's
    rows, a last line that is not the start of a row) is refused with one line and left untouched."""
    file = check_output_file(out_path, setting, own_rule=True)  # the folder must exist, as for every output
    if not file.exists() or (file.is_file() and file.stat().st_size == 0):
        return file
    whose = " for this target" if fingerprint else ""
    try:
        if not file.is_file():
            raise SpecdecError("not a regular file")
        tail = read_text(file).rpartition("\n")[2]
        if tail.strip() and not (ROW_START.startswith(tail) or tail.startswith(ROW_START)):
            raise SpecdecError("its last line is not a row")
        rows = read_rows(str(file), fingerprint, target_name, allow_empty=True, warnings=warnings)
        if not all(row.get("fingerprint") for row in rows):
            raise SpecdecError("its rows name no tokenizer fingerprint")
    except SpecdecError as exc:
        why = str(exc)
        for prefix in (f"{file}: ", f"{file}, ", f"{out_path}: ", f"{out_path}, "):
            if why.startswith(prefix):
                why = why[len(prefix):]
                break
        flag = "-o" if setting == "output" else f"--{setting}"
        raise SpecdecError(f"{setting} {out_path}: not a data file of `specdec distill generate`{whose}, so it is "
                           f"left untouched ({why}); choose another {flag}", setting=setting) from None
    return file


def append_row(file: Path, row: DataRow) -> None:
    append_row_json(file, row.as_json())


def append_row_json(file: Path, row: dict) -> None:
    """One JSONL row appended and fsynced (a crash loses at most the row being written)."""
    line = json.dumps(row, ensure_ascii=False) + "\n"
    with open(file, "a", encoding="utf-8") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


# ---------------------------------------------------------------------------------------------- generating


def generate_data(
    model: Any,
    tokenizer: Any,
    target_name: str,
    prompts: Sequence[Conversation],
    out_path: str,
    *,
    drafter: str = "pld",
    drafter_options: Any = None,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    draft_max: Optional[int] = None,
    raw: bool = False,
    system: Optional[str] = None,
    on_progress: Optional[Callable[[GenerateProgress], None]] = None,
    batch_size: int = 1,
    keep_features: bool = False,
) -> GenerateSummary:
    """Answer the first turn of every prompt not yet in `out_path` and append one row per answer: one by one
    through the speculative engine (`batch_size` 1, greedy or sampled), or greedily `batch_size` prompts per
    forward (batched.py), then with `keep_features` each answer's features kept beside the file."""
    from dataclasses import replace

    from ..decoding.engine import Engine, GenerationConfig

    if not prompts:
        raise SpecdecError("no prompts to answer")
    if batch_size < 1:
        raise SpecdecError(f"batch_prompts must be >= 1, got {batch_size}", setting="batch_prompts")
    if batch_size > 1 and temperature > 0:
        raise SpecdecError("batched answers are greedy: use --batch-prompts 1 to sample with --temperature",
                           setting="batch_prompts")
    info = target_info(model, tokenizer)
    rows = _RowWriter(out_path, tokenizer, target_name, info.fingerprint, prompts, raw, system, on_progress,
                      temperature)
    if batch_size > 1:
        kept = AnswerFeatures(answers_folder(out_path), *computed_by(model)) if keep_features and rows.todo else None

        def write(answer: Any) -> None:
            if kept is not None and answer.features is not None:
                kept.add([*rows.prompt_ids[answer.index], *answer.tokens], answer.features)
            rows.write(answer.index, answer.tokens, answer.finish_reason)

        if rows.todo:
            greedy_batches(model, rows.prompt_ids, max_new_tokens=max_new_tokens, eos_token_ids=info.eos_token_ids,
                           batch_size=batch_size, on_answer=write, keep_features=kept is not None)
        return rows.summary()
    drafter_object = make_drafter(drafter, drafter_options or DrafterOptions(), info, draft_max)
    engine = Engine(model, tokenizer)
    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                              draft_max=draft_max, eos_token_ids=info.eos_token_ids)
    config.check()
    for index, prompt_ids in enumerate(rows.prompt_ids):
        if temperature > 0:
            config = replace(config, seed=seed + len(rows.existing) + index + 1)
        drafter_object.reset()
        generation = engine.generate(prompt_ids, drafter_object, config)
        rows.write(index, generation.tokens, generation.finish_reason, generation.stats)
    return rows.summary()


def generate_data_vllm(
    model_dir: str,
    tokenizer: Any,
    target_name: str,
    prompts: Sequence[Conversation],
    out_path: str,
    *,
    eos_token_ids: Sequence[int],
    max_new_tokens: int = 256,
    dtype: str = "auto",
    concurrency: int = 64,
    raw: bool = False,
    system: Optional[str] = None,
    on_progress: Optional[Callable[[GenerateProgress], None]] = None,
) -> GenerateSummary:
    """generate_data through vLLM (vllm_runner.py: a child process, continuous batching with `concurrency` requests
    in flight, greedy): a row for each answer as it finishes, so an interrupted run keeps what it wrote."""
    if not prompts:
        raise SpecdecError("no prompts to answer")
    if concurrency < 1:
        raise SpecdecError(f"batch_prompts must be >= 1, got {concurrency}", setting="batch_prompts")
    rows = _RowWriter(out_path, tokenizer, target_name, tokenizer_fingerprint(tokenizer), prompts, raw, system,
                      on_progress, 0.0)
    if rows.todo:
        vllm_runner.run_vllm(VllmSettings(LoadSettings(model_dir, dtype=dtype)),
                 [VllmPhase("answers", rows.prompt_ids, max_new_tokens, eos_token_ids, concurrency)],
                 on_answer=lambda answer: rows.write(answer.index, answer.tokens, answer.finish_reason))
    return rows.summary()


def _prompt_ids(tokenizer: Any, prompt: Conversation, raw: bool, system: Optional[str]) -> list[int]:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt.first_turn})
    return format_prompt(tokenizer, messages, raw)


class _RowWriter:
    """The prompts of `prompts` not yet answered in the file (`todo`, with their token ids), and a row appended for
    each answer as it comes, with progress reported."""

    def __init__(self, out_path: str, tokenizer: Any, target_name: str, fingerprint: str,
                 prompts: Sequence[Conversation], raw: bool, system: Optional[str],
                 on_progress: Optional[Callable[[GenerateProgress], None]], temperature: float):
        self.warnings: list[str] = []
        self.file = check_data_output(out_path, fingerprint, target_name)  # before anything is changed
        self.lock = lock_output(self.file)  # held while this writer lives: two runs would answer every prompt twice
        repair_tail(self.file)
        self.existing = read_rows(str(self.file), fingerprint, target_name, allow_empty=True, warnings=self.warnings)
        answered = {str(row.get("prompt")) for row in self.existing}
        self.prompts = prompts
        self.todo = [prompt for prompt in prompts if prompt.first_turn not in answered]
        self.prompt_ids = [_prompt_ids(tokenizer, prompt, raw, system) for prompt in self.todo]
        self.tokenizer, self.target_name, self.fingerprint = tokenizer, target_name, fingerprint
        self.on_progress, self.temperature = on_progress, temperature
        self.started = time.perf_counter()
        self.written = self.new_tokens = self.steps = 0
        self.committed = 0.0  # tokens committed by the speculative steps so far

    @property
    def mean_accepted_tokens(self) -> float:
        return self.committed / self.steps if self.steps else 1.0

    def write(self, index: int, tokens: Sequence[int], finish_reason: str, stats: Any = None) -> None:
        """Append the answer to todo[index]; `stats` are a speculative generation's (tokens per step)."""
        prompt = self.todo[index]
        answer = self.tokenizer.decode(list(tokens), skip_special_tokens=True)
        row = DataRow(prompt.first_turn, prompt.source_category, prompt.id, answer, [int(t) for t in tokens],
                      [int(t) for t in self.prompt_ids[index]], finish_reason, self.target_name, self.fingerprint,
                      float(self.temperature))
        append_row(self.file, row)
        self.written += 1
        self.new_tokens += len(tokens)
        if stats is not None:
            self.steps += stats.steps
            self.committed += stats.mean_accepted_tokens * stats.steps
        if self.on_progress is not None:
            self.on_progress(GenerateProgress(self.written, len(self.todo), self.new_tokens,
                                              time.perf_counter() - self.started, self.mean_accepted_tokens, row))

    def summary(self) -> GenerateSummary:
        return GenerateSummary(str(self.file), len(self.todo), len(self.prompts) - len(self.todo),
                               len(self.existing) + len(self.todo), self.new_tokens, time.perf_counter() - self.started,
                               self.mean_accepted_tokens, self.warnings)
