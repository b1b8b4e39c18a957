"""Replay recorded greedy answers through drafters: a fast, deterministic way to compare drafting policies.

Greedy speculative decoding commits exactly the target's greedy answer, whatever the drafter; what a drafter
changes is how many tokens each verify pass commits and how many it had to verify. So once the target's
answers are recorded, a drafter can be replayed against them without the model: at each step it proposes,
the engine's own cost-aware planner (`specdec_cli.decoding.planner.DraftPlanner`, drafting costs and
row padding included) trims the draft, the accepted path is the
longest one that matches the recorded answer, and the step is charged the measured verify time t(n) of the
target. Two stages:

    python benchmarks/replay_drafters.py record --suite builtin --limit 2 -o answers.json   # needs the model
    python benchmarks/replay_drafters.py replay answers.json --drafters pld,sam,sam+none --index answers.sam

`record` answers each prompt greedily (first turn, the chat template) and stores prompt ids, answer ids, the
target's top-8 at every answer position, and the engine's verify-cost curve for the target on this machine (the
one stored under $SPECDEC_HOME/costs where there is one: it may be a busy hour's; `replay --cost` replaces it).
`replay` prints per-category and overall estimated speedups over plain decoding, mean tokens per verify
pass (tau), and per draft source steps/verified/accepted. A method may carry settings after `@`:
`sam+aded@t2` (l_threshold 2), `sam@b0` (l_bias 0), `sam@f1` (static drafts follow the most frequent
continuation). `--remember` gives sam, for each answer, every earlier answer as the answer memory would;
`--forget` starts each answer from a new drafter and the planner's priors (as `specdec bench` and bench_busy.py
do); `--cost 1:0.072,2:0.086,...` charges another machine's curve (seconds by rows) instead of the recorded one.
`suffix` replays Snowflake's SuffixDecoding (arctic-inference's suffix trees, where built) on the same answers:
its global tree over earlier responses with `--remember`, the request alone without.

What it does not model: the drafters' own time (measured and added, but on an idle process), the engine's
per-step overhead, and the rows of rejected tree nodes that Token Recycling would learn from (only the
accepted path's top-8 rows are known), so `recycle` is underestimated here. It agreed with `specdec bench`
within ~3% on the builtin suite for pld, sam and aded. It is a tool for choosing defaults, not a benchmark
to quote: README numbers come from `specdec bench`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict

from specdec_cli.decoding.cost_curve import PROBE_SIZES, CostCurve
from specdec_cli.decoding.draft import NOTHING, Draft, StepEvent
from specdec_cli.decoding.engine import GenerationConfig
from specdec_cli.decoding.planner import DraftPlanner
from specdec_cli.decoding.step_parts import trim
from specdec_cli.drafters import DrafterOptions, TargetInfo, make_drafter
from specdec_cli.files import write_json_atomic

TOP_K = 8


# ---------------------------------------------------------------------------------------------- record


def record(args: argparse.Namespace) -> None:
    import torch

    from specdec_cli.decoding.engine import Engine
    from specdec_cli.drafters import target_info
    from specdec_cli.drafters.none import NoDrafter
    from specdec_cli.target_model.load.models import load_target
    from specdec_cli.texts.prompt_ids import format_prompt
    from specdec_cli.texts.prompts import load_prompt_file, load_suite, select

    loaded = load_target(args.target, "cpu", "float32")
    model, tokenizer = loaded.model, loaded.tokenizer
    engine = Engine(model, tokenizer)
    info = target_info(model, tokenizer)
    conversations = load_prompt_file(args.prompts) if args.prompts else load_suite(args.suite)
    rows = []
    for conversation in select(conversations, None, args.limit):
        prompt = format_prompt(tokenizer, [{"role": "user", "content": conversation.turns[0]}])
        config = GenerationConfig(max_new_tokens=args.max_new_tokens, eos_token_ids=info.eos_token_ids,
                                  cost_aware=False)  # the answer a user sees: it ends at the end of text
        answer = engine.generate(prompt, NoDrafter(), config).tokens
        with torch.no_grad():
            logits = model(torch.tensor([prompt + list(answer)])).logits[0]  # [prompt + answer, vocab]
        top = logits[len(prompt) - 1 :].topk(TOP_K, dim=-1).indices.tolist()  # row i predicts answer[i]
        rows.append({"category": conversation.category, "prompt": prompt, "answer": list(answer), "topk": top})
        print(f"{conversation.category}: {len(answer)} tokens", file=sys.stderr)
    cost = {str(size): engine.cost_curve()(size) for size in PROBE_SIZES}
    document = {"version": 1, "target": loaded.name, "vocab_size": info.vocab_size,
                "eos_token_ids": list(info.eos_token_ids), "fingerprint": info.fingerprint, "cost": cost,
                "rows": rows}
    write_json_atomic(args.output, document)


# ---------------------------------------------------------------------------------------------- replay


def accepted_path(draft: Draft, truth: list[int]) -> list[int]:
    """Node indices of the longest draft path that matches `truth` (greedy acceptance)."""
    parents = draft.parents if draft.parents is not None else list(range(-1, len(draft) - 1))
    path, node = [], -1
    while len(path) < len(truth):
        child = next((index for index, (token, parent) in enumerate(zip(draft.tokens, parents))
                      if parent == node and token == truth[len(path)]), None)
        if child is None:
            break
        path.append(child)
        node = child
    return path


def parse_method(spec: str, index: str | None) -> tuple[str, DrafterOptions, dict]:
    """`sam+aded@t2b0f1` -> ("sam+aded", options with l_threshold 2 and l_bias 0, {"frequent": True})."""
    name, _, settings = spec.partition("@")
    options = DrafterOptions(index=index)
    attributes = {}
    for part in filter(None, settings.replace("b", ",b").replace("t", ",t").replace("f", ",f").split(",")):
        if part[0] == "t":
            options.l_threshold = int(part[1:])
        elif part[0] == "b":
            options.l_bias = int(part[1:])
        elif part[0] == "f":  # sam's static drafts: the most frequent continuation (1) or the earliest (0)
            attributes["frequent"] = part[1:] == "1"
    return name, options, attributes


def remembered(rows: list, upto: int, document: dict, index_text) -> tuple:
    """sam's static automaton as the answer memory would make it before answer `upto`: the index's text, then
    every earlier answer with an EOS after it; and where the memory starts in it."""
    import numpy as np

    from specdec_cli.sam.automaton import build_static

    separator = min(document["eos_token_ids"])
    parts = [] if index_text is None else [np.asarray(index_text, dtype=np.int32)]
    parts += [np.asarray([*row["answer"], separator], dtype=np.int32) for row in rows[:upto]]
    if not parts:
        return None, None
    text = np.concatenate(parts)
    static = build_static(text, max(int(text.max()) + 1, document["vocab_size"]), document["eos_token_ids"])
    return static, 0 if index_text is None else len(index_text)


SUFFIX = "suffix"
SUFFIX_DEPTH = 24  # vLLM's defaults for SuffixDecoding: tree depth, draft length per matched token, token floor
SUFFIX_FACTOR = 1.0
SUFFIX_MIN_PROB = 0.1


class SuffixReference:
    """SuffixDecoding (Snowflake's arctic-inference suffix trees) as a replay drafter, for comparison only: each
    prompt in a tree of its own, responses in a global tree; with `remember` every earlier response stays there
    (its global cache), else only the current one. Needs the `arctic_inference.suffix_decoding` extension
    (README in this folder: it builds alone with cmake and nanobind)."""

    name = SUFFIX
    needs = NOTHING

    def __init__(self, remember: bool):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(max_tree_depth=SUFFIX_DEPTH, max_cached_requests=-1 if remember else 1)
        self.request = 0

    def observe(self, event: StepEvent) -> None:
        if event.kind == "prefill":
            if self.request:
                self.cache.stop_request(self.request)
            self.request += 1
            self.cache.start_request(self.request, list(event.prompt_tokens))
        self.cache.add_active_response(self.request, list(event.committed))

    def reset(self) -> None:
        pass  # each prefill starts a request of its own

    def propose(self, context: list, budget: int) -> Draft:
        draft = self.cache.speculate(self.request, context[-SUFFIX_DEPTH:], max_spec_tokens=budget,
                                     max_spec_factor=SUFFIX_FACTOR, min_token_prob=SUFFIX_MIN_PROB)
        return Draft(tokens=list(draft.token_ids), source=SUFFIX, match_len=int(draft.match_len))


def make_replay_drafter(name: str, options: DrafterOptions, info: TargetInfo, remember: bool):
    """specdec's drafters by name, and `suffix` (SuffixDecoding; skipped with one line where it is not built)."""
    if name != SUFFIX:
        return make_drafter(name, options, info)
    try:
        return SuffixReference(remember)
    except ImportError:
        print("suffix: skipped: arctic_inference.suffix_decoding is not importable (see benchmarks/README.md)",
              file=sys.stderr)
        return None


def replay(spec: str, document: dict, index: str | None, draft_max: int,
           remember: bool = False, forget: bool = False) -> tuple[dict, dict]:
    """Per category [answer tokens, estimated seconds, verify passes]; per source [steps, verified, accepted].
    With `remember`, sam drafts each answer with every earlier answer remembered (the answer memory); with
    `forget`, each answer starts from a new drafter and the planner's priors, as `specdec bench` answers."""
    name, options, attributes = parse_method(spec, index)
    info = TargetInfo(document["vocab_size"], tuple(document["eos_token_ids"]), document["fingerprint"])
    cost = CostCurve.fixed({int(size): seconds for size, seconds in document["cost"].items()})

    def fresh_drafter():
        made = make_replay_drafter(name, options, info, remember)
        for key, value in attributes.items() if made is not None else ():
            setattr(made, key, value)
        return made

    drafter = fresh_drafter()
    if drafter is None:
        return {}, {}
    index_text = getattr(getattr(drafter, "static", None), "text", None)
    planner = DraftPlanner(cost)  # the engine's planner, on the recorded curve (fixed: replays are deterministic)
    per_category: dict = defaultdict(lambda: [0, 0.0, 0])
    per_source: dict = defaultdict(lambda: [0, 0, 0])
    for number, row in enumerate(document["rows"]):
        prompt, answer, topk = row["prompt"], row["answer"], row["topk"]
        if forget and number:
            planner.forget()
            drafter = fresh_drafter()
        if remember and hasattr(drafter, "memory_from"):
            drafter.static, drafter.memory_from = remembered(document["rows"], number, document, index_text)
            drafter.reset()
        drafter.observe(StepEvent(kind="prefill", draft=Draft.empty(name), committed=answer[:1], prompt_tokens=prompt,
                                  settings=GenerationConfig()))
        context, done, seconds, passes = list(prompt) + answer[:1], 1, cost(1), 1
        while done < len(answer):
            started = time.perf_counter()
            draft = drafter.propose(context, draft_max)
            drafting = time.perf_counter() - started
            planner.observe_drafting(draft.source, len(draft), drafting)
            plan = planner.plan(draft, draft_max)  # keep what is expected to pay off, in the cheapest block
            draft = trim(draft, plan.keep)
            path = accepted_path(draft, answer[done:])
            committed = answer[done : done + len(path) + 1]
            planner.record(draft, len(path), len(committed), plan.rows, cost(plan.rows), drafting)
            seconds += drafting + cost(plan.rows)
            passes += 1
            stats = per_source[draft.source]
            stats[0], stats[1], stats[2] = stats[0] + 1, stats[1] + len(draft), stats[2] + len(path)
            on_path = Draft([draft.tokens[node] for node in path], draft.source)  # rows known only on the path
            drafter.observe(StepEvent(kind="step", draft=on_path, committed=committed,
                                      accepted_path=list(range(len(path))),
                                      scored_topk=[topk[done - 1 + depth] for depth in range(len(path) + 1)]))
            context += committed
            done += len(committed)
        totals = per_category[row["category"]]
        totals[0], totals[1], totals[2] = totals[0] + len(answer), totals[1] + seconds, totals[2] + passes
    return per_category, per_source


def replay_all(args: argparse.Namespace) -> None:
    with open(args.answers, encoding="utf-8") as handle:
        document = json.load(handle)
    if args.cost:  # another machine's curve, "1:0.072,2:0.086,..." (seconds by rows)
        document["cost"] = {size: float(seconds) for size, seconds in
                            (pair.split(":") for pair in args.cost.split(","))}
    plain_seconds = CostCurve({int(size): s for size, s in document["cost"].items()})(1)
    categories = sorted({row["category"] for row in document["rows"]})
    plain = {category: plain_seconds * sum(len(row["answer"]) for row in document["rows"]
                                           if row["category"] == category) for category in categories}
    print("method".ljust(16) + "".join(category[:9].rjust(10) for category in categories) + "overall".rjust(10)
          + "tau".rjust(6) + "  sources: steps/verified/accepted")
    for spec in args.drafters.split(","):
        per_category, per_source = replay(spec, document, args.index, args.draft_max, args.remember, args.forget)
        if not per_category:
            continue
        speedups = [plain[category] / per_category[category][1] for category in categories]
        overall = sum(plain.values()) / sum(totals[1] for totals in per_category.values())
        tau = sum(totals[0] for totals in per_category.values()) / sum(totals[2] for totals in per_category.values())
        sources = " ".join(f"{source}:{s[0]}/{s[1]}/{s[2]}" for source, s in sorted(per_source.items()))
        print(spec.ljust(16) + "".join(f"{value:.2f}x".rjust(10) for value in speedups) + f"{overall:.3f}x".rjust(10)
              + f"{tau:.2f}".rjust(6) + "  " + sources)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="answer prompts greedily with the target and store what replay needs")
    rec.add_argument("--suite", default="builtin")
    rec.add_argument("--prompts", help="a prompt file instead of a suite (e.g. Spec-Bench's question.jsonl)")
    rec.add_argument("--limit", type=int, default=2, help="prompts per category")
    rec.add_argument("--max-new-tokens", "-n", type=int, default=128)
    rec.add_argument("--target", default="smollm2-135m-instruct")
    rec.add_argument("--output", "-o", required=True)
    rep = commands.add_parser("replay", help="replay drafters against recorded answers")
    rep.add_argument("answers")
    rep.add_argument("--drafters", default="pld,sam,sam+none,aded")
    rep.add_argument("--index", help="static suffix-automaton index for sam (and aded's tri-grams)")
    rep.add_argument("--draft-max", type=int, default=8)
    rep.add_argument("--remember", action="store_true", help="sam drafts each answer with the earlier ones remembered")
    rep.add_argument("--forget", action="store_true",
                     help="each answer from a new drafter and the planner's priors, as `specdec bench` answers")
    rep.add_argument("--cost", help="the verify curve to charge instead of the recorded one: ROWS:SECONDS,...")
    args = parser.parse_args()
    record(args) if args.command == "record" else replay_all(args)


if __name__ == "__main__":
    main()
