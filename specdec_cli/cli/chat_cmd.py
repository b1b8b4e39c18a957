"""`specdec chat`: one-shot generation with --prompt (text or JSON), or the interactive chat without it."""

from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer

from ..defaults import DEFAULT_DRAFTER, DEFAULT_MAX_NEW_TOKENS
from ..errors import SpecdecError
from ..session.run_settings import run_settings
from . import app, options
from .common import apply_kv_cache, apply_threads, cache_kept_since, console, doing, err_console, say_loaded
from .output import PrintedAnswer, compare_json, compare_lines, stats_line, turn_json
from .render import LiveTranscript, TranscriptView, text_decoder
from .repl import Repl


def read_prompt(prompt: str) -> str:
    if prompt == "-":
        data = sys.stdin.buffer.read()
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise SpecdecError(f"the prompt on stdin is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                               f"{exc.start})") from None
    else:
        text = prompt
    if not text.strip():
        raise SpecdecError("the prompt is empty")
    return text


def chat_settings(*, drafter: str, system: Optional[str], remember: bool, stop: Optional[List[str]], **values):
    """The flags as a checked ChatSettings (everything checkable before the slow model load); `values` are named
    as the run settings' fields (session/run_settings.run_settings)."""
    from ..session.chat import ChatSettings

    settings = ChatSettings(run_settings(drafter, stop=tuple(stop or ()), **values), system=system, remember=remember)
    settings.check()
    return settings


def load_session(settings):
    """Load the model under a spinner and start the session."""
    from ..session.chat import open_session

    status = err_console().status("Loading model…")
    with status, doing("loading the model", cache_kept_since()):
        session, loaded = open_session(settings, on_status=lambda message: status.update(message))
    say_loaded(loaded)
    return session, loaded


# the penalties as llama.cpp names them, their GenerationConfig fields and values that turn them off
PENALTY_FLAGS = (("repeat_penalty", "repetition_penalty", 1.0), ("presence_penalty", "presence_penalty", 0.0),
                 ("frequency_penalty", "frequency_penalty", 0.0))


@app.command("chat")
def chat(
    prompt: Optional[str] = typer.Option(None, "--prompt", "-p", help="One-shot prompt ('-' reads stdin); omit for the interactive chat."),
    target: str = options.target(),
    drafter: str = options.drafter(DEFAULT_DRAFTER),
    index: Optional[str] = options.index(),
    aux: str = options.aux(),
    draft_model: Optional[str] = options.draft_model(),
    draft_min_prob: float = options.draft_min_prob(),
    draft_max: Optional[int] = options.draft_max(),
    max_new_tokens: int = options.max_new_tokens(DEFAULT_MAX_NEW_TOKENS),
    temperature: float = options.temperature(),
    top_p: float = options.top_p(),
    top_k: int = options.top_k(),
    min_p: float = options.min_p(),
    repeat_penalty: float = options.repeat_penalty(),
    repeat_last_n: int = options.repeat_last_n(),
    presence_penalty: float = options.penalty("--presence-penalty", "once"),
    frequency_penalty: float = options.penalty("--frequency-penalty", "once per occurrence"),
    seed: Optional[int] = options.seed(note=" for sampling"),
    system: Optional[str] = options.system(),
    raw: bool = options.raw(),
    stop: Optional[List[str]] = typer.Option(None, "--stop", help="Stop string (repeatable)."),
    as_json: bool = options.as_json("the output and its statistics (one object)"),
    plain: bool = typer.Option(False, "--plain", help="Stream plain text (also when stdout is not a terminal)."),
    show_rejected: bool = typer.Option(True, "--show-rejected/--hide-rejected", help="Show rejected drafts struck through."),
    compare: bool = typer.Option(False, "--compare", help="Answer --prompt plainly too, and show both speeds and whether the outputs are identical."),
    threads: Optional[int] = options.threads(),
    device: str = options.device(),
    decoder: str = options.decoder(),
    dtype: str = options.dtype(),
    weights: str = options.weights(),
    kv_cache: Optional[str] = options.kv_cache(),
    memory: bool = typer.Option(True, "--memory/--no-memory", help="Remember this run's answers and let sam draft from every answer remembered for this model (SPECDEC_NO_MEMORY=1 turns it off; --compare never uses it)."),
    exact: Optional[bool] = options.exact(),
) -> None:
    """Speculative chat: one-shot with --prompt, interactive otherwise."""
    if threads is not None:
        apply_threads(threads)
    apply_kv_cache(kv_cache)
    text = read_prompt(prompt) if prompt is not None else None
    settings = chat_settings(target=target, device=device, decoder=decoder, dtype=dtype, weights=weights, drafter=drafter, index=index,
                             aux=aux, draft_model=draft_model, draft_min_prob=draft_min_prob, draft_max=draft_max,
                             max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                             min_p=min_p, repetition_penalty=repeat_penalty, penalty_last_n=repeat_last_n,
                             presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                             seed=seed, system=system, raw=raw, stop=stop, exact=exact,
                             remember=memory and not compare)  # a measurement neither reads nor feeds the memory
    if compare and text is None:
        raise SpecdecError("--compare needs a one-shot --prompt")
    if compare and not settings.run.generation.greedy:
        raise SpecdecError("--compare needs greedy decoding (--temperature 0): sampled answers differ by design")
    session, loaded = load_session(settings)
    plain = plain or not sys.stdout.isatty()
    if text is None:
        from ..heap import settle_heap

        settle_heap()  # a conversation runs on: what loading left alive, out of the collections that would pause it
        repl = Repl(session, console(), err_console(), plain, show_rejected, settings_lines(session, loaded))
        raise typer.Exit(repl.run())
    if compare:
        with doing("comparing with plain decoding"):
            _compare(session, text, as_json, plain, show_rejected, loaded)
        return
    if as_json:
        with doing("answering", "no JSON was printed"):
            turn = session.ask(text)
        print(json.dumps({**turn_json(turn), "load": loaded.load_line}, ensure_ascii=False))
        return
    with doing("answering", "the answer so far is printed above"):
        turn = _answer(session, text, plain, show_rejected)
    err_console().print(stats_line(turn))


