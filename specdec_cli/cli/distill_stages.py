"""The stages of `specdec distill` with their displays, for the commands in distill_cmd.py.

Answering prompts is the same for every draft; training and evaluating depend on the kind of draft, so each
kind is one object with the same few methods: `StudentStages` (a small model of its own) and `HeadStages` (an
EAGLE head on the target's features). A command picks the kind once and runs the same stages for both.
Progress goes to stderr with Rich; the library calls are specdec_cli.distill's.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from ..decoding.generation_config import GenerationConfig
from ..defaults import DEFAULT_BATCH_PROMPTS, DEFAULT_BATCH_PROMPTS_BLOCKS, DEFAULT_VLLM_CONCURRENCY
from ..distill import evaluate as scoring
from ..distill.checkpoints import check_output_dir
from ..distill.eagle_evaluate import EAGLE_RUNS, evaluate_head
from ..distill.eagle_train import EagleTrainConfig, build_eagle_head
from ..distill.feature_store import check_features_beside
from ..distill.generate import generate_data, generate_data_vllm
from ..distill.pipeline import evaluation_items, held_out_prompts, target_of_draft, target_spec
from ..distill.self_prompts import ATTEMPTS_PER_PROMPT, SELF_PROMPT_TOKENS
from ..distill.train import TrainConfig, train_draft
from ..drafters import DrafterOptions, target_info
from ..errors import SpecdecError, check_choice
from ..heap import return_free_memory
from ..target_model.load.models import load_target_text
from ..texts.data_rows import read_rows
from ..texts.fingerprint import tokenizer_fingerprint
from ..vllm import runner as vllm_runner
from .common import doing, err_console, notes, progress_bars, tell
from .distill_results import show_evaluation, show_usage
from .options import DRAFT_KINDS

STUDENT_DRAFT_MAX = 6  # the chains a student is evaluated with
EVAL_PROMPTS = 18  # held-out prompts a draft is evaluated on by default, spread over their categories


def check_data(loaded: Any, target_spec: str, data: str, allow_empty: bool) -> None:
    read_rows(data, target_info(loaded.model, loaded.tokenizer).fingerprint, target_spec, allow_empty=allow_empty)


# ---------------------------------------------------------------------------------------------- answering


def run_generate(loaded: Any, target_spec: str, prompts: list, data: str, *, drafter: str, draft_max: Optional[int],
                 index: Optional[str], draft_model: Optional[str], max_new_tokens: int, temperature: float,
                 top_p: float, top_k: int, seed: int, system: Optional[str], raw: bool,
                 batch_prompts: Optional[int] = 1, keep_features: bool = False) -> Any:
    check_data(loaded, target_spec, data, allow_empty=True)  # before any progress display
    if batch_prompts is None:  # block weights: many answers a forward, each the one it is alone (plain_many.py)
        batch_prompts = DEFAULT_BATCH_PROMPTS if loaded.weights == "dense" else DEFAULT_BATCH_PROMPTS_BLOCKS
    options = DrafterOptions(index=index, draft_model=draft_model)
    with answering_progress(len(prompts), data) as on_progress:
        summary = generate_data(
            loaded.model, loaded.tokenizer, target_spec, prompts, data, drafter=drafter, drafter_options=options,
            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
            draft_max=draft_max, raw=raw, system=system, on_progress=on_progress, batch_size=batch_prompts,
            keep_features=keep_features,
        )
    return_free_memory()  # (what answering freed goes back before a pipeline's next stage stands on it)
    return report_answers(summary)


def run_generate_vllm(target: str, target_spec: str, prompts: list, data: str, *, max_new_tokens: int, dtype: str,
                      concurrency: Optional[int], system: Optional[str], raw: bool) -> Any:
    """run_generate through vLLM: the target's tokenizer here, its weights in vLLM's process only."""
    if not vllm_runner.vllm_installed():
        raise SpecdecError(vllm_runner.INSTALL_HINT)
    status = err_console().status("Loading the tokenizer…")
    with status:
        text = load_target_text(target, on_status=lambda message: status.update(message))
    read_rows(data, tokenizer_fingerprint(text.tokenizer), target_spec, allow_empty=True)  # before any progress
    with answering_progress(len(prompts), data, starting="starting vLLM") as on_progress:
        summary = generate_data_vllm(
            text.location, text.tokenizer, target_spec, prompts, data, eos_token_ids=text.eos_token_ids,
            max_new_tokens=max_new_tokens, dtype=dtype, concurrency=concurrency or DEFAULT_VLLM_CONCURRENCY, raw=raw,
            system=system, on_progress=on_progress)
    return report_answers(summary)


@contextmanager
def answering_progress(total: int, data: str, starting: str = "") -> Iterator[Callable[[Any], None]]:
    """A progress bar over the prompts being answered; Ctrl-C inside says the finished answers are kept."""
    with progress_bars("info") as progress:
        task = progress.add_task("Generating", total=total, info=starting)

        def on_progress(update: Any) -> None:
            progress.update(task, total=update.total, completed=update.done,
                            info=f"{update.new_tokens:,} tokens · {update.tokens_per_second:.1f} tok/s")

        with doing("answering prompts", f"the finished answers are kept in {data} (run again to go on)"):
            yield on_progress
        progress.update(task, completed=progress.tasks[0].total)


def report_answers(summary: Any) -> Any:
    for warning in summary.warnings:
        tell(f"[yellow]warning:[/yellow] {warning}")
    tell(f"{summary.path}: {summary.written} new rows ({summary.new_tokens:,} tokens, {summary.tokens_per_second:.1f} "
         f"tok/s), {summary.skipped} already answered, {summary.rows} rows in all")
    return summary


# ---------------------------------------------------------------------------------------------- the two kinds


@contextmanager
def scoring_progress(total: int) -> Iterator[tuple[Callable[[Any], None], Callable[..., None]]]:
    """A progress bar over (draft, prompt) runs; yields (on_progress, print above the bar)."""
    with progress_bars("info") as progress:
        task = progress.add_task("Evaluating", total=total, info="")
        done: dict = {}

        def on_progress(update: Any) -> None:
            done[update.label], tau = update.done, update.score.mean_accepted_tokens
            info = f"{update.label}: tau {tau:.2f}, agreement {update.score.agreement:.0%}"
            progress.update(task, completed=sum(done.values()), info=info)

        yield on_progress, notes(progress)


@dataclass(frozen=True)
class StudentStages:
    """A student: a small draft model of its own (`--drafter model`)."""

    config: TrainConfig = field(default_factory=TrainConfig)
    name = "student"
    drafter = "model"
    bench_methods = "model"  # what the usage hint benchmarks
    # Pipeline defaults: SmolLM2-135M on 2 CPU cores in well under 30 minutes (measured 18.6 min: generate 11,
    # train 2.5, evaluate 5); docs/distill.md has the numbers.
    pipeline_prompts = 200
    pipeline_suite = "distill"
    pipeline_epochs = 6.0
    pipeline_baseline = True  # its start (the target's first blocks) drafts already: scored before training too
    shows_usage_after_training = False
    keeps_answer_features = False  # (a student trains on tokens alone)

    @property
    def title(self) -> str:
        return f"a {self.config.layers}-block student"

    def check_output(self, directory: Path) -> None:
        check_output_dir(directory)

    def recorded_target(self, directory: Path) -> Optional[str]:
        return target_of_draft(str(directory))

    def check_held_out(self, data: Optional[str]) -> None:
        """(A student is scored on held-out data rows or on prompts.)"""

    def held_out(self, loaded: Any, target_spec: str, draft_dir: str, data: Optional[str], prompts: Optional[str],
                 suite: Optional[str], limit: Optional[int], max_prompts: Optional[int],
                 raw: bool) -> tuple[list, str]:
        """The prompts of a file or suite, else the held-out rows of the draft's data."""
        return held_out_prompts(loaded, target_spec, draft_dir, data, prompts, suite, limit, max_prompts, raw)

    def train(self, loaded: Any, target_spec: str, data: str, output: str, *, checkpoint_dir: Optional[str],
              resume: bool) -> None:
        check_data(loaded, target_spec, data, allow_empty=False)  # before any progress display
        with progress_bars("loss", "lr", "speed") as progress:
            task = progress.add_task("Training", total=None, loss="", lr="", speed="")

            def on_progress(update: Any) -> None:
                loss = f"loss {update.loss:.3f}" + (f" kd {update.kd:.3f}" if update.kd is not None else "")
                progress.update(task, total=update.total_steps, completed=update.step, loss=loss,
                                lr=f"lr {update.lr:.1e}", speed=f"{update.tokens_per_second:,.0f} tok/s")

            result = train_draft(loaded.model, loaded.tokenizer, target_spec, data, output, self.config,
                                 checkpoint_dir=checkpoint_dir, resume=resume, on_progress=on_progress,
                                 on_status=notes(progress))
        first = "-" if result.first_loss is None else f"{result.first_loss:.3f}"
        final = "-" if result.final_loss is None else f"{result.final_loss:.3f}"
        tell(
            f"Trained {result.steps} steps in {result.seconds:.0f} s ({result.train_rows} rows, "
            f"{result.held_out_rows} held out, {result.parameters / 1e6:.1f} M parameters): loss {first} -> {final}; "
            f"saved {result.output}"
        )

    def evaluate(self, loaded: Any, target_spec: str, draft_dir: str, prompts: list, source: str, *, baseline: bool,
                 max_new_tokens: int, draft_max: Optional[int], draft_min_prob: float) -> dict:
        with scoring_progress(len(prompts) * (2 if baseline else 1)) as (on_progress, say):
            return scoring.evaluate_draft(loaded.model, loaded.tokenizer, target_spec, draft_dir, prompts,
                                          baseline=baseline, max_new_tokens=max_new_tokens,
                                          draft_max=draft_max or STUDENT_DRAFT_MAX, min_prob=draft_min_prob,
                                          prompt_source=source, on_progress=on_progress, on_status=say)


