"""`specdec distill`: make a draft model for a target (generate -> train -> evaluate), or one stage of it.

`specdec distill` alone runs the whole pipeline with defaults sized for the default model on a 2-core CPU;
`distill generate`, `distill train` and `distill evaluate` run one stage each. Thin layer: flags in, the kind
of draft picked once (`--kind`, or the draft directory's files), its stages run (distill_stages.py: library
calls with Rich progress on stderr), a results table and usage hints out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from ..decoding.generation_config import GenerationConfig
from ..defaults import DEFAULT_MAX_NEW_TOKENS
from ..distill.eagle3_train import DEFAULT_DRAFT_VOCAB as EAGLE3_DRAFT_VOCAB
from ..distill.eagle_train import DEFAULT_HEAD_VOCAB, EagleTrainConfig
from ..distill.generate import check_data_output
from ..distill.pipeline import pipeline_files, target_of_data, target_spec, usable_target
from ..distill.self_prompts import SELF_PROMPT_TOKENS
from ..distill.student import DEFAULT_DRAFT_VOCAB  # light: torch is imported inside its functions
from ..distill.train import TrainConfig
from ..drafters import DrafterOptions
from ..errors import SpecdecError
from ..session.run_settings import DrafterSettings
from ..target_model.load import models
from ..target_model.load.load_settings import LoadSettings
from ..texts.data_rows import read_rows
from ..texts.fingerprint import tokenizer_fingerprint
from ..texts.prompts import load_prompts
from . import app, options
from .common import apply_kv_cache, load_target
from .distill_results import show_evaluation, show_usage
from .distill_stages import (
    EVAL_PROMPTS,
    STUDENT_DRAFT_MAX,
    Answering,
    HeadStages,
    HeldOut,
    OwnPrompts,
    StudentStages,
    run_generate,
    run_generate_vllm,
    run_pipeline,
    run_self_prompts,
    stages_for_draft,
    stages_of,
)

distill_app = typer.Typer(
    name="distill",
    help="Make a draft model that imitates the target (sequence-level knowledge distillation).",
    invoke_without_command=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(distill_app, name="distill")

# Pipeline defaults (with each kind's number of prompts, distill_stages.py): SmolLM2-135M on 2 CPU cores in well
# under 30 minutes; docs/distill.md has the numbers.
PIPELINE_MAX_NEW_TOKENS = 160
EVAL_MAX_NEW_TOKENS = 96


# ---------------------------------------------------------------------------------------------- commands


def check_kv_cache(kv_cache: Optional[str], engine: str) -> None:
    """--kv-cache of the answering commands: the native decoder's, so not with --engine vllm (vLLM keeps its own)."""
    if kv_cache is not None and engine == "vllm":
        raise SpecdecError("--kv-cache: only --engine specdec uses it (vLLM keeps its own cache)", setting="kv_cache")
    apply_kv_cache(kv_cache)


def check_batch_prompts(batch_prompts: Optional[int], temperature: float) -> Optional[int]:
    """Before the model loads: the prompts answered per forward (a batch is answered greedily); None = chosen by
    the target's weights once it is loaded (distill_stages.run_generate)."""
    if batch_prompts is None:
        return 1 if temperature > 0 else None
    if batch_prompts < 1:
        raise SpecdecError(f"batch_prompts must be >= 1, got {batch_prompts}", setting="batch_prompts")
    if batch_prompts > 1 and temperature > 0:
        raise SpecdecError("batched answers are greedy: use --batch-prompts 1 to sample with --temperature",
                           setting="batch_prompts")
    return batch_prompts


ANSWERING_DRAFTER_FLAGS = ("drafter", "draft_max", "index", "draft_model")  # what answering one by one drafts with


