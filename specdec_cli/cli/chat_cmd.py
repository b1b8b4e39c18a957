"""`specdec chat`: one-shot generation with --prompt (text or JSON), or the interactive chat without it."""

from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer

from ..defaults import DEFAULT_AUX, DEFAULT_DRAFTER, DEFAULT_TARGET
from . import app
from .common import console, err_console


def read_prompt(prompt: str) -> str:
    from ..errors import SpecdecError

    text = sys.stdin.read() if prompt == "-" else prompt
    if not text.strip():
        raise SpecdecError("the prompt is empty")
    return text


def load_session(
    target: str,
    device: str,
    dtype: str,
    drafter: str,
    index: Optional[str],
    aux: str,
    draft_model: Optional[str],
    draft_min_prob: float,
    draft_max: Optional[int],
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    seed: Optional[int],
    system: Optional[str],
    raw: bool,
    stop: Optional[List[str]],
):
    """Validate the settings before the (slow) model load, then build a ChatSession."""
    from ..chat import ChatSession
    from ..drafters import check_drafter, DrafterOptions
    from ..engine import GenerationConfig
    from ..models import load_target

    check_drafter(drafter)
    options = DrafterOptions(draft_max=draft_max, index=index, aux=aux, draft_model=draft_model,
                             draft_min_prob=draft_min_prob)
    generation = GenerationConfig(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        draft_max=draft_max if draft_max is not None else GenerationConfig.draft_max,
        stop=tuple(stop or ()),
    )
    generation.check()
    status = err_console().status("Loading model…")
    with status:
        loaded = load_target(target, device, dtype, on_status=lambda message: status.update(message))
    return ChatSession(loaded.model, loaded.tokenizer, drafter, options, generation, system, raw), loaded