@dataclass(frozen=True)
class HeadStages:
    """An EAGLE head: one block on the target's own features (`--drafter eagle`)."""

    config: EagleTrainConfig = field(default_factory=EagleTrainConfig)
    corpus: tuple[str, ...] = ()  # text the head also learns the target's features over
    name = "eagle"
    drafter = "eagle"
    bench_methods = "sam,eagle,sam+eagle"
    # Both training suites whole (1,230 prompts: `distill`'s 298 and the standard library's), two passes: 140 k answer
    # tokens on the real Qwen2.5-Coder-0.5B (the `distill` suite alone: 33 k); 34 minutes on 2 Zen 4 cores (answering
    # 9, the target's features and training 24, evaluating 1.5; the features pass, 8 of them, is gone since the
    # answering keeps them), 90 on an AVX2 Zen 3 (20 of them that pass); SmolLM2-135M 19 (docs/measurements.md).
    pipeline_prompts = 1300
    pipeline_suite = "distill,library"
    pipeline_epochs = 2.0
    pipeline_baseline = False  # its start is random (training's held-out top-1 shows ~0%): not scored again
    shows_usage_after_training = True
    # answering keeps the target's last states along its answers beside the data (distill/answer_features.py), so
    # training does not compute them again: on the 0.5B that pass took 8 minutes on a Zen 4, 20 on an AVX2 Zen 3
    keeps_answer_features = True
    title = "an EAGLE head"

    @staticmethod
    def build(*args: Any, **kwargs: Any) -> dict:
        return build_eagle_head(*args, **kwargs)

    def check_output(self, directory: Path) -> None:
        from ..drafters.eagle_head import check_head_output

        check_head_output(directory)
        check_features_beside(directory)

    def recorded_target(self, directory: Path) -> Optional[str]:
        from ..drafters.eagle_head import read_head_meta

        return str(read_head_meta(directory).get("target") or "") or None

    def check_held_out(self, data: Optional[str]) -> None:
        if data:  # an EAGLE head is scored on prompts (training scores its held-out pieces)
            raise SpecdecError("an EAGLE head is evaluated on --suite or --prompts (training scores its held-out "
                               "pieces)", setting="data")

    def held_out(self, loaded: Any, target_spec: str, draft_dir: str, data: Optional[str], prompts: Optional[str],
                 suite: Optional[str], limit: Optional[int], max_prompts: Optional[int],
                 raw: bool) -> tuple[list, str]:
        """The prompts of a file or suite (builtin by default), spread over their categories."""
        items, source = evaluation_items(prompts, suite, max_prompts or EVAL_PROMPTS, limit)
        return scoring.tokenized(loaded.tokenizer, items, raw), source

    def train(self, loaded: Any, target_spec: str, data: str, output: str, *, checkpoint_dir: Optional[str],
              resume: bool) -> None:
        check_data(loaded, target_spec, data, allow_empty=False)
        with progress_bars("loss") as progress:
            task = progress.add_task("Features", total=None, loss="")

            def on_progress(update: Any) -> None:
                description = "Target features" if update.phase == "features" else "Training"
                loss = "" if update.loss is None else f"loss {update.loss:.3f}"
                progress.update(task, description=description, total=update.total, completed=update.done, loss=loss)

            with doing("training the head", "the head was not written (--resume continues from the last checkpoint)"):
                report = self.build(loaded.model, loaded.tokenizer, target_spec, output, data, list(self.corpus),
                                    self.config, on_progress, checkpoint_dir=checkpoint_dir, resume=resume,
                                    on_status=notes(progress))
        before, after = report["top1_agreement_before"], report["top1_agreement_after"]
        agreement = "" if after is None else f"; held-out top-1 agreement {before:.1%} -> {after:.1%}"
        tell(f"Trained {self.title}: {report['steps']} steps in {report['seconds']:.0f} s on "
                            f"{report['train_tokens']:,} tokens ({report['answer_tokens']:,} from answers, "
                            f"{report['corpus_tokens']:,} from corpora){agreement}; saved {output}")

    def evaluate(self, loaded: Any, target_spec: str, draft_dir: str, prompts: list, source: str, *, baseline: bool,
                 max_new_tokens: int, draft_max: Optional[int], draft_min_prob: float) -> dict:
        """(A head drafts trees as deep as `draft_max`; `draft_min_prob` is a student's setting.)"""
        runs = len(EAGLE_RUNS) if baseline else len([run for run in EAGLE_RUNS if run[1]])
        with scoring_progress(len(prompts) * runs) as (on_progress, _):
            return evaluate_head(loaded.model, loaded.tokenizer, target_spec, draft_dir, prompts, baseline=baseline,
                                 max_new_tokens=max_new_tokens, draft_max=draft_max, prompt_source=source,
                                 on_progress=on_progress)