def check_answering_drafter(ctx: typer.Context, batch_prompts: Optional[int], engine: str) -> Optional[int]:
    """Before the model loads: a drafter flag given (`--drafter`, `--draft-max`, `--index`, `--draft-model`) is
    used, never ignored. Only answering one by one drafts, so such a flag answers one by one where the number of
    prompts per forward was left to the weights, and is refused beside `--batch-prompts N` > 1 or `--engine vllm`."""
    def given_by_user(name: str) -> bool:  # by name: Typer may bundle its own copy of Click
        source = ctx.get_parameter_source(name)
        return source is not None and getattr(source, "name", "") not in ("DEFAULT", "DEFAULT_MAP")

    given = [f"--{name.replace('_', '-')}" for name in ANSWERING_DRAFTER_FLAGS if name in ctx.params
             and given_by_user(name)]
    if not given:
        return batch_prompts
    flags = " and ".join(given)
    if engine == "vllm":
        raise SpecdecError(f"{flags}: vLLM answers without specdec's drafters; drop {flags} or use --engine specdec")
    if batch_prompts is not None and batch_prompts > 1:
        raise SpecdecError(f"{flags}: --batch-prompts {batch_prompts} answers in batches, without a drafter; use "
                           f"--batch-prompts 1 to draft, or drop {flags}")
    return 1


@distill_app.callback()
def distill(
    ctx: typer.Context,
    target: str = options.target(),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Draft directory (default: $SPECDEC_HOME/drafts/NAME)."),
    data: Optional[str] = typer.Option(None, "--data", help="Data file (default: OUTPUT.data.jsonl); resumed if it exists."),
    prompts: Optional[str] = options.prompts(role="Training prompts"),
    suite: Optional[str] = options.suite(role="Training prompt suite", note=f" (default: {StudentStages.pipeline_suite}; {HeadStages.pipeline_suite} with --kind eagle or eagle3)"),
    limit: Optional[int] = options.limit(),
    max_prompts: Optional[int] = options.max_prompts(default_note=f"{StudentStages.pipeline_prompts}; {HeadStages.pipeline_prompts} with --kind eagle or eagle3"),
    max_new_tokens: int = options.max_new_tokens(PIPELINE_MAX_NEW_TOKENS),
    drafter: str = options.drafter("pld", purpose="Answering one by one (given, it answers so; not with --batch-prompts > 1 or --engine vllm): the drafter that speeds up answering the "
                                   "training prompts: "),
    batch_prompts: Optional[int] = options.batch_prompts(),
    layers: int = options.layers(),
    epochs: Optional[float] = options.epochs(None, f" (default: {StudentStages.pipeline_epochs:g}; {HeadStages.pipeline_epochs:g} with --kind eagle or eagle3)"),
    steps: Optional[int] = options.steps(),
    lr: float = options.lr(),
    kd_weight: float = options.kd_weight(),
    kd_loss: str = options.kd_loss(),
    draft_vocab: int = options.draft_vocab(),
    eval_suite: Optional[str] = options.suite(flag="--eval-suite", role="Held-out prompt suite", note=" (default: builtin)"),
    eval_prompts: Optional[str] = options.prompts(flag="--eval-prompts", role="Held-out prompts"),
    eval_max_prompts: Optional[int] = options.max_prompts(EVAL_PROMPTS, flag="--eval-max-prompts"),
    eval_max_new_tokens: int = typer.Option(EVAL_MAX_NEW_TOKENS, "--eval-max-new-tokens", help="Longest evaluation answer, in new tokens."),
    resume: bool = options.resume(),
    seed: int = options.seed(0),
    device: str = options.device(),
    weights: str = options.weights(),
    kv_cache: Optional[str] = options.kv_cache(),
    kind: str = options.kind(),
    unroll: int = options.unroll(),
    head_mlp: int = options.head_mlp(),
    head_init: str = options.head_init(),
    prompt_loss: bool = options.prompt_loss(),
    corpus: Optional[List[str]] = options.corpus(),
    engine: str = options.answer_engine(),
    self_prompts: int = typer.Option(0, "--self-prompts", help="First have the target write this many prompts of "
                                     "its own users (as `distill prompts` does; kept in OUTPUT.prompts.jsonl, "
                                     "resumed if it exists), answered and trained on beside the others."),
    opener: Optional[List[str]] = options.openers(),
) -> None:
    """Generate data, train a draft and evaluate it (no subcommand), or run one stage (see the commands)."""
    if ctx.invoked_subcommand is not None:
        return
    check_kv_cache(kv_cache, engine)
    if prompts and suite:
        raise SpecdecError("give either --prompts or --suite, not both")
    if not 0 <= self_prompts <= MAX_SELF_PROMPTS:
        raise SpecdecError(f"--self-prompts must be in 0..{MAX_SELF_PROMPTS:,}, got {self_prompts}",
                           setting="self_prompts")
    if opener and not self_prompts:
        raise SpecdecError("--opener steers the prompts the target writes: give --self-prompts N too", setting="opener")
    if self_prompts and engine == "vllm":
        raise SpecdecError("--self-prompts: the target writes its prompts in this process; use --engine specdec",
                           setting="self_prompts")
    if epochs is None:  # each kind's own default (`--kind` is checked as parsed)
        epochs = StudentStages.pipeline_epochs if kind == "student" else HeadStages.pipeline_epochs
    config = TrainConfig(layers=layers, epochs=epochs, steps=steps, lr=lr, kd_weight=kd_weight, kd_loss=kd_loss,
                         seed=seed, holdout=0.0, draft_vocab=draft_vocab)
    head_config = EagleTrainConfig(epochs=epochs, steps=steps, lr=lr, seed=seed, unroll=unroll,
                                   head_vocab=head_vocab_for(kind, draft_vocab), head_mlp=head_mlp,
                                   head_init=head_init, prompt_loss=prompt_loss)
    stages = stages_of(kind, config, head_config, tuple(corpus or ()))
    batch_prompts = check_batch_prompts(batch_prompts, 0.0)
    options.check_engine(engine)
    batch_prompts = check_answering_drafter(ctx, batch_prompts, engine)
    config.check()  # the student's flags, whatever the kind
    stages.config.check()
    GenerationConfig(max_new_tokens=max_new_tokens, seed=seed).check()  # the answers', before anything is answered
    train_items = load_prompts(prompts, None if prompts else (suite or stages.pipeline_suite), first_turns=True, limit=limit,
                               max_prompts=stages.pipeline_prompts if max_prompts is None else max_prompts)
    out_dir, data_file = pipeline_files(target, output, data, stages.name, stages.check_output)
    own_prompts = None
    if self_prompts:
        from ..distill.self_prompts import check_openers, check_prompts_output

        own_prompts = OwnPrompts(str(out_dir.parent / f"{out_dir.name}.prompts.jsonl"), self_prompts, seed,
                                 check_openers(opener or ()))
        check_prompts_output(own_prompts.file)  # not this command's prompts: refused before the model loads
    check_student_layers(stages, target)
    # the student is built from and trained against the target in float32 (its block weights dequantised)
    loaded = load_target(LoadSettings(target, device, "float32", weights), for_engine=False)
    answering = Answering(engine, drafter, max_new_tokens, seed, batch_prompts)
    held_out = HeldOut(eval_prompts, eval_suite, eval_max_prompts, eval_max_new_tokens)
    run_pipeline(loaded, target, stages, train_items, data_file, out_dir, answering, held_out, resume=resume,
                 own_prompts=own_prompts)


