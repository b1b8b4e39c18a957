"""vLLM in a child process: greedy answers to token-id prompts, one request at a time or all at once.

`specdec bench --engine vllm` (bench/vllm_bench.py) and `specdec distill generate --engine vllm`
(distill/generate.py) run vLLM through `run_vllm`. Each call starts one child, `python -m specdec_cli.vllm.runner
JOB`, with the same interpreter: vLLM's engine starts its own processes with spawn and keeps process-wide state,
so one `LLM` (one model, one speculative method) lives in one process and is gone when it ends.

The job (a JSON file) names the model directory, the dtype, the method and its draft length, and a list of
phases; each phase is a list of prompts (token ids, so vLLM sees exactly the tokens specdec would) answered
greedily with at most `concurrency` requests in flight: a new one is submitted as soon as one finishes (vLLM's
continuous batching), so 1 is one request after another, each timed alone. The child writes one JSON line per answer
and one per finished phase (with vLLM's cumulative speculative-decoding counters) to a private copy of its
stdout; vLLM's own prints and logs go to stderr, which the parent keeps and quotes one line of on failure
(`SPECDEC_DEBUG=1` shows it all).

Methods: `none` (no speculation), vLLM's `ngram` and `suffix` (the latter needs `arctic-inference`), and
specdec's proposers (proposer.py, VLLM_DRAFTERS). `VllmSettings` holds the target's `LoadSettings` (its dtype
one of load_settings.DTYPES, checked as it is made) and the `ProposerSettings`. `dtype` "auto" is float32 on
vLLM's CPU build (where bfloat16 single and batched runs already differ from each other) and vLLM's own choice
elsewhere.

What it does not do: sampling, or anything with the answers (callers write rows or tables).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..defaults import VLLM_DRAFTERS
from ..errors import SpecdecError
from ..processes import stop_child
from ..session.run_settings import DrafterSettings
from ..target_model.load.load_settings import LoadSettings
from .proposer_settings import ProposerSettings

NO_SPECULATION = "none"
VLLM_METHODS = ("ngram", "suffix", "eagle3")  # vLLM's own drafters (eagle3: the head in --draft-model)
NGRAM_LOOKUP = (1, 3)  # vLLM's ngram: the shortest and longest suffix it looks up
CONTEXT_MARGIN = 16  # tokens of context beyond the longest prompt and answer (speculative tokens past the end)
CPU_MEMORY_FRACTION = 0.3  # vLLM's CPU build sizes its KV cache from this share of the machine's memory
INSTALL_HINT = "vLLM is not installed in this environment: run `make install-vllm`, then use `.venv-vllm/bin/specdec`"
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def method_unavailable(method: str) -> Optional[str]:
    """Why a method cannot run here (None: it can)."""
    if method == "suffix" and importlib.util.find_spec("arctic_inference") is None:
        return "vLLM's suffix decoding needs arctic-inference (pip install arctic-inference)"
    return None


@dataclass(frozen=True)
class VllmSettings:
    """One vLLM engine: the model and its dtype, how it speculates, and vLLM's own sizing knobs."""

    load: LoadSettings  # target: a model directory vLLM loads (models.model_location); dtype: vLLM's (auto: see above)
    # proposer.drafter.name: none, vLLM's ngram or suffix, or one of VLLM_DRAFTERS (specdec's proposers, whose
    # settings the rest of `proposer` holds); proposer.draft_length is num_speculative_tokens
    proposer: ProposerSettings = field(default_factory=lambda: ProposerSettings(DrafterSettings(NO_SPECULATION)))
    max_model_len: Optional[int] = None  # None: the longest prompt of the phases + its answer, and a margin
    memory_fraction: Optional[float] = None  # gpu_memory_utilization; None = 0.3 on a CPU build, vLLM's default on GPUs

    @property
    def method(self) -> str:
        return str(self.proposer.drafter.name)

    def check(self) -> None:
        if self.method not in (NO_SPECULATION, *VLLM_METHODS, *VLLM_DRAFTERS):
            raise SpecdecError(f"method {self.method}: vLLM runs none, {', '.join(VLLM_METHODS)} and specdec's "
                               f"{', '.join(VLLM_DRAFTERS)} (it verifies chains)", setting="drafter")
        self.proposer.check_lengths()
        if self.max_model_len is not None and self.max_model_len < 16:
            raise SpecdecError(f"max_model_len must be >= 16, got {self.max_model_len}", setting="max_model_len")
        if self.memory_fraction is not None and not 0 < self.memory_fraction <= 1:
            raise SpecdecError(f"memory fraction must be in (0, 1], got {self.memory_fraction}",
                               setting="memory_fraction")
        if self.method == "eagle3":
            from ..drafters.eagle3_head import is_eagle3_dir, read_eagle3_config

            head = self.proposer.drafter.options.draft_model
            if not head or not is_eagle3_dir(head):
                raise SpecdecError("method eagle3: give --draft-model DIR, a head in EAGLE-3's published layout "
                                   "(`specdec distill --kind eagle3` writes one)", setting="draft_model")
            read_eagle3_config(head)
        for setting in ("device", "weights"):
            if getattr(self.load, setting) != "auto":
                raise SpecdecError(f"{setting} {getattr(self.load, setting)}: vLLM chooses it (leave it auto)",
                                   setting=setting)

    def speculative(self) -> tuple[Optional[dict], dict[str, str]]:
        """vLLM's speculative_config for this method, and the environment entries its proposer reads."""
        draft_length = self.proposer.draft_length
        if self.method == NO_SPECULATION:
            return None, {}
        if self.method == "ngram":
            shortest, longest = NGRAM_LOOKUP
            return {"method": "ngram", "num_speculative_tokens": draft_length, "prompt_lookup_min": shortest,
                    "prompt_lookup_max": longest}, {}
        if self.method == "suffix":
            return {"method": "suffix", "num_speculative_tokens": draft_length}, {}
        if self.method == "eagle3":  # vLLM's own EAGLE-3 with the head's folder
            head = os.path.abspath(os.path.expanduser(str(self.proposer.drafter.options.draft_model)))
            return {"method": "eagle3", "model": head, "num_speculative_tokens": draft_length}, {}
        return self.proposer.speculative_config()

    def job(self, speculative: Optional[dict], max_model_len: int) -> dict:
        """What the child process builds its `LLM` from (`_run_job`)."""
        return {"model": self.load.target, "dtype": self.load.dtype, "max_model_len": max_model_len,
                "memory_fraction": self.memory_fraction, "speculative": speculative}