@dataclass(frozen=True)
class Eagle3Stages(HeadStages):
    """A head in EAGLE-3's published layout (`--drafter eagle` loads it; so do vLLM and SGLang): three of the
    target's layers in, its own read-out over a draft vocabulary."""

    name = "eagle3"
    title = "an EAGLE-3 head"
    keeps_answer_features = False  # (it reads three layers' states, which answering does not keep)

    @staticmethod
    def build(*args: Any, **kwargs: Any) -> dict:
        from ..distill.eagle3_train import build_eagle3_head

        return build_eagle3_head(*args, **kwargs)

    def check_output(self, directory: Path) -> None:
        from ..drafters.eagle3_head import check_eagle3_output

        check_eagle3_output(directory)
        check_features_beside(directory)

    def recorded_target(self, directory: Path) -> Optional[str]:
        from ..drafters.eagle3_head import REPORT, read_eagle3_config
        from ..files import read_json

        read_eagle3_config(directory)
        return str(read_json(directory / REPORT).get("target") or "") or None


def stages_for_draft(directory: Path) -> StudentStages | HeadStages:
    """The stages of the draft in `directory`: a head's, when it holds an EAGLE head's files (either layout)."""
    from ..drafters.eagle3_head import is_eagle3_dir
    from ..drafters.eagle_head import HEAD_META

    if is_eagle3_dir(directory):
        return Eagle3Stages()
    return HeadStages() if (directory / HEAD_META).is_file() else StudentStages()