@distill_app.command("generate")
def generate(
    ctx: typer.Context,
    output: str = typer.Option(..., "--output", "-o", help="Data file (JSONL) to append answers to."),
    prompts: Optional[str] = options.prompts(),
    suite: Optional[str] = options.suite(),
    target: str = options.target(),
    limit: Optional[int] = options.limit(),
    max_prompts: Optional[int] = options.max_prompts(),
    max_new_tokens: int = options.max_new_tokens(DEFAULT_MAX_NEW_TOKENS),
    temperature: float = options.temperature(),
    top_p: float = options.top_p(),
    top_k: int = options.top_k(),
    seed: int = options.seed(0, note=" for sampling"),
    drafter: str = options.drafter("pld", purpose="Answering one by one (given, it answers so; not with --batch-prompts > 1 or --engine vllm): the drafter that speeds up answering: "),
    batch_prompts: Optional[int] = options.batch_prompts(),
    draft_max: Optional[int] = options.draft_max(),
    index: Optional[str] = options.index(),
    draft_model: Optional[str] = options.draft_model(),
    system: Optional[str] = options.system(),
    raw: bool = options.raw(),
    device: str = options.device(),
    dtype: str = options.dtype(),
    weights: str = options.weights(),
    kv_cache: Optional[str] = options.kv_cache(),
    engine: str = options.answer_engine(),
) -> None:
    """Answer prompts with the target and append one row per answer (resumable)."""
    if prompts is None and suite is None:
        raise SpecdecError("give the prompts: --prompts FILE or --suite NAME")
    GenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                     seed=seed).check()
    batch_prompts = check_batch_prompts(batch_prompts, temperature)
    options.check_engine(engine, temperature)
    check_kv_cache(kv_cache, engine)
    batch_prompts = check_answering_drafter(ctx, batch_prompts, engine)  # a drafter flag is used, or refused
    DrafterSettings(drafter, DrafterOptions(index=index, draft_model=draft_model)).check()
    check_data_output(output)  # a file that is not this command's data is refused before the model loads
    items = load_prompts(prompts, suite, limit=limit, max_prompts=max_prompts, first_turns=True)
    if engine == "vllm":
        run_generate_vllm(target, target_spec(target), items, output, max_new_tokens=max_new_tokens, dtype=dtype,
                          concurrency=batch_prompts, system=system, raw=raw)
        return
    loaded = load_target(LoadSettings(target, device, dtype, weights), for_engine=False)
    run_generate(loaded, target_spec(target), items, output, drafter=drafter, draft_max=draft_max, index=index,
                 draft_model=draft_model, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                 top_k=top_k, seed=seed, system=system, raw=raw, batch_prompts=batch_prompts)


