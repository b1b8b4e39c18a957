"""benchmarks/copy_bound.py: the bounds on what copying drafts can commit, against hand-worked answers and brute
force on random token streams."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from helpers import benchmark_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "copy_bound.py"


def test_occurrences_are_where_each_earlier_copy_of_the_suffix_is_followed():
    bound = benchmark_script("copy_bound")
    context = [1, 2, 3, 1, 2, 4, 1, 2]
    assert bound.occurrences(context, 2) == [2, 5]  # [1, 2] was followed by 3, then by 4
    assert bound.occurrences(context, 3) == []  # the suffix [4, 1, 2] was not seen before
    assert bound.longest_match(context) == (2, [2, 5])
    assert bound.longest_match([5, 6, 7]) == (0, [])


def test_the_chain_copies_the_earliest_occurrence_and_the_best_any_occurrence():
    bound = benchmark_script("copy_bound")
    context = [1, 2, 3, 1, 2, 4, 9, 1, 2]
    assert bound.sam_chain(context, [3, 1, 2], 8) == 3  # the earliest: 3, 1, 2, 4, ...
    assert bound.sam_chain(context, [4, 9], 8) == 0
    assert bound.best_longest(context, [4, 9], 8) == 2  # the second occurrence is right
    assert bound.best_any(context, [4, 9], 8) == 2


def test_the_bounds_are_ordered_on_random_streams():
    """sam's chain <= the best of the longest match's occurrences <= the best of any; every tree <= the best of
    any; a tree that holds every continuation (nodes enough) is the best of any."""
    bound = benchmark_script("copy_bound")
    generator = random.Random(0)
    for _ in range(200):
        context = [generator.randrange(4) for _ in range(generator.randrange(2, 40))]
        truth = [generator.randrange(4) for _ in range(6)]
        chain, longest, anywhere = (bound.sam_chain(context, truth, 6), bound.best_longest(context, truth, 6),
                                    bound.best_any(context, truth, 6))
        assert chain <= longest <= anywhere
        assert bound.weighted_tree(context, truth, 6, 3) <= anywhere
        assert bound.weighted_tree(context, truth, 6, 10_000) == anywhere


def test_steps_commit_the_accepted_drafts_and_one_more_token():
    bound = benchmark_script("copy_bound")
    rows = [{"category": "qa", "prompt": [7], "answer": list(range(10))}]
    # the oracle at depth 4: the prefill commits 1 token, then each step 4 + 1 -> steps 1, 2 (6 tokens), 3 (11 > 10)
    assert bound.tokens_per_step(rows, lambda context, truth, depth: len(truth), 4) == {"qa": (10, 3)}
    assert bound.tokens_per_step(rows, lambda context, truth, depth: 0, 4) == {"qa": (10, 10)}


def test_the_script_prints_a_row_per_bound(tmp_path):
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"rows": [{"category": "code", "prompt": [1, 2, 3, 4],
                                             "answer": [1, 2, 3, 4, 1, 2, 3, 4, 5]}]}), encoding="utf-8")
    result = subprocess.run([sys.executable, str(SCRIPT), str(answers), "--trees", "2"], capture_output=True,
                            text=True, check=True)
    names = [line.split()[0] for line in result.stdout.splitlines()[1:]]
    assert names == ["sam", "best-longest", "best-any", "tree-2", "oracle"]