@dataclass(frozen=True)
class VllmPhase:
    name: str
    prompts: Sequence[Sequence[int]]  # token ids, chat template applied
    max_tokens: int
    stop_token_ids: Sequence[int]
    concurrency: int = 1  # requests in flight at once (1: one after another)


@dataclass
class VllmAnswer:
    phase: str
    index: int  # the prompt's position in its phase
    tokens: list[int]  # the stop token included where the answer ended with one
    finish_reason: str  # "eos" or "length"
    seconds: float  # from its submission to its last token (with concurrency 1: its own time)


@dataclass
class VllmPhaseResult:
    name: str
    seconds: float
    answers: list[VllmAnswer]  # in prompt order
    counters: dict[str, float]  # vLLM's speculative counters over this phase alone

    @property
    def new_tokens(self) -> int:
        return sum(len(answer.tokens) for answer in self.answers)


@dataclass
class VllmRun:
    dtype: str  # the dtype vLLM ran in
    device: str
    version: str
    phases: dict[str, VllmPhaseResult] = field(default_factory=dict)


def run_vllm(settings: VllmSettings, phases: Sequence[VllmPhase],
             on_answer: Optional[Callable[[VllmAnswer], None]] = None) -> VllmRun:
    """Run the phases in a child vLLM process; `on_answer` sees each answer as it arrives."""
    settings.check()
    if not vllm_installed():
        raise SpecdecError(INSTALL_HINT)
    reason = method_unavailable(settings.method)
    if reason is not None:
        raise SpecdecError(reason)
    speculative, env = settings.speculative()
    longest = max((len(ids) + phase.max_tokens for phase in phases for ids in phase.prompts), default=0)
    max_model_len = settings.max_model_len if settings.max_model_len is not None else longest + CONTEXT_MARGIN
    job = {**settings.job(speculative, max_model_len),
           "phases": [{**asdict(phase), "prompts": [list(map(int, ids)) for ids in phase.prompts],
                       "stop_token_ids": [int(token) for token in phase.stop_token_ids]} for phase in phases]}
    debug = bool(os.environ.get("SPECDEC_DEBUG"))
    with tempfile.TemporaryDirectory(prefix="specdec-vllm-") as folder:
        job_file = Path(folder) / "job.json"
        job_file.write_text(json.dumps(job))
        log_file = Path(folder) / "vllm.log"
        with open(log_file, "w") as log:
            child = subprocess.Popen([sys.executable, "-m", __name__, str(job_file)], stdout=subprocess.PIPE,
                                     stderr=None if debug else log, text=True,
                                     env={**os.environ, "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL",
                                                                                              "WARNING"), **env})
            try:
                run, error = _collect(child, on_answer)
                code = child.wait()
            finally:
                stop_child(child, grace_seconds=30)  # interrupted: vLLM's engine processes go with their parent
        if error or code != 0 or run is None:
            why = error or _last_error_line(log_file.read_text(errors="replace")) or f"exit status {code}"
            raise SpecdecError(f"vLLM ({settings.method}) failed: {why}")
    return run


