"""Is every drafter still at least plain decoding's speed when the host is busy? (issue 61, item 3)

`specdec bench` on a busy host answers each category's few prompts once per drafter, minutes apart: the host's
load moves between rows more than a drafter does, and a 40-token answer's time is a few hundred milliseconds of
noise. This benchmark asks the question so that the answer is the drafters', not the host's:

- every prompt is answered by every drafter in turn, `none` (plain decoding) among them, for `--rounds` passes,
  so each drafter's answers sit beside plain decoding's of the same prompt within a second or two;
- the answer's decoding time alone is counted (time to the last token less time to the first: the prefill is
  the same computation for every drafter);
- what the engine learned is forgotten before each answer (`Engine.forget`, as `specdec bench` does): every
  answer starts from the planner's priors, the case where drafting at a loss is likeliest;
- `--burners N` runs N processes spinning on the CPU for the whole run (the competing job), 0 for a quiet host.

It prints, per category and overall, each drafter's decoding tokens per second over plain decoding's and the
fewest of its per-round ratios, and checks the issue's bar (`--bar`, 0.97x). Greedy; every answer is compared
with plain decoding's (a difference is an error). The target is a GGUF on its blocks (`--target`, default the
default model), a head or draft model `--draft-model`; what it does not do: llama.cpp rows, sampling, prompts'
later turns.

    python benchmarks/bench_busy.py --categories translation,qa --limit 6 --drafters sam,recycle --burners 1
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import defaultdict

SPIN = "while True: pass"


def _burners(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]


def run(args: argparse.Namespace) -> dict:
    from specdec_cli.decoding.engine import Engine, GenerationConfig
    from specdec_cli.defaults import DEFAULT_TARGET
    from specdec_cli.drafters import DrafterOptions, make_drafter, target_info
    from specdec_cli.target_model.load.models import load_target
    from specdec_cli.target_model.placement import set_threads
    from specdec_cli.texts.prompt_ids import format_prompt
    from specdec_cli.texts.prompts import load_prompt_file, load_suite, select

    conversations = load_prompt_file(args.prompts) if args.prompts else load_suite("builtin")
    categories = [name.strip() for name in args.categories.split(",")] if args.categories else None
    conversations = select(conversations, categories, args.limit)
    drafters = ["none", *[name.strip() for name in args.drafters.split(",") if name.strip() != "none"]]
    set_threads(args.threads)
    loaded = load_target(args.target or DEFAULT_TARGET, weights="gguf", device="cpu")
    engine = Engine(loaded.model, loaded.tokenizer)
    info = target_info(loaded.model, loaded.tokenizer)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, eos_token_ids=info.eos_token_ids)
    prompts = [(conversation.category, format_prompt(loaded.tokenizer, [{"role": "user",
                                                                           "content": conversation.first_turn}]))
               for conversation in conversations]
    engine.cost_curve()  # measured (or read) before the clock runs, as `specdec bench` does
    options = DrafterOptions(draft_model=args.draft_model)
    for name in drafters:  # one untimed answer each: every drafter's first-use work out of the timings
        engine.generate(prompts[0][1], make_drafter(name, options, info), config)
    seconds: dict = defaultdict(float)  # (category, drafter, round) -> decoding seconds
    tokens: dict = defaultdict(int)
    steps: dict = defaultdict(lambda: [0, 0, 0])  # (category, drafter) -> [steps, drafted, accepted]
    burners = _burners(args.burners)
    try:
        for round_index in range(args.rounds):
            for category, prompt_ids in prompts:
                plain = None
                for name in drafters:
                    engine.forget()
                    drafter = make_drafter(name, options, info)  # (made before the clock: a head is read from disk)
                    started = time.perf_counter()
                    generation = engine.generate(prompt_ids, drafter, config)
                    elapsed = time.perf_counter() - started - generation.stats.ttft_seconds
                    if plain is None:
                        plain = generation.tokens
                    elif generation.tokens != plain:
                        raise SystemExit(f"{name}'s answer differs from plain decoding's: a bug, not a speed")
                    seconds[category, name, round_index] += elapsed
                    tokens[category, name, round_index] += len(generation.tokens) - 1  # (the first: prefill's)
                    tally = steps[category, name]
                    tally[0] += generation.stats.steps
                    tally[1] += generation.stats.drafted_tokens
                    tally[2] += generation.stats.accepted_tokens
    finally:
        for burner in burners:
            burner.kill()
    return _report(seconds, tokens, steps, drafters, args)


def _report(seconds: dict, tokens: dict, steps: dict, drafters: list[str], args: argparse.Namespace) -> dict:
    categories = sorted({key[0] for key in seconds}) + ["overall"]
    rows = []
    for category in categories:
        chosen = [key for key in seconds if category in ("overall", key[0])]
        for name in drafters[1:]:
            rates = {}
            for which in (name, "none"):
                for round_index in range(args.rounds):
                    keys = [key for key in chosen if key[1] == which and key[2] == round_index]
                    rates[which, round_index] = sum(tokens[key] for key in keys) / sum(seconds[key] for key in keys)
            total = {which: sum(tokens[key] for key in chosen if key[1] == which) /
                     sum(seconds[key] for key in chosen if key[1] == which) for which in (name, "none")}
            per_round = [rates[name, index] / rates["none", index] for index in range(args.rounds)]
            counts = [sum(steps[key][field] for key in steps if key[1] == name and category in ("overall", key[0]))
                      for field in range(3)]
            rows.append({"category": category, "drafter": name, "speed_over_plain": total[name] / total["none"],
                         "fewest_of_rounds": min(per_round), "plain_tokens_per_second": total["none"],
                         "tokens_per_step": sum(tokens[key] for key in chosen if key[1] == name) / max(counts[0], 1),
                         "drafted_per_step": counts[1] / max(counts[0], 1),
                         "acceptance": counts[2] / counts[1] if counts[1] else 0.0})
    return {"burners": args.burners, "rounds": args.rounds, "bar": args.bar, "rows": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", "-m", help="a GGUF file (default: the default model)")
    parser.add_argument("--prompts", help="a JSONL prompt file (Spec-Bench's); default: the builtin suite")
    parser.add_argument("--categories", help="comma-separated categories to keep")
    parser.add_argument("--limit", type=int, default=4, help="prompts per category")
    parser.add_argument("--drafters", default="pld,sam,aded,sam+aded,recycle")
    parser.add_argument("--draft-model", help="the draft model or head `model`, `eagle` and sam+ them read")
    parser.add_argument("--max-new-tokens", "-n", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="passes over the prompts, drafters alternated")
    parser.add_argument("--burners", type=int, default=1, help="processes spinning on the CPU beside the run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bar", type=float, default=0.97, help="the speed over plain each drafter must keep")
    parser.add_argument("--json-out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.burners < 0 or args.limit < 1:
        parser.error("--rounds and --limit must be >= 1, --burners >= 0")
    report = run(args)
    print(f"{'category':16s} {'drafter':10s} {'over plain':>10s} {'fewest round':>12s}  plain tok/s  tokens/step"
          "  drafted/step  acceptance")
    for row in report["rows"]:
        mark = "" if row["speed_over_plain"] >= args.bar else f"  below {args.bar:.2f}x"
        print(f"{row['category']:16s} {row['drafter']:10s} {row['speed_over_plain']:9.2f}x "
              f"{row['fewest_of_rounds']:11.2f}x  {row['plain_tokens_per_second']:11.1f}  "
              f"{row['tokens_per_step']:11.2f}  {row['drafted_per_step']:12.2f}  {row['acceptance']:9.0%}{mark}")
    if args.json_out:
        from specdec_cli.files import write_json_atomic

        write_json_atomic(args.json_out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
