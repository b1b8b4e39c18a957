"""Running a bench: every method on every conversation, interleaved, after a warm-up; the raw `TurnRun`s.

- Methods run interleaved conversation by conversation (every method on prompt 1, then every method on
  prompt 2, ...), so drift in the machine's speed hits all of them alike. `--repeats N` repeats each
  method on each conversation N times in a row before moving on.
- Each method gets a fresh drafter per conversation; the drafter lives across the turns of that
  conversation. Turn k+1 follows the *baseline's* answer to turn k, so every method sees the same prompts.
- Drafter rows run with the engine's own defaults (chat's draft budget without --draft-max, and its
  cost-aware planning, whose acceptance memory starts fresh per conversation and whose verify-cost curve
  is known before any timing). Oracle rows switch the planning off: they verify every drafted token.

The record of one generation (`TurnRun`) and aggregation are metrics.py's; this module prints nothing (progress
goes through a callback) and imports torch and transformers inside functions only.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Callable, NamedTuple, Optional, Sequence

from ..drafters import make_drafter, target_info
from ..drafters.oracle import OracleDrafter
from ..errors import SpecdecError
from ..target_model.load.models import check_load
from ..texts.memory import Memory, prompt_hash
from ..texts.prompt_ids import format_prompt
from ..texts.prompts import Conversation, categories_of
from . import llama_server
from .environment import cost_curve_table, environment, model_dtype, model_name_of
from .hf_reference import hf_generate, synchronize
from .llama_cpp import LLAMA_CPP_PLD, LlamaCpp, unavailable
from .llama_server import ServerRows
from .methods import (
    BASELINE,
    EXTERNAL_KINDS,
    LLAMA_CPP_KIND,
    LLAMA_SERVER_KIND,
    NATIVE,
    ORACLE,
    WARMUP_MAX_NEW_TOKENS,
    Method,
)
from .metrics import TurnRun, aggregate, per_prompt_rows
from .report import BenchReport
from .settings import BenchSettings


@dataclass
class ProgressEvent:
    done: int  # units finished (a unit = one method on one conversation, warm-ups included)
    total: int
    method: str
    prompt_id: str
    category: str
    repeat: int
    phase: str  # "warmup" | "run" | "done"


ProgressCallback = Callable[[ProgressEvent], None]


class Generated(NamedTuple):
    """One generation as a row's engine reports it."""

    tokens: list[int]
    seconds: float
    ttft: Optional[float]
    finish: str
    stats: Any = None  # GenerationStats of specdec's engine rows
    drafted: Optional[int] = None  # drafted / accepted tokens as an outside engine counts them (llama-server)
    accepted: Optional[int] = None


def check_bench(settings: BenchSettings) -> Optional[str]:
    """Everything about a bench that can be checked before the model loads: the settings, the target's file (read,
    nothing loaded), a bad --llama-server and a --reference URL where nothing answers. Returns the target's GGUF
    file, which llama.cpp's rows decode (None: the target is not a GGUF)."""
    settings.check()
    source_file = check_load(settings.run.load).source  # loads nothing yet
    gguf_path = source_file.location if source_file.kind == "gguf" else None
    llama_server.plan(settings.methods, settings.llama_server, gguf_path)
    return gguf_path