@app.command("chat")
def chat(
    prompt: Optional[str] = typer.Option(None, "--prompt", "-p", help="One-shot prompt ('-' reads stdin); omit for the interactive chat."),
    target: str = typer.Option(DEFAULT_TARGET, "--target", "-m", help="HF repo id, model directory, or .gguf file."),
    drafter: str = typer.Option(DEFAULT_DRAFTER, "--drafter", "-d", help="none, pld, sam, recycle, aded, model, or sam+AUX (e.g. sam+none)."),
    index: Optional[str] = typer.Option(None, "--index", help="Suffix-automaton index for --drafter sam."),
    aux: str = typer.Option(DEFAULT_AUX, "--aux", help="sam: drafter used when nothing matches (aded, recycle, model, pld, none)."),
    draft_model: Optional[str] = typer.Option(None, "--draft-model", help="Draft model directory for --drafter model."),
    draft_min_prob: float = typer.Option(0.0, "--draft-min-prob", help="model: stop drafting below this top probability."),
    draft_max: Optional[int] = typer.Option(None, "--draft-max", help="Longest draft per step."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", "-n", help="Stop after this many new tokens."),
    temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 = greedy (exact); > 0 = lossless sampling."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass in (0, 1]."),
    top_k: int = typer.Option(0, "--top-k", help="Keep the k best tokens (0 = off)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed for sampling."),
    system: Optional[str] = typer.Option(None, "--system", "-s", help="System message."),
    raw: bool = typer.Option(False, "--raw", help="Feed the prompt as is, without the chat template."),
    stop: Optional[List[str]] = typer.Option(None, "--stop", help="Stop string (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with the output and statistics."),
    plain: bool = typer.Option(False, "--plain", help="Stream plain text (also when stdout is not a terminal)."),
    show_rejected: bool = typer.Option(True, "--show-rejected/--hide-rejected", help="Show rejected drafts struck through."),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads for torch (default: torch's choice)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, mps."),
    dtype: str = typer.Option("auto", "--dtype", help="auto, float32, bfloat16, float16."),
) -> None:
    """Speculative chat: one-shot with --prompt, interactive otherwise."""
    if threads is not None:
        from ..models import set_threads

        set_threads(threads)
    text = read_prompt(prompt) if prompt is not None else None
    session, loaded = load_session(target, device, dtype, drafter, index, aux, draft_model, draft_min_prob, draft_max,
                                   max_new_tokens, temperature, top_p, top_k, seed, system, raw, stop)
    plain = plain or not sys.stdout.isatty()
    if text is None:
        from .repl import Repl

        repl = Repl(session, console(), err_console(), plain, show_rejected, settings_lines(session, loaded))
        raise typer.Exit(repl.run())
    if as_json:
        turn = session.ask(text)
        print(json.dumps(turn_json(turn), ensure_ascii=False))
        return
    if plain:
        stream = TextStream(session.tokenizer, session.generation.stop)
        turn = session.ask(text, on_event=stream.on_event)
        stream.finish(turn.answer)
    else:
        from .render import LiveTranscript, TranscriptView, text_decoder

        view = TranscriptView(text_decoder(session.tokenizer), session.drafter_name, show_rejected)
        with LiveTranscript(console(), view) as live:
            turn = session.ask(text, on_event=live.on_event)
    err_console().print(stats_line(turn))


def settings_lines(session, loaded) -> list[str]:
    """What the chat runs with, printed once at start."""
    generation = session.generation
    options = session.drafter_options
    drafter = session.drafter_name
    if drafter == "sam":
        if options.index:
            from ..sam.index import read_index_info

            tokens = read_index_info(options.index).get("tokens", "?")
            drafter += f" (index {options.index}: {tokens:,} tokens, l_bias {options.l_bias})"
        else:
            drafter += " (conversation only)"
        if options.aux != "none":
            drafter += f" + {options.aux} when " + (
                "nothing matches" if options.l_threshold <= 1 else f"the match is shorter than {options.l_threshold}")
    if drafter == "model":
        drafter += f" ({options.draft_model})"
    sampling = "greedy" if generation.greedy else (
        f"temperature {generation.temperature}, top_p {generation.top_p}, top_k {generation.top_k}, seed {generation.seed}")
    dtype = str(loaded.dtype).replace("torch.", "")
    return [
        f"[bold]specdec chat[/bold] · model {loaded.name} · {loaded.device} · {dtype}",
        f"drafter {drafter} · draft_max {generation.draft_max} · {sampling} · max_new_tokens {generation.max_new_tokens}",
    ]


def turn_json(turn) -> dict:
    stats = turn.generation.stats
    keys = ("new_tokens", "steps", "mean_accepted_tokens", "drafted_tokens", "accepted_tokens", "acceptance_rate",
            "per_position_acceptance", "tokens_per_second", "wall_seconds", "ttft_seconds")
    body = {key: getattr(stats, key) for key in keys}
    body.update(draft_seconds=stats.draft_seconds, verify_seconds=stats.verify_seconds, sources=stats.sources)
    return {
        "output": turn.answer,
        "output_token_ids": turn.generation.tokens,
        "prompt_tokens": turn.prompt_tokens,
        "drafter": turn.drafter,
        "finish_reason": turn.generation.finish_reason,
        "stats": body,
    }


def stats_line(turn) -> str:
    stats = turn.generation.stats
    return (
        f"[dim]{stats.new_tokens} tokens in {stats.wall_seconds:.2f} s ({stats.tokens_per_second:.1f} tok/s) · "
        f"{stats.steps} steps · {stats.mean_accepted_tokens:.2f} tokens/step · "
        f"acceptance {stats.acceptance_rate:.0%} · drafter {turn.drafter}[/dim]"
    )


class TextStream:
    """Prints the answer to stdout as tokens are committed (plain text, held back at partial characters)."""

    def __init__(self, tokenizer, stops=()):
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.printed = 0
        self.holdback = max((len(stop) for stop in stops), default=1) - 1  # a stop string may be forming

    def on_event(self, event) -> None:
        self.tokens.extend(event.committed)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd") or event.finished:  # incomplete character, or finish() prints the end
            return
        self._write(text[: len(text) - self.holdback])

    def finish(self, answer: str) -> None:
        if len(answer) < self.printed:  # a stop string arrived after part of it was printed
            answer = answer[: self.printed]
        self._write(answer)
        sys.stdout.write("\n")
        sys.stdout.flush()

    def _write(self, text: str) -> None:
        if len(text) > self.printed:
            sys.stdout.write(text[self.printed :])
            sys.stdout.flush()
            self.printed = len(text)