MAX_SELF_PROMPTS = 1_000_000


@distill_app.command("prompts")
def prompts_command(
    output: str = typer.Option(..., "--output", "-o", help="JSONL prompts file to write (resumed if it exists); "
                               "then `specdec distill --prompts FILE`."),
    target: str = options.target(),
    count: int = typer.Option(500, "--count", help="Prompts the file should hold."),
    max_new_tokens: int = typer.Option(SELF_PROMPT_TOKENS, "--max-new-tokens", "-n",
                                       help="Longest prompt, in tokens (a turn cut there is dropped)."),
    temperature: float = typer.Option(1.0, "--temperature", "-t", help="Sampling temperature (> 0)."),
    top_p: float = typer.Option(0.95, "--top-p", help="Nucleus sampling mass in (0, 1]."),
    seed: int = options.seed(0, note=" (the turn of attempt i is sampled with seed + i)"),
    opener: Optional[List[str]] = options.openers(),
    device: str = options.device(),
    dtype: str = options.dtype(),
    weights: str = options.weights(),
    kv_cache: Optional[str] = options.kv_cache(),
) -> None:
    """Have the target write training prompts of its own users' kind: its chat template's user turn, left to it."""
    from ..distill.self_prompts import check_openers, check_prompts_output

    apply_kv_cache(kv_cache)
    if not 1 <= count <= MAX_SELF_PROMPTS:
        raise SpecdecError(f"--count must be in 1..{MAX_SELF_PROMPTS:,}, got {count}")
    if not temperature > 0:
        raise SpecdecError(f"--temperature must be > 0 (a greedy user turn is the same every time), got {temperature}")
    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
    config.check()
    openers = check_openers(opener or ())
    check_prompts_output(output)  # a file that is not this command's prompts is refused before the model loads
    loaded = load_target(LoadSettings(target, device, dtype, weights), for_engine=False)
    run_self_prompts(loaded, target_spec(target), output, count, config, openers)


