"""How an answer leaves the command line: streamed plain text, the `--json` object, the one-line statistics,
and the plain-versus-speculative comparison of `--compare`. Shared by the one-shot command and the REPL."""

from __future__ import annotations

import sys

from ..texts.text_stream import TextStream


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


class PrintedAnswer:
    """Prints the answer to stdout as tokens are committed: the text texts/text_stream.py says may be shown (held
    back at a split character and where a stop string may be forming), the same rule `specdec serve` streams by."""

    def __init__(self, tokenizer, stops=()):
        self.stream = TextStream(tokenizer, stops)

    def on_event(self, event) -> None:
        self._write(self.stream.add(event.committed))

    def finish(self, answer: str) -> None:
        self._write(self.stream.finish(answer) + "\n")

    @staticmethod
    def _write(text: str) -> None:
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()


def compare_lines(comparison, drafter: str) -> list[str]:
    """Plain and speculative runs of one prompt, side by side, and whether their outputs are identical."""
    lines = []
    for label, generation in (("plain decoding", comparison.plain), (drafter, comparison.speculative)):
        stats = generation.stats
        line = (f"{label:>16}: {stats.new_tokens} tokens in {stats.wall_seconds:.2f} s "
                f"({stats.tokens_per_second:.1f} tok/s) · {stats.mean_accepted_tokens:.2f} tokens/step")
        if stats.drafted_tokens:
            line += f" · acceptance {stats.acceptance_rate:.0%}"
        lines.append(line)
    verdict = "identical" if comparison.identical else f"DIFFERENT from token {comparison.first_divergence}"
    lines.append(f"{'':>16}  speedup {comparison.speedup:.2f}x · outputs {verdict}")
    return lines


def compare_json(comparison, drafter: str) -> dict:
    def run(generation) -> dict:
        return {"output_token_ids": generation.tokens, "finish_reason": generation.finish_reason,
                "stats": generation.stats.as_json()}

    return {"drafter": drafter, "plain": run(comparison.plain), "speculative": run(comparison.speculative),
            "identical": comparison.identical, "first_divergence": comparison.first_divergence,
            "speedup": comparison.speedup}
