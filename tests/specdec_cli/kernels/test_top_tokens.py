"""kernels.top_tokens, each row's largest logits' ids, against brute force on every path this CPU has: ties to the
lower id (across the kernel's pieces of a row too), NaN counted largest and -inf smallest, so column 0 is
torch.argmax's first maximum; and the engine's greedy read-back through it answers as torch's."""

from __future__ import annotations

import math
import random

import pytest
import torch

from specdec_cli import kernels

pytestmark = [pytest.mark.skipif(not kernels.available(), reason="the C kernels are not built"),
              pytest.mark.usefixtures("kernel_settings")]


def _brute(row: list[float], k: int) -> list[int]:
    """Sort every id by (NaN first, value descending, id ascending) and take k."""
    def rank(index: int) -> tuple[int, float, int]:
        value = row[index]
        return (0, 0.0, index) if math.isnan(value) else (1, -value, index)
    return sorted(range(len(row)), key=rank)[:k]


def _logits(rng: random.Random, rows: int, vocab: int) -> torch.Tensor:
    """Few distinct values (many ties, some across 16384-wide pieces), a NaN or an infinity now and then."""
    levels = [rng.uniform(-5, 5) for _ in range(rng.randint(1, 6))] + [-math.inf, math.inf]
    values = [[rng.choice(levels[:-2]) for _ in range(vocab)] for _ in range(rows)]
    for row in values:
        for _ in range(rng.randint(0, 2)):
            row[rng.randrange(vocab)] = rng.choice([math.nan, math.inf, -math.inf])
    return torch.tensor(values, dtype=torch.float32)


@pytest.mark.parametrize("path", kernels.isas() if kernels.available() else [])
def test_each_rows_largest_ids_as_brute_force_ranks_them(path):
    kernels.force_isa(path)
    rng = random.Random(7)
    for threads in (1, 2):
        kernels.set_threads(threads)
        for vocab in (1, 7, 8, 9, 31, 1000, 16384, 16385, 40000):
            rows = rng.randint(1, 5)
            logits = _logits(rng, rows, vocab)
            for k in sorted({1, min(8, vocab), min(16, vocab)}):
                got = kernels.top_tokens(logits, k).tolist()
                assert got == [_brute(row, k) for row in logits.tolist()], (path, vocab, k)


def test_column_zero_is_torch_argmax_on_real_looking_logits():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 151936, generator=generator) * 3
    logits[3, 100:105] = logits[3].max() + 1  # a tie at the top: the first one
    logits[5, 7] = math.nan
    logits[5, 90000] = math.nan
    picked = kernels.top_tokens(logits, 8)
    assert torch.equal(picked[:, 0], logits.argmax(dim=-1))
    assert torch.equal(picked[[0, 1, 2, 4, 6, 7, 8]], torch.topk(logits, 8, dim=-1).indices[[0, 1, 2, 4, 6, 7, 8]])


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        kernels.top_tokens(torch.zeros(2, 5), 6)  # k above the vocabulary
    with pytest.raises(ValueError):
        kernels.top_tokens(torch.zeros(2, 50), 17)
    with pytest.raises(ValueError):
        kernels.top_tokens(torch.zeros(2, 50, dtype=torch.float64), 1)
    with pytest.raises(ValueError):
        kernels.top_tokens(torch.zeros(50), 1)


def test_the_engines_read_back_is_torchs():
    from specdec_cli.decoding.step_parts import read_back

    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 3000, generator=generator)
    logits[2, :] = 0.0  # all tied: id 0
    argmax, top = read_back(logits, greedy=True, topk=True)
    assert argmax == logits.argmax(dim=-1).tolist() and argmax[2] == 0
    assert [row[0] for row in top] == argmax and all(len(row) == 8 for row in top)
    assert read_back(logits, greedy=True, topk=False) == (argmax, None)
    assert read_back(logits.double(), greedy=True, topk=False) == (argmax, None)  # torch's, for other dtypes