def run_bench(
    model: Any,
    tokenizer: Any,
    conversations: Sequence[Conversation],
    settings: BenchSettings,
    *,
    model_name: Optional[str] = None,
    device: Optional[str] = None,
    dtype: Any = None,
    suite: str = "",
    on_progress: Optional[ProgressCallback] = None,
    gguf_path: Optional[str] = None,
) -> BenchReport:
    """Run every method on every conversation (interleaved) and aggregate; `suite` names the prompts' source,
    `gguf_path` the file the target was loaded from (llama.cpp's rows read it; without it they are skipped).
    llama-server rows start their servers before the warm-up; every server started is stopped on the way out
    (errors and Ctrl-C included)."""
    settings.check()
    if not conversations:
        raise SpecdecError("no prompts to run (check --categories and --limit)")
    started = datetime.now(timezone.utc)
    skipped = {}
    if any(method.kind == LLAMA_CPP_KIND for method in settings.methods):
        reason = unavailable(gguf_path)
        if reason is not None:  # optional rows: the bench runs without them, and says why
            skipped = {method.name: reason for method in settings.methods if method.kind == LLAMA_CPP_KIND}
            settings = replace(settings, methods=[m for m in settings.methods if m.kind != LLAMA_CPP_KIND])
    wants_servers = any(method.kind == LLAMA_SERVER_KIND for method in settings.methods)
    servers = llama_server.plan(settings.methods, settings.llama_server, gguf_path,
                                reference_threads(model) if wants_servers else 1, probe_urls=False)
    if servers.skipped:  # no binary, or not a GGUF target: the bench runs without these rows, and says why
        skipped.update(servers.skipped)
        settings = replace(settings, methods=[m for m in settings.methods if m.name not in servers.skipped])
    if not hasattr(model, "generate"):  # a GGUF loaded in place: the native decoder is its only forward
        needs = {m.name: IN_PLACE_SKIP for m in settings.methods if m.kind in ("hf", NATIVE)}
        skipped.update(needs)
        settings = replace(settings, methods=[m for m in settings.methods if m.name not in needs])
    try:
        servers.start()
        return _run(model, tokenizer, conversations, settings, servers, skipped, started, model_name=model_name,
                    device=device, dtype=dtype, suite=suite, on_progress=on_progress, gguf_path=gguf_path)
    finally:
        servers.stop()


IN_PLACE_SKIP = ("needs transformers' model of the target, and this GGUF is loaded in place (specdec's native "
                 "decoder is its only forward); `--weights dense` converts it for transformers")


def _run(model: Any, tokenizer: Any, conversations: Sequence[Conversation], settings: BenchSettings,
         servers: "ServerRows",
         skipped: dict, started: datetime, *, model_name: Optional[str], device: Optional[str], dtype: Any,
         suite: str, on_progress: Optional[ProgressCallback], gguf_path: Optional[str]) -> BenchReport:
    runner = _Runner(model, tokenizer, settings, gguf_path, servers.servers)
    own_kernels = hasattr(model, "generate")  # (a GGUF in place has no other kernels than the native decoder's)
    own_kernels &= runner.engine.forward.has_own_kernels  # (nor has the device engine)
    if runner.engine.forward.prepare(settings.run.generation.budget) is not None and own_kernels and \
            all(method.kind != NATIVE for method in settings.methods):
        # verification is row-invariant, which slows plain steps a little: also time the model's own kernels
        settings = replace(settings, methods=[*settings.methods, Method(NATIVE, NATIVE)])
        runner.settings = settings
    runner.check_drafters()
    runner.calibrate()
    curve_at_start = cost_curve_table(runner.engine)
    methods = settings.methods
    units = len(conversations) * len(methods) * settings.repeats
    total = units + (len(methods) if settings.warmup else 0)
    done = 0

    def report(method: str, conversation: Conversation, repeat: int, phase: str) -> None:
        if on_progress is not None:
            on_progress(ProgressEvent(done, total, method, conversation.id, conversation.category, repeat, phase))

    if settings.warmup:
        for method in methods:
            report(method.name, conversations[0], 0, "warmup")
            runner.warm_up(method, conversations[0])
            done += 1
    runs: list[TurnRun] = []
    for index, conversation in enumerate(conversations):
        for repeat in range(settings.repeats):
            for method in methods:
                report(method.name, conversation, repeat, "run")
                runs += runner.run_conversation(method, index, conversation, repeat)
                done += 1
    if on_progress is not None:
        last = conversations[-1]
        on_progress(ProgressEvent(done, total, methods[-1].name, last.id, last.category, settings.repeats - 1, "done"))

    categories = categories_of(conversations)
    greedy = settings.run.generation.greedy
    results = aggregate(runs, [method.name for method in methods], categories, settings.repeats, greedy,
                        llama_server_plain=servers.plain_row())
    per_prompt = per_prompt_rows(runs, [method.name for method in methods], greedy)
    env = environment(model_name or model_name_of(model), device or str(runner.device), dtype or model_dtype(model),
                      started)
    settings_json = settings.as_json()
    settings_json.update(
        tree_check=runner.engine.tree_check,  # "passed", or why trees were verified as chains
        exact_check=runner.engine.forward.outcome.text(),  # "on: ...", "off", or "failed: ..." (row-invariant)
        prompts=suite,
        categories=categories,
        conversations=len(conversations),
        turns=sum(len(conversation.turns) for conversation in conversations),
        references_skipped=skipped,
        llama_servers=servers.report(),
        llama_server_plain=servers.plain_row(),
    )
    device_memory = runner.engine.forward.memory()  # the device engine's bytes on its device (None elsewhere)
    if device_memory is not None:
        settings_json["device_memory"] = device_memory
    if settings.run.drafter.options.memory:
        settings_json["memory"] = memory_report(settings.run.drafter.options.memory, runner.info.fingerprint,
                                                [ids for turns in runner.prompt_ids.values() for ids in turns])
    batched = run_batched_rows(runner, settings.batch, runs) if settings.batch > 1 else []
    return BenchReport(env, settings_json, results, per_prompt, runs,
                       cost_curve=_curve_report(curve_at_start, cost_curve_table(runner.engine)), batched=batched)