def _collect(child: subprocess.Popen, on_answer: Optional[Callable[[VllmAnswer], None]]
             ) -> tuple[Optional[VllmRun], Optional[str]]:
    """Read the child's JSON lines into a VllmRun (counters per phase, answers in prompt order)."""
    assert child.stdout is not None
    run: Optional[VllmRun] = None
    answers: dict[str, list[VllmAnswer]] = {}
    previous: dict[str, float] = {}
    for line in child.stdout:
        event = json.loads(line)
        if "error" in event:
            return run, str(event["error"])
        if "started" in event:
            run = VllmRun(**event["started"])
        elif "answer" in event:
            answer = VllmAnswer(**event["answer"])
            answers.setdefault(answer.phase, []).append(answer)
            if on_answer is not None:
                on_answer(answer)
        elif "phase" in event and run is not None:
            name, counters = event["phase"], event["counters"]
            delta = {key: value - previous.get(key, 0.0) for key, value in counters.items()}
            previous = counters
            done = sorted(answers.pop(name, []), key=lambda answer: answer.index)
            run.phases[name] = VllmPhaseResult(name, float(event["seconds"]), done, delta)
    return run, None


def _last_error_line(log: str) -> Optional[str]:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error" in line:
            return line[-300:]
    return lines[-1][-300:] if lines else None


# ------------------------------------------------------------------------------------------------ the child


def _child(job_file: str) -> None:
    results = os.fdopen(os.dup(1), "w", buffering=1)  # the parent reads this; vLLM's own prints go to stderr
    os.dup2(2, 1)

    def emit(event: dict) -> None:
        results.write(json.dumps(event) + "\n")
        results.flush()

    try:
        _run_job(json.loads(Path(job_file).read_text()), emit)
    except Exception as exc:  # one line for the parent's message; the traceback is in the log
        import traceback

        traceback.print_exc()
        emit({"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]})
        raise SystemExit(1) from None


def _run_job(job: dict, emit: Callable[[dict], None]) -> None:
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.platforms import current_platform

    cpu = current_platform.is_cpu()
    dtype = "float32" if job["dtype"] == "auto" and cpu else job["dtype"]
    fraction = job["memory_fraction"] if job["memory_fraction"] is not None else (CPU_MEMORY_FRACTION if cpu else None)
    extra = {"gpu_memory_utilization": fraction} if fraction is not None else {}
    llm = LLM(model=job["model"], dtype=dtype, max_model_len=job["max_model_len"], enforce_eager=cpu, seed=0,
              disable_log_stats=False, speculative_config=job["speculative"], **extra)
    emit({"started": {"dtype": str(llm.llm_engine.model_config.dtype).replace("torch.", ""),
                      "device": "cpu" if cpu else str(current_platform.device_name), "version": vllm.__version__}})
    engine = llm.llm_engine
    for phase in job["phases"]:
        params = SamplingParams(temperature=0.0, max_tokens=phase["max_tokens"],
                                stop_token_ids=phase["stop_token_ids"], detokenize=False)
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in phase["prompts"]]
        started = time.perf_counter()
        waiting = list(enumerate(prompts))[::-1]  # popped from the end: prompt order
        submitted: dict[int, float] = {}  # in flight: prompt index -> when it was submitted
        while waiting or submitted:
            while waiting and len(submitted) < max(1, phase["concurrency"]):
                index, prompt = waiting.pop()
                engine.add_request(f"{phase['name']}:{index}", prompt, params)
                submitted[index] = time.perf_counter()
            for output in engine.step():
                if output.finished:
                    index = int(output.request_id.rsplit(":", 1)[1])
                    began = submitted.pop(index)
                    emit({"answer": _answer(phase["name"], index, output, time.perf_counter() - began)})
        seconds = time.perf_counter() - started
        counters = {metric.name: float(metric.value) for metric in llm.get_metrics()
                    if metric.name in SPEC_COUNTERS and hasattr(metric, "value")}
        emit({"phase": phase["name"], "seconds": seconds, "counters": counters})


def _answer(phase: str, index: int, output: Any, seconds: float) -> dict:
    completion = output.outputs[0]
    reason = "eos" if completion.finish_reason == "stop" else "length"
    return {"phase": phase, "index": index, "tokens": [int(token) for token in completion.token_ids],
            "finish_reason": reason, "seconds": seconds}


if __name__ == "__main__":
    _child(sys.argv[1])