def stages_of(kind: str, config: TrainConfig, head_config: EagleTrainConfig,
              corpus: tuple[str, ...]) -> StudentStages | HeadStages:
    """`--kind` (checked as parsed, and here for other callers): the stages of a student or of a head."""
    check_choice(kind, DRAFT_KINDS, "kind")
    for flag, given, kinds in (("--head-mlp", head_config.head_mlp, ("eagle",)),  # (specdec's own head's width)
                               ("--head-init", head_config.head_init != EagleTrainConfig.head_init, ("eagle",)),
                               ("--answers-only", not head_config.prompt_loss, ("eagle", "eagle3")),
                               ("--unroll", head_config.unroll != EagleTrainConfig.unroll, ("eagle", "eagle3"))):
        if given and kind not in kinds:
            raise SpecdecError(f"{flag} is a setting of --kind {' and '.join(kinds)}, not of --kind {kind}",
                               setting=flag[2:].replace("-", "_"))
    if kind == "student":
        return StudentStages(config)
    return Eagle3Stages(head_config, corpus) if kind == "eagle3" else HeadStages(head_config, corpus)


# ---------------------------------------------------------------------------------------------- the pipeline


@dataclass(frozen=True)
class Answering:
    """How the pipeline answers its training prompts: the engine (specdec's or vLLM's), the drafter that speeds
    answering one by one, the answers' length, the seed and the prompts answered per forward (None: by weights)."""

    engine: str
    drafter: str
    max_new_tokens: int
    seed: int
    batch_prompts: Optional[int]


@dataclass(frozen=True)
class OwnPrompts:
    """`distill --self-prompts`: the prompts the target writes itself before answering, where kept, their openers."""

    file: str
    count: int
    seed: int
    openers: tuple[str, ...] = ()


@dataclass(frozen=True)
class HeldOut:
    """The prompts the pipeline scores the draft on, before and after training (evaluation_items), and the
    answers' length there."""

    prompts: Optional[str]
    suite: Optional[str]
    max_prompts: Optional[int]
    max_new_tokens: int