def memory_report(directory: str, fingerprint: str, measured_prompts: Sequence[Sequence[int]]) -> dict:
    """What the memory `sam` read holds, and how many of its answers answer prompts this run measured (a
    memory built from the very prompts measured flatters the drafter)."""
    recalled = Memory(directory, fingerprint).recall()
    measured = {prompt_hash(ids) for ids in measured_prompts}
    return {"directory": directory, "answers": len(recalled.answers), "tokens": recalled.tokens,
            "answers_to_measured_prompts": sum(value in measured for value in recalled.prompt_hashes)}


def _curve_report(start: Optional[dict], end: Optional[dict]) -> Optional[dict]:
    """The curve the run began with (measured or stored) and the one its steps refined it into, in ms."""
    if start is None:
        return None
    end = end or start
    start_ms = dict(zip(start["rows"], start["ms"]))
    end_ms = dict(zip(end["rows"], end["ms"]))
    rows = sorted(set(start_ms) | set(end_ms))
    return {"origin": start["origin"], "rows": rows, "start_ms": [start_ms.get(row) for row in rows],
            "end_ms": [end_ms.get(row) for row in rows]}


class _Runner:
    """Holds the model, the engine and the per-conversation state (prompt ids, the baseline's answers)."""

    def __init__(self, model: Any, tokenizer: Any, settings: BenchSettings, gguf_path: Optional[str] = None,
                 servers: Optional[dict] = None):
        from ..decoding.engine import Engine
        from ..target_model.load.forward_choice import choose_forward

        self.gguf_path = gguf_path
        self.llama_cpp: dict[str, Any] = {}  # method name -> LlamaCpp, made on first use
        self.servers: dict[str, Any] = servers or {}  # method name -> LlamaServer, started by run_bench
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings
        self.engine = Engine(choose_forward(model, settings.run.exact, settings.run.load), tokenizer)
        self.device = self.engine.device
        self.info = target_info(model, tokenizer)
        self.prompt_ids: dict[int, list[list[int]]] = {}  # conversation -> prompt ids per turn
        self.references: dict[int, list[list[int]]] = {}  # conversation -> baseline tokens per turn (repeat 0)
        self.warmup_reference: list[int] = []  # the baseline's warm-up output, replayed by oracle warm-ups

    # -- pieces --------------------------------------------------------------------------------------------

    def check_drafters(self) -> None:
        """Build each drafter once before the run, so a bad index or draft model fails in the first second."""
        for method in self.settings.methods:
            if method.kind == "engine":
                self._drafter(method, [])

    def _drafter(self, method: Method, references: list[list[int]]):
        if method.kind == ORACLE:
            return OracleDrafter(references, method.draft_length)
        run = self.settings.run
        return make_drafter(method.drafter, run.drafter.options, self.info, run.generation.draft_max)

    def _config(self, method: Method, conversation: int, turn: int, max_new_tokens: Optional[int] = None):
        generation = self.settings.run.generation
        seed = None if generation.seed is None else generation.seed + 1000 * conversation + turn
        draft_max = method.draft_length if method.kind == ORACLE else generation.draft_max
        # Oracle rows measure the ceiling at exactly their draft length (every drafted token verified); native rows
        # run other kernels, whose steps would teach the planner nothing: neither plans by cost.
        config = replace(generation, max_new_tokens=max_new_tokens or generation.max_new_tokens, seed=seed,
                         draft_max=draft_max, eos_token_ids=self.info.eos_token_ids,
                         cost_aware=method.kind not in (ORACLE, NATIVE))
        config.check()
        return config

    def calibrate(self) -> None:
        """Whatever the engine measures once per model (its verify-cost curve) is measured now, untimed."""
        drafts = any(method.kind == "engine" and method.name != BASELINE for method in self.settings.methods)
        if drafts:
            self.engine.cost_curve()
            _ = self.engine.supports_trees  # the one-time tree self-check, kept out of the timings

    def _fresh_learning(self) -> None:
        """The engine's per-source acceptance memory starts empty for each conversation, like the drafter:
        results do not depend on the order of the prompts."""
        self.engine.forget()

    def _format(self, messages: list[dict]) -> list[int]:
        return format_prompt(self.tokenizer, messages, self.settings.run.raw)

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def _sync(self) -> None:
        synchronize(self.device)

    def _llama_cpp(self, method: Method) -> Any:
        """llama.cpp on the target's GGUF, with as many threads as specdec computes with."""
        if method.name not in self.llama_cpp:
            self.llama_cpp[method.name] = LlamaCpp(str(self.gguf_path), reference_threads(self.model),
                                                   pld=method.name == LLAMA_CPP_PLD)
        return self.llama_cpp[method.name]

    # -- one generation ------------------------------------------------------------------------------------

    def _generate(self, method: Method, prompt_ids: list[int], drafter: Any, config: Any) -> Generated:
        if method.kind == "hf":  # transformers' generate on the model's own kernels
            with self.engine.forward.own_kernels():
                return Generated(*hf_generate(self.model, self.tokenizer, prompt_ids, config,
                                              pld=method.name == "hf-pld"))
        if method.kind == LLAMA_CPP_KIND:
            return Generated(*self._llama_cpp(method).generate(prompt_ids, config))
        if method.kind == LLAMA_SERVER_KIND:  # timed by llama.cpp's own per-request timings
            turn = self.servers[method.name].generate(prompt_ids, config, self.tokenizer)
            return Generated(turn.tokens, turn.seconds, turn.ttft, turn.finish, None, turn.drafted, turn.accepted)
        self._sync()
        started = time.perf_counter()
        with self.engine.forward.own_kernels() if method.kind == NATIVE else nullcontext():
            generation = self.engine.generate(prompt_ids, drafter, config)
        self._sync()
        seconds = time.perf_counter() - started
        stats = generation.stats
        return Generated(generation.tokens, seconds, stats.ttft_seconds, generation.finish_reason, stats)

    # -- a conversation ------------------------------------------------------------------------------------

    def run_conversation(self, method: Method, index: int, conversation: Conversation, repeat: int) -> list[TurnRun]:
        """All turns of one conversation with one method. The first baseline run builds the prompts: turn k+1
        is the conversation so far with the baseline's answers, so every method sees the same prompts."""
        building = index not in self.prompt_ids
        if building and method.name != BASELINE:
            raise RuntimeError("the baseline must run first on every conversation")
        drafter = None if method.kind in EXTERNAL_KINDS else self._drafter(method, self.references.get(index, []))
        self._fresh_learning()
        runs = []
        history: list[dict] = []
        prompts: list[list[int]] = [] if building else self.prompt_ids[index]
        for turn, user_text in enumerate(conversation.turns):
            if building:
                history.append({"role": "user", "content": user_text})
                prompts.append(self._format(history))
            prompt_ids = prompts[turn]
            config = self._config(method, index, turn)
            result = self._generate(method, prompt_ids, drafter, config)
            tokens = result.tokens
            if building:
                history.append({"role": "assistant", "content": self._decode(tokens)})
                self.references.setdefault(index, []).append(list(tokens))
            runs.append(TurnRun(method.name, index, conversation.id, conversation.category, turn, repeat,
                                len(prompt_ids), list(tokens), result.seconds, result.ttft, result.finish,
                                result.stats, result.drafted, result.accepted))
        if building:
            self.prompt_ids[index] = prompts
        return runs

    def warm_up(self, method: Method, conversation: Conversation) -> None:
        """One short generation on the first turn of the first prompt; nothing is recorded."""
        prompt_ids = self._format([{"role": "user", "content": conversation.turns[0]}])
        longest = min(WARMUP_MAX_NEW_TOKENS, self.settings.run.generation.max_new_tokens)
        config = self._config(method, 0, 0, max_new_tokens=longest)
        references = [self.warmup_reference] if self.warmup_reference else []
        drafter = None if method.kind in EXTERNAL_KINDS else self._drafter(method, references)
        self._fresh_learning()
        tokens = self._generate(method, prompt_ids, drafter, config).tokens
        if method.name == BASELINE:
            self.warmup_reference = list(tokens)


