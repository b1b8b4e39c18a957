"""How far can drafting by copying go? Upper bounds on recorded greedy answers, without the model.

Every model-free drafter here (`sam`, `pld`, ADED's tri-grams, an index or the answer memory) drafts a
continuation of something already seen: the text after an earlier occurrence of the context's suffix. This
script takes answers recorded by `replay_drafters.py record` and, stepping through each answer as greedy
speculative decoding does (a step commits the accepted draft tokens and the target's own next token), counts
tokens per step when every step's draft is:

- `sam`: the continuation of the longest suffix match's earliest occurrence (what `sam` drafts as a chain), at
  most `1 + 4 x match length` tokens;
- `best-longest`: the best continuation among *all* occurrences of the longest match (an oracle choosing among
  them: any tree of those continuations verifies at most this much);
- `best-any`: the best continuation among all occurrences of *every* suffix length (the most any drafter that
  copies from this conversation could accept, whatever tree it builds);
- `tree-N`: a tree of N nodes over all occurrences' continuations, each path weighted by how many occurrences
  share it (longer matches weigh more), as suffix-tree drafters build it;
- `oracle`: the answer itself, `--depth` tokens a step (`specdec bench --oracle`'s draft).

Drafts are at most `--depth` tokens. Tokens per step is what a drafter commits per target forward; the speed that
follows depends on the machine's verify-cost curve (README, docs/methods.md). Nothing here is timed and nothing is
asserted: it bounds what copying can commit, to tell where a drafter of another kind (a trained head) is needed.

    python benchmarks/copy_bound.py answers.json [--depth 8] [--trees 4,8]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from typing import Callable, Sequence

from specdec_cli.decoding.verify import greedy_accept  # leading draft tokens the greedy answer follows

ALPHA = 4  # sam's draft length per matched token (drafters/sam.py)
MAX_MATCH = 32  # suffix lengths tried: longer matches change no bound measurably and cost time


def occurrences(context: Sequence[int], length: int) -> list[int]:
    """Start positions of what follows each earlier occurrence of the context's last `length` tokens."""
    end, suffix = len(context), list(context[len(context) - length :])
    first = suffix[0]
    return [start + length for start in range(end - length) if context[start] == first
            and list(context[start : start + length]) == suffix]


def matches(context: Sequence[int]) -> list[tuple[int, list[int]]]:
    """(suffix length, continuation starts) for every length of the context's suffix seen earlier in it, shortest
    first (a suffix not seen has no longer one seen either)."""
    found: list[tuple[int, list[int]]] = []
    for length in range(1, min(MAX_MATCH, len(context) - 1) + 1):
        starts = occurrences(context, length)
        if not starts:
            break
        found.append((length, starts))
    return found


def longest_match(context: Sequence[int]) -> tuple[int, list[int]]:
    """(match length, continuation starts) of the longest suffix of the context seen earlier in it."""
    found = matches(context)
    return found[-1] if found else (0, [])


def sam_chain(context: list[int], truth: list[int], depth: int) -> int:
    length, starts = longest_match(context)
    return greedy_accept(context[starts[0] : starts[0] + min(depth, 1 + ALPHA * length)], truth) if length else 0


def best_longest(context: list[int], truth: list[int], depth: int) -> int:
    _, starts = longest_match(context)
    return max((greedy_accept(context[start : start + depth], truth) for start in starts), default=0)


def best_any(context: list[int], truth: list[int], depth: int) -> int:
    return max((greedy_accept(context[start : start + depth], truth) for _, starts in matches(context)
                for start in starts), default=0)


def weighted_tree(context: list[int], truth: list[int], depth: int, nodes: int) -> int:
    """Accepted tokens of the `nodes` likeliest paths of the continuations' trie (weights 2^match length)."""
    weight: dict[tuple, float] = defaultdict(float)
    for size, starts in matches(context):
        for start in starts:
            continuation = tuple(context[start : start + depth])
            for cut in range(1, len(continuation) + 1):
                weight[continuation[:cut]] += 2.0 ** size
    children: dict[tuple, list[tuple]] = defaultdict(list)
    for path in weight:
        children[path[:-1]].append(path)
    likelihood: dict[tuple, float] = {}
    stack = [((), 1.0)]
    while stack:  # a path's likelihood: the product of its steps' shares among their siblings
        path, share = stack.pop()
        siblings = children.get(path, [])
        total = sum(weight[child] for child in siblings)
        for child in siblings:
            likelihood[child] = share * weight[child] / total
            stack.append((child, likelihood[child]))
    kept = set(sorted(likelihood, key=likelihood.__getitem__, reverse=True)[:nodes])
    count = 0
    while count < len(truth) and tuple(truth[: count + 1]) in kept:
        count += 1
    return count


def tokens_per_step(rows: list[dict], accepted: Callable[[list[int], list[int], int], int],
                    depth: int) -> dict[str, tuple[int, int]]:
    """Per category (answer tokens, steps) when each step accepts `accepted(context, truth, depth)` drafts."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in rows:
        prompt, answer = list(row["prompt"]), list(row["answer"])
        done, steps = 1, 1  # the prefill commits the first token
        while done < len(answer):
            done += accepted(prompt + answer[:done], answer[done : done + depth], depth) + 1
            steps += 1
        totals[row["category"]][0] += len(answer)
        totals[row["category"]][1] += steps
    return {category: (tokens, steps) for category, (tokens, steps) in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("answers", help="recorded answers (replay_drafters.py record)")
    parser.add_argument("--depth", type=int, default=8, help="longest draft, in tokens")
    parser.add_argument("--trees", default="4,8", help="node counts of the weighted trees, comma-separated")
    args = parser.parse_args()
    with open(args.answers, encoding="utf-8") as handle:
        rows = json.load(handle)["rows"]
    methods: dict[str, Callable[[list[int], list[int], int], int]] = {
        "sam": sam_chain, "best-longest": best_longest, "best-any": best_any}
    for nodes in (int(part) for part in args.trees.split(",") if part):
        methods[f"tree-{nodes}"] = lambda context, truth, depth, nodes=nodes: weighted_tree(context, truth, depth,
                                                                                             nodes)
    methods["oracle"] = lambda context, truth, depth: len(truth)
    categories = sorted({row["category"] for row in rows})
    print("tokens per step".ljust(16) + "".join(category[:9].rjust(10) for category in categories)
          + "overall".rjust(10))
    for name, accepted in methods.items():
        totals = tokens_per_step(rows, accepted, args.depth)
        overall = sum(tokens for tokens, _ in totals.values()) / sum(steps for _, steps in totals.values())
        print(name.ljust(16) + "".join(f"{totals[c][0] / totals[c][1]:10.2f}" for c in categories)
              + f"{overall:10.2f}", flush=True)


if __name__ == "__main__":
    main()
