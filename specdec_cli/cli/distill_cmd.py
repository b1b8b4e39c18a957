"""`specdec distill`: make a draft model for a target (generate -> train -> evaluate), or one stage of it.

`specdec distill` alone runs the whole pipeline with defaults sized for the default model on a 2-core CPU;
`distill generate`, `distill train` and `distill evaluate` run one stage each. Thin layer: flags in,
library calls (specdec_cli.distill) with Rich progress on stderr, a results table and usage hints out.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional

import typer

from ..defaults import DEFAULT_TARGET
from ..distill.pipeline import (
    default_output,
    evaluation_items,
    held_out_prompts,
    target_of_data,
    target_of_draft,
    target_spec,
    usable_target,
)
from ..distill.student import DEFAULT_DRAFT_VOCAB  # light: torch is imported inside its functions
from ..errors import SpecdecError
from . import app
from .common import console, doing, err_console

distill_app = typer.Typer(
    name="distill",
    help="Make a draft model that imitates the target (sequence-level knowledge distillation).",
    invoke_without_command=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(distill_app, name="distill")

# Pipeline defaults: SmolLM2-135M on 2 CPU cores in well under 30 minutes (measured 18.6 min: generate 11,
# train 2.5, evaluate 5); see README for the numbers.
PIPELINE_LIMIT = 200
# An EAGLE head learns as much from 26 answers as from 110 plus 324 k corpus tokens (README's measurements), so
# its pipeline answers fewer prompts and stays within 30 minutes on 2 cores.
EAGLE_PIPELINE_LIMIT = 80
PIPELINE_MAX_NEW_TOKENS = 160
PIPELINE_EPOCHS = 6.0
PIPELINE_EVAL_LIMIT = 18
EVAL_MAX_NEW_TOKENS = 96


# ---------------------------------------------------------------------------------------------- helpers


def _load_target(target: str, device: str = "auto", dtype: str = "auto"):
    from ..models import load_target

    status = err_console().status("Loading model…")
    with status:
        return load_target(target, device, dtype, on_status=lambda message: status.update(message))


def _progress(*fields: str):
    from rich import progress as bars

    columns = [bars.TextColumn("[bold]{task.description}"), bars.BarColumn(), bars.MofNCompleteColumn()]
    columns += [bars.TextColumn(f"{{task.fields[{name}]}}") for name in fields]
    columns += [bars.TimeElapsedColumn(), bars.TextColumn("eta"), bars.TimeRemainingColumn()]
    return bars.Progress(*columns, console=err_console(), transient=False)


def _check_data(loaded: Any, target_spec: str, data: str, allow_empty: bool) -> None:
    from ..chat import target_info
    from ..distill.generate import read_rows

    read_rows(data, target_info(loaded.model, loaded.tokenizer).fingerprint, target_spec, allow_empty=allow_empty)


# ---------------------------------------------------------------------------------------------- stages


def run_generate(loaded: Any, target_spec: str, prompts: list, data: str, *, drafter: str, draft_max: Optional[int],
                 index: Optional[str], draft_model: Optional[str], max_new_tokens: int, temperature: float,
                 top_p: float, top_k: int, seed: int, system: Optional[str], raw: bool):
    from ..distill.generate import generate_data
    from ..drafters import DrafterOptions

    _check_data(loaded, target_spec, data, allow_empty=True)  # before any progress display
    options = DrafterOptions(draft_max=draft_max, index=index, draft_model=draft_model)
    with _progress("info") as progress:
        task = progress.add_task("Generating", total=len(prompts), info="")

        def on_progress(update) -> None:
            progress.update(task, total=update.total, completed=update.done,
                            info=f"{update.new_tokens:,} tokens · {update.tokens_per_second:.1f} tok/s")

        with doing("answering prompts", f"the finished answers are kept in {data} (run again to go on)"):
            summary = generate_data(
                loaded.model, loaded.tokenizer, target_spec, prompts, data, drafter=drafter,
                drafter_options=options, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                top_k=top_k, seed=seed, draft_max=draft_max, raw=raw, system=system, on_progress=on_progress,
            )
        progress.update(task, total=max(1, summary.written), completed=max(1, summary.written))
    for warning in summary.warnings:
        err_console().print(f"[yellow]warning:[/yellow] {warning}")
    err_console().print(
        f"{summary.path}: {summary.written} new rows ({summary.new_tokens:,} tokens, {summary.tokens_per_second:.1f} tok/s), "
        f"{summary.skipped} already answered, {summary.rows} rows in all"
    )
    return summary


def run_train(loaded: Any, target_spec: str, data: str, output: str, config: Any, *, checkpoint_dir: Optional[str],
              resume: bool):
    from ..distill.train import train_draft

    _check_data(loaded, target_spec, data, allow_empty=False)  # before any progress display
    with _progress("loss", "lr", "speed") as progress:
        task = progress.add_task("Training", total=None, loss="", lr="", speed="")

        def on_progress(update) -> None:
            loss = f"loss {update.loss:.3f}" + (f" kd {update.kd:.3f}" if update.kd is not None else "")
            progress.update(task, total=update.total_steps, completed=update.step, loss=loss, lr=f"lr {update.lr:.1e}",
                            speed=f"{update.tokens_per_second:,.0f} tok/s")

        result = train_draft(loaded.model, loaded.tokenizer, target_spec, data, output, config,
                             checkpoint_dir=checkpoint_dir, resume=resume, on_progress=on_progress,
                             on_status=lambda message: progress.console.print(message))
    first = "-" if result.first_loss is None else f"{result.first_loss:.3f}"
    final = "-" if result.final_loss is None else f"{result.final_loss:.3f}"
    err_console().print(
        f"Trained {result.steps} steps in {result.seconds:.0f} s ({result.train_rows} rows, {result.held_out_rows} held out, "
        f"{result.parameters / 1e6:.1f} M parameters): loss {first} -> {final}; saved {result.output}"
    )
    return result


def run_train_eagle(loaded: Any, target_spec: str, data: str, corpus: list, output: str, config: Any, *,
                    checkpoint_dir: Optional[str] = None, resume: bool = False) -> dict:
    from ..distill.eagle_train import build_eagle_head

    _check_data(loaded, target_spec, data, allow_empty=False)
    with _progress("loss") as progress:
        task = progress.add_task("Features", total=None, loss="")

        def on_progress(update) -> None:
            description = "Target features" if update.phase == "features" else "Training"
            loss = "" if update.loss is None else f"loss {update.loss:.3f}"
            progress.update(task, description=description, total=update.total, completed=update.done, loss=loss)

        with doing("training the head", "the head was not written (--resume continues from the last checkpoint)"):
            report = build_eagle_head(loaded.model, loaded.tokenizer, target_spec, output, data, corpus, config,
                                      on_progress, checkpoint_dir=checkpoint_dir, resume=resume,
                                      on_status=lambda message: progress.console.print(message))
    before, after = report["top1_agreement_before"], report["top1_agreement_after"]
    agreement = "" if after is None else f"; held-out top-1 agreement {before:.1%} -> {after:.1%}"
    err_console().print(f"Trained an EAGLE head: {report['steps']} steps in {report['seconds']:.0f} s on "
                        f"{report['train_tokens']:,} tokens ({report['answer_tokens']:,} from answers, "
                        f"{report['corpus_tokens']:,} from corpora){agreement}; saved {output}")
    return report


@contextmanager
def _scoring_progress(total: int) -> Iterator[tuple[Callable, Callable]]:
    """A progress bar over (draft, prompt) runs; yields (on_progress, print above the bar)."""
    with _progress("info") as progress:
        task = progress.add_task("Evaluating", total=total, info="")
        done: dict = {}

        def on_progress(update) -> None:
            done[update.label] = update.done
            progress.update(task, completed=sum(done.values()),
                            info=f"{update.label}: tau {update.score.mean_accepted_tokens:.2f}, "
                                 f"agreement {update.score.agreement:.0%}")

        yield on_progress, progress.console.print


def run_evaluate_eagle(loaded: Any, target_spec: str, head_dir: str, prompts: list, source: str, *, baseline: bool,
                       max_new_tokens: int, draft_max: Optional[int]) -> dict:
    from ..distill.eagle_evaluate import EAGLE_RUNS, evaluate_head

    runs = len(EAGLE_RUNS) if baseline else len([run for run in EAGLE_RUNS if run[1]])
    with _scoring_progress(len(prompts) * runs) as (on_progress, _):
        return evaluate_head(loaded.model, loaded.tokenizer, target_spec, head_dir, prompts, baseline=baseline,
                             max_new_tokens=max_new_tokens, draft_max=draft_max, prompt_source=source,
                             on_progress=on_progress)


def run_evaluate(loaded: Any, target_spec: str, draft_dir: str, prompts: list, source: str, *, baseline: bool,
                 max_new_tokens: int, draft_max: int, draft_min_prob: float) -> dict:
    from ..distill.evaluate import evaluate_draft

    with _scoring_progress(len(prompts) * (2 if baseline else 1)) as (on_progress, say):
        return evaluate_draft(loaded.model, loaded.tokenizer, target_spec, draft_dir, prompts, baseline=baseline,
                              max_new_tokens=max_new_tokens, draft_max=draft_max, min_prob=draft_min_prob,
                              prompt_source=source, on_progress=on_progress, on_status=say)


def show_evaluation(evaluation: dict, draft_dir: str) -> None:
    from rich.table import Table

    table = Table(title=f"Draft vs target on {evaluation['prompts']} held-out prompts ({evaluation.get('source') or 'prompts'})",
                  title_justify="left")
    table.add_column("draft")
    for name in ("agreement", "1-TVD", "tau", "accepted", "by position", "tok/s"):
        table.add_column(name, justify="right")
    names = {"before": "untrained", "after": "distilled"}
    if "after_chain" in evaluation:  # an EAGLE head: trees (how it drafts) and chains
        names = {"before": "untrained, trees", "after_chain": "trained, chains", "after": "trained, trees"}
    for label, name in names.items():
        score = evaluation.get(label)
        if score:
            positions = " ".join(f"{value:.0%}" for value in (score.get("per_position_acceptance") or [])[:5])
            table.add_row(name, f"{score['agreement']:.1%}", f"{score['sampling_acceptance']:.1%}",
                          f"{score['mean_accepted_tokens']:.2f}", f"{score['acceptance_rate']:.1%}", positions,
                          f"{score['tokens_per_second']:.1f}")
    console().print(table)
    console().print("[dim]agreement: top-1 agreement with the target along its answers; 1-TVD: expected per-token "
                    "acceptance when sampling; tau: mean tokens per target forward (plain decoding = 1); accepted: "
                    "share of drafted tokens accepted; by position: acceptance of draft positions 1-5 (tree depths)"
                    f"[/dim]\n[dim]report: {Path(draft_dir) / 'distill_report.json'}[/dim]")


def show_usage(draft_dir: str, target_spec: str, drafter: str = "model") -> None:
    target = "" if target_spec == DEFAULT_TARGET else f" --target {target_spec}"
    console().print("\nUse the draft:")
    console().print(f"  specdec chat{target} --drafter {drafter} --draft-model {draft_dir} --prompt \"...\"")
    others = "sam,eagle,sam+eagle" if drafter == "eagle" else "model"
    console().print(f"  specdec bench{target} --drafters none,{others} --draft-model {draft_dir}")


# ---------------------------------------------------------------------------------------------- commands


@distill_app.callback()
def distill(
    ctx: typer.Context,
    target: str = typer.Option(DEFAULT_TARGET, "--target", "-m", help="HF repo id, model directory, or .gguf file."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Draft directory (default: $SPECDEC_HOME/drafts/NAME)."),
    data: Optional[str] = typer.Option(None, "--data", help="Data file (default: OUTPUT.data.jsonl); resumed if it exists."),
    prompts: Optional[str] = typer.Option(None, "--prompts", help="Training prompts file (Spec-Bench or plain JSONL, or text)."),
    suite: Optional[str] = typer.Option(None, "--suite", help="Training prompt suite: distill (default), builtin, humaneval."),
    limit: Optional[int] = typer.Option(None, "--limit", help=f"Answer at most this many training prompts [default: {PIPELINE_LIMIT}; {EAGLE_PIPELINE_LIMIT} with --kind eagle]."),
    max_new_tokens: int = typer.Option(PIPELINE_MAX_NEW_TOKENS, "--max-new-tokens", "-n", help="Longest answer in the data."),
    drafter: str = typer.Option("pld", "--drafter", "-d", help="Drafter that speeds up data generation."),
    layers: int = typer.Option(4, "--layers", help="Student blocks (the target's first N)."),
    epochs: float = typer.Option(PIPELINE_EPOCHS, "--epochs", help="Passes over the data."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Optimizer steps (overrides --epochs)."),
    lr: float = typer.Option(1e-3, "--lr", help="Peak learning rate."),
    kd_weight: float = typer.Option(0.0, "--kd-weight", help="Weight of the divergence to the target's distributions."),
    kd_loss: str = typer.Option("fkl", "--kd-loss", help="fkl, rkl or tvd."),
    draft_vocab: int = typer.Option(DEFAULT_DRAFT_VOCAB, "--draft-vocab", help="Tokens the draft's head predicts (0 = all)."),
    eval_suite: Optional[str] = typer.Option(None, "--eval-suite", help="Held-out prompt suite (default: builtin)."),
    eval_prompts: Optional[str] = typer.Option(None, "--eval-prompts", help="Held-out prompts file."),
    eval_limit: Optional[int] = typer.Option(PIPELINE_EVAL_LIMIT, "--eval-limit", help="Evaluate on at most this many prompts."),
    eval_max_new_tokens: int = typer.Option(EVAL_MAX_NEW_TOKENS, "--eval-max-new-tokens", help="Tokens per evaluation answer."),
    resume: bool = typer.Option(False, "--resume", help="Continue training from the checkpoint."),
    seed: int = typer.Option(0, "--seed", help="Random seed."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, mps."),
    kind: str = typer.Option("student", "--kind", help="student (a small model of its own) or eagle (a head on the target's features)."),
    corpus: Optional[List[str]] = typer.Option(None, "--corpus", help="eagle: also learn the target's features over this text (repeatable)."),
) -> None:
    """Generate data, train a draft and evaluate it (no subcommand), or run one stage (see the commands)."""
    if ctx.invoked_subcommand is not None:
        return
    from ..distill.generate import load_prompts
    from ..distill.train import TrainConfig

    if prompts and suite:
        raise SpecdecError("give either --prompts or --suite, not both")
    if kind not in ("student", "eagle"):
        raise SpecdecError(f"kind must be student or eagle, got {kind!r}", setting="kind")
    config = TrainConfig(layers=layers, epochs=epochs, steps=steps, lr=lr, kd_weight=kd_weight, kd_loss=kd_loss,
                         seed=seed, holdout=0.0, draft_vocab=draft_vocab)
    config.check()
    eagle_config = None
    if kind == "eagle":
        from ..distill.eagle_train import DEFAULT_HEAD_VOCAB, EagleTrainConfig

        eagle_config = EagleTrainConfig(epochs=epochs, steps=steps, lr=lr, seed=seed,
                                        head_vocab=DEFAULT_HEAD_VOCAB if draft_vocab == DEFAULT_DRAFT_VOCAB else draft_vocab)
        eagle_config.check()
    if limit is None:
        limit = EAGLE_PIPELINE_LIMIT if kind == "eagle" else PIPELINE_LIMIT
    train_items = load_prompts(prompts, None if prompts else (suite or "distill"), limit)
    loaded = _load_target(target, device, "float32")  # the student is built from and trained against float32
    spec = target_spec(target)
    out_dir = Path(output).expanduser() if output else default_output(loaded.name, kind)
    if eagle_config is not None:  # before answering prompts for minutes: the output must be ours to replace
        from ..eagle_head import check_head_output

        check_head_output(out_dir)
    else:
        from ..distill.checkpoints import check_output_dir

        check_output_dir(out_dir)
    if not output:  # the default place under $SPECDEC_HOME is ours to create
        out_dir.parent.mkdir(parents=True, exist_ok=True)
    data_file = data or str(out_dir.parent / f"{out_dir.name}.data.jsonl")
    err_console().print(f"[bold]1/3[/bold] Answering {len(train_items)} prompts with the target -> {data_file}")
    run_generate(loaded, spec, train_items, data_file, drafter=drafter, draft_max=None, index=None, draft_model=None,
                 max_new_tokens=max_new_tokens, temperature=0.0, top_p=1.0, top_k=0, seed=seed, system=None, raw=False)
    if eagle_config is not None:
        err_console().print(f"[bold]2/3[/bold] Training an EAGLE head -> {out_dir}")
        run_train_eagle(loaded, spec, data_file, list(corpus or ()), str(out_dir), eagle_config, resume=resume)
    else:
        err_console().print(f"[bold]2/3[/bold] Training a {layers}-block student -> {out_dir}")
        run_train(loaded, spec, data_file, str(out_dir), config, checkpoint_dir=None, resume=resume)
    chosen, source = evaluation_items(eval_prompts, eval_suite, eval_limit)
    from ..distill.evaluate import prompts_from_items

    err_console().print(f"[bold]3/3[/bold] Evaluating before and after training on {len(chosen)} prompts ({source})")
    held_out = prompts_from_items(loaded.tokenizer, chosen)
    if eagle_config is not None:
        evaluation = run_evaluate_eagle(loaded, spec, str(out_dir), held_out, source, baseline=True,
                                        max_new_tokens=eval_max_new_tokens, draft_max=None)
    else:
        evaluation = run_evaluate(loaded, spec, str(out_dir), held_out, source, baseline=True,
                                  max_new_tokens=eval_max_new_tokens, draft_max=6, draft_min_prob=0.0)
    show_evaluation(evaluation, str(out_dir))
    show_usage(str(out_dir), spec, "eagle" if eagle_config is not None else "model")


@distill_app.command("generate")
def generate(
    output: str = typer.Option(..., "--output", "-o", help="Data file (JSONL) to append answers to."),
    prompts: Optional[str] = typer.Option(None, "--prompts", help="Prompts: Spec-Bench or plain JSONL, or one per line."),
    suite: Optional[str] = typer.Option(None, "--suite", help="Prompt suite: distill, builtin, humaneval."),
    target: str = typer.Option(DEFAULT_TARGET, "--target", "-m", help="HF repo id, model directory, or .gguf file."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Use only the first N prompts."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", "-n", help="Longest answer."),
    temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 = greedy; > 0 samples (lossless)."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass in (0, 1]."),
    top_k: int = typer.Option(0, "--top-k", help="Keep the k best tokens (0 = off)."),
    seed: int = typer.Option(0, "--seed", help="Random seed for sampling."),
    drafter: str = typer.Option("pld", "--drafter", "-d", help="Drafter for speed: none, pld, sam, model."),
    draft_max: Optional[int] = typer.Option(None, "--draft-max", help="Longest draft per step."),
    index: Optional[str] = typer.Option(None, "--index", help="Suffix-automaton index for --drafter sam."),
    draft_model: Optional[str] = typer.Option(None, "--draft-model", help="Draft model directory for --drafter model."),
    system: Optional[str] = typer.Option(None, "--system", "-s", help="System message."),
    raw: bool = typer.Option(False, "--raw", help="Feed prompts as is, without the chat template."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, mps."),
    dtype: str = typer.Option("auto", "--dtype", help="auto, float32, bfloat16, float16."),
) -> None:
    """Answer prompts with the target and append one row per answer (resumable)."""
    from ..distill.generate import load_prompts
    from ..drafters import DrafterOptions, check_drafter, check_drafter_options
    from ..engine import GenerationConfig
    from ..errors import SpecdecError
    from ..files import check_output_file

    if prompts is None and suite is None:
        raise SpecdecError("give the prompts: --prompts FILE or --suite NAME")
    check_drafter(drafter)
    check_drafter_options(drafter, DrafterOptions(draft_max=draft_max, index=index, draft_model=draft_model))
    GenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k).check()
    check_output_file(output, "output")
    items = load_prompts(prompts, suite, limit)
    loaded = _load_target(target, device, dtype)
    run_generate(loaded, target_spec(target), items, output, drafter=drafter, draft_max=draft_max, index=index,
                 draft_model=draft_model, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                 top_k=top_k, seed=seed, system=system, raw=raw)


@distill_app.command("train")
def train(
    data: str = typer.Option(..., "--data", help="Data file from `specdec distill generate`."),
    output: str = typer.Option(..., "--output", "-o", help="Draft model directory to write."),
    target: Optional[str] = typer.Option(None, "--target", "-m", help="Target (default: the one that wrote the data)."),
    init: str = typer.Option("target", "--init", help="target (its first blocks), config (fresh), student (--student)."),
    layers: int = typer.Option(4, "--layers", help="Student blocks."),
    hidden: Optional[int] = typer.Option(None, "--hidden", help="Hidden size with --init config."),
    student: Optional[str] = typer.Option(None, "--student", help="Existing model directory to start from."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Optimizer steps (overrides --epochs)."),
    epochs: float = typer.Option(6.0, "--epochs", help="Passes over the training rows."),
    batch_size: int = typer.Option(4, "--batch-size", help="Sequences per micro-batch."),
    grad_accum: int = typer.Option(1, "--grad-accum", help="Micro-batches per optimizer step."),
    lr: float = typer.Option(1e-3, "--lr", help="Peak learning rate."),
    warmup: Optional[int] = typer.Option(None, "--warmup", help="Warm-up steps (default: 5%)."),
    weight_decay: float = typer.Option(0.01, "--weight-decay", help="AdamW weight decay."),
    clip: float = typer.Option(1.0, "--clip", help="Gradient norm clip (0 = off)."),
    max_len: int = typer.Option(768, "--max-len", help="Longest training sequence."),
    kd_weight: float = typer.Option(0.0, "--kd-weight", help="Weight of the divergence to the target's distributions."),
    kd_loss: str = typer.Option("fkl", "--kd-loss", help="fkl, rkl or tvd."),
    kd_positions: str = typer.Option("answer", "--kd-positions", help="Divergence on answer tokens, or on all tokens."),
    freeze_embeddings: bool = typer.Option(True, "--freeze-embeddings/--train-embeddings",
                                           help="Keep the target's embeddings and head fixed (faster, less overfitting)."),
    holdout: float = typer.Option(0.1, "--holdout", help="Share of rows kept for evaluation."),
    draft_vocab: int = typer.Option(DEFAULT_DRAFT_VOCAB, "--draft-vocab", help="Tokens the draft's head predicts (0 = all)."),
    seed: int = typer.Option(0, "--seed", help="Random seed."),
    save_every: int = typer.Option(100, "--save-every", help="Checkpoint every N steps."),
    checkpoint_dir: Optional[str] = typer.Option(None, "--checkpoint-dir", help="Checkpoint directory (default: OUTPUT.checkpoint)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the checkpoint."),
    device: str = typer.Option("cpu", "--device", help="Where the target runs (training runs on the CPU)."),
    kind: str = typer.Option("student", "--kind", help="student (a small model of its own) or eagle (a head on the target's features)."),
    corpus: Optional[List[str]] = typer.Option(None, "--corpus", help="eagle: also learn the target's features over this text (file, folder or JSONL; repeatable)."),
    token_weight: float = typer.Option(0.1, "--token-weight", help="eagle: weight of the token loss beside the feature regression."),
) -> None:
    """Train a draft on the target's answers; Ctrl-C saves a checkpoint (continue with --resume)."""
    from ..distill.generate import read_rows
    from ..distill.train import TrainConfig

    if kind not in ("student", "eagle"):
        raise SpecdecError(f"kind must be student or eagle, got {kind!r}", setting="kind")
    if kind == "eagle":
        from ..distill.eagle_train import DEFAULT_HEAD_VOCAB, EagleTrainConfig

        head_vocab = DEFAULT_HEAD_VOCAB if draft_vocab == DEFAULT_DRAFT_VOCAB else draft_vocab  # a head's own default
        eagle_config = EagleTrainConfig(epochs=epochs, steps=steps, lr=lr, token_weight=token_weight,
                                        max_len=min(max_len, 512), head_vocab=head_vocab, holdout=holdout, seed=seed,
                                        save_every=save_every)
        eagle_config.check()
        read_rows(data)  # a missing or empty file fails before the model loads
        target = target or usable_target(target_of_data(data))
        loaded = _load_target(target, device, "float32")
        run_train_eagle(loaded, target_spec(target), data, list(corpus or ()), output, eagle_config,
                        checkpoint_dir=checkpoint_dir, resume=resume)
        show_usage(output, target_spec(target), "eagle")
        return

    config = TrainConfig(init=init, layers=layers, hidden=hidden, student=student, steps=steps, epochs=epochs,
                         batch_size=batch_size, grad_accum=grad_accum, lr=lr, warmup_steps=warmup,
                         weight_decay=weight_decay, clip=clip, max_len=max_len, kd_weight=kd_weight, kd_loss=kd_loss,
                         seed=seed, save_every=save_every, holdout=holdout, draft_vocab=draft_vocab,
                         kd_positions=kd_positions, freeze_embeddings=freeze_embeddings)
    config.check()
    read_rows(data)  # a missing or empty file fails before the model loads
    target = target or usable_target(target_of_data(data))
    loaded = _load_target(target, device, "float32")
    run_train(loaded, target_spec(target), data, output, config, checkpoint_dir=checkpoint_dir, resume=resume)