@distill_app.command("train")
def train(
    data: str = typer.Option(..., "--data", help="Data file from `specdec distill generate`."),
    output: str = typer.Option(..., "--output", "-o", help="Draft model directory to write."),
    target: Optional[str] = options.target(None, default_note="the target that wrote the data"),
    init: str = typer.Option("target", "--init", help="target (its first blocks), config (fresh), student (--student)."),
    layers: int = options.layers(),
    hidden: Optional[int] = typer.Option(None, "--hidden", help="Hidden size with --init config."),
    student: Optional[str] = typer.Option(None, "--student", help="Existing model directory to start from."),
    steps: Optional[int] = options.steps(),
    epochs: float = options.epochs(6.0),
    batch_size: int = typer.Option(4, "--batch-size", help="Sequences per micro-batch."),
    grad_accum: int = typer.Option(1, "--grad-accum", help="Micro-batches per optimizer step."),
    lr: float = options.lr(),
    warmup: Optional[int] = typer.Option(None, "--warmup", help="Warm-up steps (default: 5%)."),
    weight_decay: float = typer.Option(0.01, "--weight-decay", help="AdamW weight decay."),
    clip: float = typer.Option(1.0, "--clip", help="Gradient norm clip (0 = off)."),
    max_len: int = typer.Option(768, "--max-len", help="Longest training sequence."),
    kd_weight: float = options.kd_weight(),
    kd_loss: str = options.kd_loss(),
    kd_positions: str = typer.Option("answer", "--kd-positions", help="Divergence on answer tokens, or on all tokens."),
    freeze_embeddings: bool = typer.Option(True, "--freeze-embeddings/--train-embeddings",
                                           help="Keep the target's embeddings and head fixed (faster, less overfitting)."),
    holdout: float = typer.Option(0.1, "--holdout", help="Share of rows kept for evaluation."),
    draft_vocab: int = options.draft_vocab(),
    seed: int = options.seed(0),
    save_every: int = typer.Option(100, "--save-every", help="Checkpoint every N steps."),
    checkpoint_dir: Optional[str] = typer.Option(None, "--checkpoint-dir", help="Checkpoint directory (default: OUTPUT.checkpoint)."),
    resume: bool = options.resume(),
    device: str = options.device("cpu", note=": where the target runs (training runs on the CPU)"),
    weights: str = options.weights(),
    kv_cache: Optional[str] = options.kv_cache(),
    kind: str = options.kind(),
    unroll: int = options.unroll(),
    head_mlp: int = options.head_mlp(),
    head_init: str = options.head_init(),
    prompt_loss: bool = options.prompt_loss(),
    corpus: Optional[List[str]] = options.corpus(),
    token_weight: float = typer.Option(0.1, "--token-weight", help="eagle: weight of the token loss beside the feature regression."),
) -> None:
    """Train a draft on the target's answers; Ctrl-C saves a checkpoint (continue with --resume)."""
    apply_kv_cache(kv_cache)  # the target's forwards computing a head's features
    config = TrainConfig(init=init, layers=layers, hidden=hidden, student=student, steps=steps, epochs=epochs,
                         batch_size=batch_size, grad_accum=grad_accum, lr=lr, warmup_steps=warmup,
                         weight_decay=weight_decay, clip=clip, max_len=max_len, kd_weight=kd_weight, kd_loss=kd_loss,
                         seed=seed, save_every=save_every, holdout=holdout, draft_vocab=draft_vocab,
                         kd_positions=kd_positions, freeze_embeddings=freeze_embeddings)
    head_vocab = head_vocab_for(kind, draft_vocab)
    head_config = EagleTrainConfig(epochs=epochs, steps=steps, lr=lr, token_weight=token_weight,
                                   max_len=min(max_len, 512), head_vocab=head_vocab, holdout=holdout, seed=seed,
                                   save_every=save_every, unroll=unroll, head_mlp=head_mlp,
                                   head_init=head_init, prompt_loss=prompt_loss)
    stages = stages_of(kind, config, head_config, tuple(corpus or ()))
    stages.config.check()
    read_rows(data)  # a missing or empty file fails before the model loads
    stages.check_output(Path(output).expanduser())  # and an output that is not ours to replace
    target = target or usable_target(target_of_data(data))
    check_data_target(target, data)  # another target's data: refused before this one loads (a GGUF repacks)
    check_student_layers(stages, target)
    loaded = load_target(LoadSettings(target, device, "float32", weights), for_engine=False)
    stages.train(loaded, target_spec(target), data, output, checkpoint_dir=checkpoint_dir, resume=resume)
    if stages.shows_usage_after_training:
        show_usage(output, target_spec(target), stages)