def run_batched_rows(runner: "_Runner", width: int, runs: Sequence[TurnRun]) -> list[dict]:
    """`--batch N`: every engine row (plain decoding and each drafter) answers every conversation's first turn
    again, `width` at a time on the engine's batched step (decoding/batch.py: a new prompt joins as one ends):
    its total tokens over the wall time of all, beside the same row's one-at-a-time answers (`runs`, repeat 0):
    their tokens/s, and how many batched answers equal them (greedy: all)."""
    from ..decoding.batch import Batch

    indices = sorted(runner.prompt_ids)
    rows = []
    for method in runner.settings.methods:
        if method.kind != "engine":
            continue
        alone = {run.conversation: run for run in runs if run.method == method.name and run.turn == 0
                 and run.repeat == 0}
        batch, waiting, answers, open_runs = Batch(runner.engine), list(indices), {}, {}
        runner._fresh_learning()
        started = time.perf_counter()
        while waiting or len(batch):
            while waiting and len(batch) < width:
                index = waiting.pop(0)
                run = batch.add(runner.prompt_ids[index][0], runner._drafter(method, []),
                                runner._config(method, index, 0))
                open_runs[id(run)] = index
                if run.finish is not None:
                    answers[index] = batch.close(run).tokens
            for run in batch.step():
                answers[open_runs[id(run)]] = batch.close(run).tokens
        seconds = time.perf_counter() - started
        new_tokens = sum(len(tokens) for tokens in answers.values())
        alone_tokens = sum(len(alone[index].tokens) for index in indices if index in alone)
        alone_seconds = sum(alone[index].seconds for index in indices if index in alone)
        rows.append({"method": method.name, "width": width, "prompts": len(indices), "new_tokens": new_tokens,
                     "seconds": round(seconds, 6), "tokens_per_second": round(new_tokens / seconds, 3),
                     "alone_tokens_per_second": round(alone_tokens / alone_seconds, 3) if alone_seconds else None,
                     "identical": sum(index in alone and answers[index] == alone[index].tokens for index in indices),
                     "compared": sum(index in alone for index in indices)})
    return rows


def reference_threads(model: Any) -> int:
    """Threads for llama.cpp's rows: as many as specdec computes with (its kernels', or torch's for dense)."""
    from .. import kernels
    from ..target_model.native.quant import block_layers

    if block_layers(model):
        return kernels.threads()
    import torch

    return torch.get_num_threads()