def run_pipeline(loaded: Any, target: str, stages: StudentStages | HeadStages, prompts: list, data: str,
                 out_dir: Path, answering: Answering, held_out: HeldOut, *, resume: bool,
                 own_prompts: Optional[OwnPrompts] = None) -> None:
    """`specdec distill`'s three stages on a loaded target: answer the prompts into `data`, train the draft into
    `out_dir`, score it before and after training; then its results and how to use it. With `own_prompts`, a
    stage before them: the target writes that many prompts, answered with the others."""
    spec = target_spec(target)
    if own_prompts is not None:
        from ..texts.prompts import load_prompts

        tell(f"[bold]0/3[/bold] Writing {own_prompts.count} prompts of the target's own users -> {own_prompts.file}")
        run_self_prompts(loaded, spec, own_prompts.file, own_prompts.count,
                         GenerationConfig(max_new_tokens=SELF_PROMPT_TOKENS, temperature=1.0, top_p=0.95,
                                          seed=own_prompts.seed), own_prompts.openers)
        prompts = [*prompts, *load_prompts(own_prompts.file, None, first_turns=True)]
    tell(f"[bold]1/3[/bold] Answering {len(prompts)} prompts with the target -> {data}")
    if answering.engine == "vllm":
        run_generate_vllm(target, spec, prompts, data, max_new_tokens=answering.max_new_tokens, dtype="auto",
                          concurrency=answering.batch_prompts, system=None, raw=False)
    else:
        run_generate(loaded, spec, prompts, data, drafter=answering.drafter, draft_max=None, index=None,
                     draft_model=None, max_new_tokens=answering.max_new_tokens, temperature=0.0, top_p=1.0, top_k=0,
                     seed=answering.seed, system=None, raw=False, batch_prompts=answering.batch_prompts,
                     keep_features=stages.keeps_answer_features)
    tell(f"[bold]2/3[/bold] Training {stages.title} -> {out_dir}")
    stages.train(loaded, spec, data, str(out_dir), checkpoint_dir=None, resume=resume)
    chosen, source = evaluation_items(held_out.prompts, held_out.suite, held_out.max_prompts)
    when = "before and after training" if stages.pipeline_baseline else "trained"
    tell(f"[bold]3/3[/bold] Evaluating {when} on {len(chosen)} prompts ({source})")
    scored = scoring.tokenized(loaded.tokenizer, chosen)
    with doing("evaluating the draft", f"the trained draft is saved in {out_dir} (`specdec distill evaluate -D "
                                       f"{out_dir}` scores it)"):
        evaluation = stages.evaluate(loaded, spec, str(out_dir), scored, source, baseline=stages.pipeline_baseline,
                                     max_new_tokens=held_out.max_new_tokens, draft_max=None, draft_min_prob=0.0)
    show_evaluation(evaluation, str(out_dir))
    show_usage(str(out_dir), spec, stages)


def run_self_prompts(loaded: Any, target_spec: str, output: str, count: int, config: Any, openers: Any = ()) -> Any:
    """`distill prompts`: the target writes user turns into `output` until it holds `count`, with a progress bar."""
    from ..decoding.engine import Engine
    from ..distill.self_prompts import check_prompts_output, write_prompts

    check_prompts_output(output, tokenizer_fingerprint(loaded.tokenizer))  # before any progress display
    engine = Engine(loaded.model, loaded.tokenizer)
    with progress_bars("info") as progress:
        task = progress.add_task("Writing prompts", total=count, info="")

        def on_progress(update: Any) -> None:
            progress.update(task, completed=update.kept, info=f"{update.attempts} sampled · "
                            f"{3600 * update.attempts / max(update.seconds, 1e-9):,.0f} turns/h")

        with doing("writing prompts", f"the prompts written are kept in {output} (run again to go on)"):
            result = write_prompts(engine, loaded.tokenizer, target_spec, output, count=count, config=config,
                                   on_progress=on_progress, max_attempts=ATTEMPTS_PER_PROMPT * count, openers=openers)
    if result.kept < count:
        tell(f"[yellow]warning:[/yellow] {ATTEMPTS_PER_PROMPT * count} turns sampled and {result.kept} of {count} "
             "prompts kept: the model rarely ends a user turn within --max-new-tokens, or repeats itself")
    tell(f"{output}: {result.kept} prompts ({result.attempts} turns sampled in {result.seconds:.0f} s, "
         f"{3600 * (result.kept) / max(result.seconds, 1e-9):,.0f} kept an hour at this rate)")
    return result