def head_vocab_for(kind: str, draft_vocab: int) -> int:
    """A head's draft vocabulary: --draft-vocab when given, else its kind's own default."""
    if draft_vocab != DEFAULT_DRAFT_VOCAB:
        return draft_vocab
    return EAGLE3_DRAFT_VOCAB if kind == "eagle3" else DEFAULT_HEAD_VOCAB


def check_student_layers(stages: StudentStages | HeadStages, target: str) -> None:
    """Before the target loads: a student cut from the target (--init target) has at most the target's blocks, as
    its config says (a GGUF's header, a directory's config.json; a hub id is checked once loaded)."""
    config = stages.config
    if not isinstance(config, TrainConfig) or config.init != "target":
        return
    total = models.target_layers(target)
    if total is not None and config.layers > total:
        raise SpecdecError(f"layers {config.layers}: the target has only {total} blocks", setting="layers")


def check_data_target(target: str, data: str) -> None:
    """The data's tokenizer fingerprint against the target's tokenizer alone (no weights loaded, nothing repacked)."""
    read_rows(data, tokenizer_fingerprint(models.load_tokenizer(target)), target_spec(target))


@distill_app.command("evaluate")
def evaluate(
    draft_model: str = options.draft_model(required=True),
    data: Optional[str] = typer.Option(None, "--data", help="Evaluate on this data file's held-out rows [default]."),
    prompts: Optional[str] = options.prompts(role="Held-out prompts (instead of --data)"),
    suite: Optional[str] = options.suite(role="Held-out prompt suite", note=" (instead of --data)"),
    limit: Optional[int] = options.limit(),
    max_prompts: Optional[int] = options.max_prompts(),
    target: Optional[str] = options.target(None, default_note="the draft's target"),
    max_new_tokens: int = options.max_new_tokens(EVAL_MAX_NEW_TOKENS),
    draft_max: Optional[int] = options.draft_max(default_note=f"{STUDENT_DRAFT_MAX} for a student; for an EAGLE head, its tree depth, 5"),
    draft_min_prob: float = options.draft_min_prob(),
    no_baseline: bool = typer.Option(False, "--no-baseline", help="Skip the untrained initialisation."),
    raw: bool = options.raw(),
    as_json: bool = options.as_json("the evaluation"),
    device: str = options.device(),
    weights: str = options.weights(),
    kv_cache: Optional[str] = options.kv_cache(),
) -> None:
    """Top-1 agreement and mean accepted tokens of a draft (and of its initialisation) on held-out prompts."""
    apply_kv_cache(kv_cache)
    if sum(bool(value) for value in (data, prompts, suite)) > 1:
        raise SpecdecError("give one of --data, --prompts, --suite")
    directory = Path(draft_model).expanduser()
    if not directory.is_dir():
        raise SpecdecError(f"--draft-model {draft_model}: no such directory")
    from ..drafters.eagle_head import HEAD_META

    if not (directory / "config.json").is_file() and not (directory / HEAD_META).is_file():
        raise SpecdecError(f"--draft-model {draft_model}: not a draft (no config.json or {HEAD_META}; make one with "
                           "`specdec distill`)")
    if draft_max is not None and draft_max < 1:
        raise SpecdecError(f"draft_max must be >= 1, got {draft_max}", setting="draft_max")
    stages = stages_for_draft(directory)
    stages.check_held_out(data)
    target = target or usable_target(stages.recorded_target(directory))
    loaded = load_target(LoadSettings(target, device, "float32", weights), for_engine=False)
    spec = target_spec(target)
    chosen, source = stages.held_out(loaded, spec, draft_model, data, prompts, suite, limit, max_prompts, raw)
    evaluation = stages.evaluate(loaded, spec, draft_model, chosen, source, baseline=not no_baseline,
                                 max_new_tokens=max_new_tokens, draft_max=draft_max, draft_min_prob=draft_min_prob)
    if as_json:
        print(json.dumps(evaluation, ensure_ascii=False))
        return
    show_evaluation(evaluation, draft_model)
