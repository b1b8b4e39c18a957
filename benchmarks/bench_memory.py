"""Benchmark of the per-model memory (issue 17): `sam` with and without the memory on related sessions.

Workload: session 1 answers the builtin suite (30 prompts, one turn each) greedily and stores every answer in
a fresh memory (a temporary folder: the user's memory is never touched). Session 2 is FOLLOW_UPS below: 8
prompts written for this measurement, paraphrases of and follow-ups to session 1's requests (none of them is
one of session 1's prompts word for word). Each follow-up is answered by plain decoding (`none`), by `sam`
without the memory and by `sam` reading the memory, interleaved prompt by prompt, each with a fresh drafter
and fresh engine learning, after one untimed warm-up per method. It prints tokens per target forward,
tokens/s, speedup over plain decoding and whether each output is token-identical to plain decoding.

Run: `python benchmarks/bench_memory.py [--target MODEL] [--max-new-tokens 96] [--json-out FILE]`.
Not a test: nothing here is timed in CI.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FOLLOW_UPS = [
    "Give me an easy weekly routine so that I stop forgetting to water my houseplants, and say why it works.",
    "Explain to a child why the sky is blue during the day but turns red and orange when the sun sets.",
    "Write a Python function `merge_intervals(intervals)` that merges overlapping (start, end) pairs and returns "
    "the merged list sorted by start. Include a short docstring.",
    "Write a Python class `Stack` with push, pop, peek and is_empty methods; pop and peek must raise IndexError "
    "with a clear message when the stack is empty.",
    "Solve 3(x - 4) + 2 = 5x - 18 for x and show every step of the working.",
    "A train departs at 14:35 and arrives at 17:10, with a 12-minute stop on the way. For how many minutes is the "
    "train moving? Show the steps.",
    "translation-1",  # the builtin prompt's text, asked for again in other words (see follow_up_prompts)
    "summarization-1",
]


def follow_up_prompts() -> list[str]:
    """FOLLOW_UPS with the two references to builtin prompts expanded into new requests on the same text."""
    from specdec_cli.texts.prompts import load_builtin

    builtin = {conversation.id: conversation.turns[0] for conversation in load_builtin()}
    prompts = []
    for item in FOLLOW_UPS:
        if item == "translation-1":
            text = builtin[item].split("\n\n", 1)[1]
            prompts.append("Please translate this passage into German once more:\n\n" + text)
        elif item == "summarization-1":
            text = builtin[item].split("\n\n", 1)[1]
            prompts.append("Give me a two-sentence summary of this news report.\n\n" + text)
        else:
            prompts.append(item)
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()

    import torch

    from specdec_cli.decoding.engine import Engine, GenerationConfig
    from specdec_cli.decoding.stats import merge
    from specdec_cli.drafters import DrafterOptions, make_drafter, target_info
    from specdec_cli.target_model.load.models import load_target
    from specdec_cli.texts.memory import Memory, prompt_hash
    from specdec_cli.texts.prompt_ids import format_prompt
    from specdec_cli.texts.prompts import load_builtin

    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_target(args.target)
    engine = Engine(loaded.model, loaded.tokenizer)
    info = target_info(loaded.model, loaded.tokenizer)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, eos_token_ids=info.eos_token_ids)

    def prompt_ids(text: str) -> list[int]:
        return format_prompt(loaded.tokenizer, [{"role": "user", "content": text}])

    folder = Path(tempfile.mkdtemp(prefix="specdec-memory-bench-")) / "memory"
    memory = Memory(folder, info.fingerprint, loaded.name)
    engine.cost_curve()  # measured once, untimed
    _ = engine.supports_trees

    # session 1: the builtin suite, every answer kept
    started = time.perf_counter()
    session1 = load_builtin()
    for conversation in session1:
        drafter = make_drafter("sam", DrafterOptions(), info)
        engine.forget()
        generation = engine.generate(prompt_ids(conversation.turns[0]), drafter, config)
        memory.append(generation.tokens, prompt_ids(conversation.turns[0]))
    session1_seconds = time.perf_counter() - started
    contents = memory.recall()
    follow_ups = follow_up_prompts()
    overlap = len({prompt_hash(prompt_ids(text)) for text in follow_ups} & set(contents.prompt_hashes))

    methods = {
        "none": ("none", DrafterOptions()),
        "sam": ("sam", DrafterOptions()),
        "sam + memory": ("sam", DrafterOptions(memory=str(folder))),
    }
    build_seconds = []
    for drafter_name, options in methods.values():  # warm-up, untimed
        engine.forget()
        engine.generate(prompt_ids("Say hello."), make_drafter(drafter_name, options, info),
                        GenerationConfig(max_new_tokens=16, eos_token_ids=info.eos_token_ids))
    results: dict[str, list] = {name: [] for name in methods}
    outputs: dict[str, list] = {name: [] for name in methods}
    seconds: dict[str, float] = {name: 0.0 for name in methods}
    for text in follow_ups:
        ids = prompt_ids(text)
        for name, (drafter_name, options) in methods.items():
            t0 = time.perf_counter()
            drafter = make_drafter(drafter_name, options, info)  # with the memory: reads it and builds the automaton
            if name == "sam + memory":
                build_seconds.append(time.perf_counter() - t0)
            engine.forget()
            t0 = time.perf_counter()
            generation = engine.generate(ids, drafter, config)
            seconds[name] += time.perf_counter() - t0
            results[name].append(generation.stats)
            outputs[name].append(generation.tokens)

    rows = []
    base_tps = None
    for name in methods:
        pooled = merge(results[name])
        tokens = sum(stats.new_tokens for stats in results[name])
        tps = tokens / seconds[name]
        base_tps = tps if name == "none" else base_tps
        identical = sum(a == b for a, b in zip(outputs[name], outputs["none"]))
        memory_steps = pooled.sources.get("sam-memory", 0)
        rows.append({"method": name, "tokens": tokens, "seconds": round(seconds[name], 2),
                     "tokens_per_second": round(tps, 1), "speedup": round(tps / base_tps, 2) if base_tps else None,
                     "tokens_per_forward": round(pooled.mean_accepted_tokens, 2), "memory_steps": memory_steps,
                     "steps": pooled.steps, "identical": f"{identical}/{len(follow_ups)}"})
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    document = {
        "target": loaded.name, "cpu": cpu, "torch_threads": torch.get_num_threads(),
        "max_new_tokens": args.max_new_tokens,
        "session1": {"prompts": len(session1), "seconds": round(session1_seconds, 1)},
        "memory": {"answers": len(contents.answers), "tokens": contents.tokens,
                   "build_seconds_median": sorted(build_seconds)[len(build_seconds) // 2],
                   "follow_ups_answered_in_memory": overlap},
        "follow_ups": len(follow_ups), "results": rows,
    }
    print(f"{loaded.name} · {cpu} · torch threads {torch.get_num_threads()} · max {args.max_new_tokens} new tokens")
    print(f"session 1: {len(session1)} builtin prompts answered in {session1_seconds:.0f} s -> memory of "
          f"{document['memory']['answers']} answers, {document['memory']['tokens']:,} tokens, built in "
          f"{document['memory']['build_seconds_median'] * 1000:.1f} ms; follow-ups already in it: {overlap}")
    print(f"session 2: {len(follow_ups)} follow-up prompts")
    print(f"{'method':<14}{'tokens':>8}{'tok/fwd':>9}{'tok/s':>8}{'speedup':>9}{'mem steps':>11}{'identical':>11}")
    for row in rows:
        print(f"{row['method']:<14}{row['tokens']:>8}{row['tokens_per_forward']:>9.2f}{row['tokens_per_second']:>8.1f}"
              f"{row['speedup']:>8.2f}x{row['memory_steps']:>11}{row['identical']:>11}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