@distill_app.command("evaluate")
def evaluate(
    draft_model: str = typer.Option(..., "--draft-model", "-D", help="Draft directory from `specdec distill train`."),
    data: Optional[str] = typer.Option(None, "--data", help="Evaluate on this data file's held-out rows [default]."),
    prompts: Optional[str] = typer.Option(None, "--prompts", help="Or on these prompts."),
    suite: Optional[str] = typer.Option(None, "--suite", help="Or on a suite: builtin, humaneval, distill."),
    limit: Optional[int] = typer.Option(None, "--limit", help="At most this many prompts."),
    target: Optional[str] = typer.Option(None, "--target", "-m", help="Target (default: the draft's)."),
    max_new_tokens: int = typer.Option(EVAL_MAX_NEW_TOKENS, "--max-new-tokens", "-n", help="Tokens per answer."),
    draft_max: Optional[int] = typer.Option(None, "--draft-max", help="Longest draft per step (a student: 6), or an EAGLE head's tree depth (5)."),
    draft_min_prob: float = typer.Option(0.0, "--draft-min-prob", help="Stop drafting below this top probability."),
    no_baseline: bool = typer.Option(False, "--no-baseline", help="Skip the untrained initialisation."),
    raw: bool = typer.Option(False, "--raw", help="Feed prompts without the chat template."),
    as_json: bool = typer.Option(False, "--json", help="Print the evaluation as JSON."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, mps."),
) -> None:
    """Top-1 agreement and mean accepted tokens of a draft (and of its initialisation) on held-out prompts."""
    from ..errors import SpecdecError

    if sum(bool(value) for value in (data, prompts, suite)) > 1:
        raise SpecdecError("give one of --data, --prompts, --suite")
    directory = Path(draft_model).expanduser()
    if not directory.is_dir():
        raise SpecdecError(f"--draft-model {draft_model}: no such directory")
    if draft_max is not None and draft_max < 1:
        raise SpecdecError(f"draft_max must be >= 1, got {draft_max}", setting="draft_max")
    from ..eagle_head import HEAD_META, read_head_meta

    is_head = (directory / HEAD_META).is_file()
    if is_head and data:  # an EAGLE head is scored on prompts (training scores its held-out pieces)
        raise SpecdecError("an EAGLE head is evaluated on --suite or --prompts (training scores its held-out "
                           "pieces)", setting="data")
    recorded = (str(read_head_meta(directory).get("target") or "") or None) if is_head else target_of_draft(draft_model)
    target = target or usable_target(recorded)
    loaded = _load_target(target, device, "float32")
    spec = target_spec(target)
    if is_head:
        from ..distill.evaluate import prompts_from_items

        items, source = evaluation_items(prompts, suite, limit or PIPELINE_EVAL_LIMIT)
        chosen = prompts_from_items(loaded.tokenizer, items, raw)
        evaluation = run_evaluate_eagle(loaded, spec, draft_model, chosen, source, baseline=not no_baseline,
                                        max_new_tokens=max_new_tokens, draft_max=draft_max)
    else:
        chosen, source = held_out_prompts(loaded, spec, draft_model, data, prompts, suite, limit, raw)
        evaluation = run_evaluate(loaded, spec, draft_model, chosen, source, baseline=not no_baseline,
                                  max_new_tokens=max_new_tokens, draft_max=draft_max or 6,
                                  draft_min_prob=draft_min_prob)
    if as_json:
        print(json.dumps(evaluation, ensure_ascii=False))
        return
    show_evaluation(evaluation, draft_model)