def _answer(session, text: str, plain: bool, show_rejected: bool):
    if plain:
        stream = PrintedAnswer(session.tokenizer, session.generation.stop)
        turn = session.ask(text, on_event=stream.on_event)
        stream.finish(turn.answer)
    else:
        view = TranscriptView(text_decoder(session.tokenizer), session.drafter_name, show_rejected)
        with LiveTranscript(console(), view) as live:
            turn = session.ask(text, on_event=live.on_event)
    return turn


def _compare(session, text: str, as_json: bool, plain: bool, show_rejected: bool, loaded) -> None:
    """--compare: plain decoding first (untimed warm-up before it), then the drafter, shown as it runs."""
    dtype = str(loaded.dtype).replace("torch.", "")
    if as_json:
        comparison = session.compare(text)
        payload = compare_json(comparison, session.drafter_name)
        payload.update(dtype=dtype, weights=loaded.weights_reason, exact_verification=session.engine.forward.outcome.text(),
                       load=loaded.load_line)
        print(json.dumps(payload, ensure_ascii=False))
        return
    err_console().print(f"[dim]{loaded.dtype_reason or dtype} · weights {loaded.weights_reason} · exact verification: "
                        f"{session.engine.forward.outcome.text()}[/dim]", highlight=False)
    err_console().print("[dim]Answering plainly first (timed, not shown), then speculatively:[/dim]")
    if plain:
        stream = PrintedAnswer(session.tokenizer, session.generation.stop)
        comparison = session.compare(text, on_event=stream.on_event)
        stream.finish(session.decode(comparison.speculative))
    else:
        view = TranscriptView(text_decoder(session.tokenizer), session.drafter_name, show_rejected)
        with LiveTranscript(console(), view) as live:
            comparison = session.compare(text, on_event=live.on_event)
    for line in compare_lines(comparison, session.drafter_name):
        err_console().print(line, style=None if comparison.identical else "bold red", highlight=False, soft_wrap=True)
    if not comparison.identical:
        raise typer.Exit(1)


def settings_lines(session, loaded) -> list[str]:
    """What the chat runs with, printed once at start."""
    generation = session.generation
    options = session.settings.run.drafter.options
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
    penalties = [f"{name} {getattr(generation, field)}" for name, field, off in PENALTY_FLAGS
                 if getattr(generation, field) != off]
    if penalties and generation.penalty_last_n != 0:
        window = "the whole context" if generation.penalty_last_n == -1 else f"the last {generation.penalty_last_n} tokens"
        sampling += f" · {', '.join(penalties)} over {window}"
    dtype = loaded.dtype_reason or str(loaded.dtype).replace("torch.", "")
    exact = session.engine.forward.outcome.text()
    if exact == "off":
        exact = "off (a token whose top two logits tie to rounding may differ from plain decoding)"
    return [
        f"[bold]specdec chat[/bold] · model {loaded.name} · {loaded.device} · {dtype} · weights {loaded.weights_reason}",
        f"drafter {drafter} · draft_max {generation.budget} · {sampling} · max_new_tokens {generation.max_new_tokens}",
        f"exact verification: {exact}",
    ]
