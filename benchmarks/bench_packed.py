"""The device engine's packed GEMM against the dense one it replaces, per matrix shape and tile size.

For each matrix of Llama-3-8B's shape in its Q4_K_M types (random blocks with write_gguf.py's scales), held at the
file's bits on the device (kernels/triton_layout.py), it times 16 rows (the engine's padded step)
through the packed Triton kernel at each tile size of `--tiles` (SPECDEC_DEVICE_TILES), and the same rows through a
bfloat16 copy of the weights (torch's GEMM: what the engine did before), and reports microseconds, the bytes read
per second, and the largest difference between the two products (another summation order: small).
The fastest tiles are what `GPU_TILES` in kernels/triton_gemm.py should be. Beside them, for Q4_K and Q6_K, the
words kernel (kernels/triton_words_gemm.py, SPECDEC_DEVICE_KERNEL=words: codes in 32-bit words along the outputs,
scaled after the product) at each tiling of `--word-tiles` (SPECDEC_DEVICE_WORD_TILES; "default": its own choice
per matrix), per matrix under "words", its fastest as "best_words" and "fastest_words" (what WORD_GPU_TILES should
be; its difference from the dense product is larger, as the dense copy's weights are rounded to bfloat16 and its are
not). "fastest" stays the packed kernel's (gpu_check.py runs the benches at it). One JSON to --out (or stdout).

`--dry-run` runs a tiny shape on the CPU in Triton's interpreter (the test suite runs it): the path, not speed.

Run: `python benchmarks/bench_packed.py [--device cuda] [--tiles 16x128,32x64] [--word-tiles default,64x128]
[--out packed.json]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parent.parent
SHAPES_8B = [("attn_q|k", "Q4_K", 5120, 4096), ("attn_v", "Q6_K", 1024, 4096), ("attn_output", "Q4_K", 4096, 4096),
             ("ffn_gate|up", "Q4_K", 28672, 4096), ("ffn_down", "Q6_K", 4096, 14336)]  # a layer, as the engine fuses it
SHAPES_DRY = [("tiny_q4_k", "Q4_K", 96, 512), ("tiny_q6_k", "Q6_K", 64, 256)]
TILES = "16x64,16x128,16x256,32x64,32x128,16x128x4,16x128x8,32x128x8"  # NxK (unsplit) or NxKxS (S spans)
WORD_TILES = "default,64x128,128x128,256x128,128x256,64x128x4,128x128x4,128x128x8,64x256x8"  # words kernel
ROWS = 16


def packed_matrix(type_name: str, n: int, k: int, device: Any, seed: int) -> Any:
    """A random GGUF matrix of the type (write_gguf.py's blocks) as a PackedMatrix on the device."""
    import numpy as np
    from gguf import GGMLQuantizationType

    sys.path.insert(0, str(REPO / "benchmarks"))
    from write_gguf import random_tensor

    from specdec_cli.target_model.device.weights import packed_from_gguf

    raw = random_tensor(np.random.default_rng(seed), getattr(GGMLQuantizationType, type_name), n, k, 0.02)
    return packed_from_gguf(type_name, np.asarray(raw).reshape(n, -1), device)


def timed(run: Callable[..., Any], args: tuple, device: Any, repeats: int) -> float:
    """Median seconds of `run(*args)` over `repeats` calls after two untimed ones (the first compiles)."""
    import torch

    for _ in range(2):
        run(*args)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        run(*args)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def timed_tiles(matrix: Any, make: Callable[[Any], Any], variable: str, tiles: list[str], x: Any, want: Any,
                dense_seconds: float, device: Any, repeats: int, tolerant: bool = False) -> dict[str, dict]:
    """Each tiling's figures for one matrix: `variable` set to the tile ("default": unset) as `make(matrix)` makes
    the GEMM. `tolerant`: a tiling that fails (a GPU's resources, untried before) is an "error" entry, not the end."""
    results = {}
    for tile in tiles:
        if tile == "default":
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = tile  # read as the GEMM is made
        try:
            gemm = make(matrix)
            seconds = timed(gemm, (x,), device, repeats)
            difference = float((gemm(x) - want).abs().max() / want.abs().max())
        except Exception as error:  # said in the JSON; the sweep goes on
            if not tolerant:
                raise
            results[tile] = {"error": f"{type(error).__name__}: {error}"[:300]}
            continue
        results[tile] = {"tiling": list(gemm.tiling), "us": round(seconds * 1e6, 1),
                         "gb_s": round(matrix.nbytes / seconds / 1e9, 1),
                         "over_dense": round(dense_seconds / seconds, 3), "max_relative_difference": difference}
    os.environ.pop(variable, None)
    return results


def best(figures: dict[str, dict]) -> Optional[str]:
    """The tiling that took the least time (of those that ran)."""
    return min((tile for tile in figures if "us" in figures[tile]), key=lambda tile: figures[tile]["us"], default=None)


def measure(shapes: list, tiles: list[str], device_name: str, repeats: int,
            word_tiles: Optional[list[str]] = None) -> list[dict]:
    import torch

    from specdec_cli.kernels.triton_gemm import TILES_VARIABLE, PackedGemm
    from specdec_cli.kernels.triton_words_gemm import WORD_TILES_VARIABLE, WordGemm
    from specdec_cli.kernels.triton_words_layout import WordMatrix, word_takes

    device = torch.device(device_name)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = torch.randn(ROWS, max(k for *_, k in shapes), generator=torch.Generator().manual_seed(0))
    results = []
    for index, (name, type_name, n, k) in enumerate(shapes):
        matrix = packed_matrix(type_name, n, k, device, seed=index)
        x = rows[:, :k].to(device=device, dtype=dtype).contiguous()
        dense = matrix.dequantize().to(dtype)  # [n, k]: the engine's weights before
        want = (x @ dense.t()).float()
        dense_seconds = timed(torch.matmul, (x, dense.t()), device, repeats)
        row: dict[str, Any] = {"matrix": name, "type": type_name, "n": n, "k": k, "packed_bytes": matrix.nbytes,
                               "dense_bytes": dense.numel() * dense.element_size(),
                               "dense_us": round(dense_seconds * 1e6, 1),
                               "dense_gb_s": round(dense.numel() * dense.element_size() / dense_seconds / 1e9, 1),
                               "tiles": {}}
        dense = None
        row["tiles"] = timed_tiles(matrix, PackedGemm, TILES_VARIABLE, tiles, x, want, dense_seconds, device, repeats)
        row["best_tiles"] = min(row["tiles"], key=lambda tile: row["tiles"][tile]["us"])
        if word_tiles and word_takes(matrix.kind, k):  # the words kernel on the same weights
            words = WordMatrix.from_packed(matrix)  # [n, k] in 32-bit words along n
            row["words_bytes"] = words.nbytes
            row["words"] = timed_tiles(words, WordGemm, WORD_TILES_VARIABLE, word_tiles, x, want, dense_seconds,
                                       device, repeats, tolerant=True)
            row["best_words"] = best(row["words"])
            del words
        results.append(row)
        print(json.dumps({key: value for key, value in row.items() if key not in ("tiles", "words")}), flush=True)
        del matrix
    return results


def fastest(results: list[dict], kernel: str = "tiles") -> Optional[str]:
    """The setting whose matrices took the least time together (the 8B's layer, each matrix once) under `kernel`
    ("tiles": the packed kernel; "words": the words kernel, over the matrices it took)."""
    timed_rows = [row for row in results if kernel in row]
    settings = set.intersection(*({tile for tile, figures in row[kernel].items() if "us" in figures}
                                  for row in timed_rows)) if timed_rows else set()
    return min(settings, key=lambda tile: sum(row[kernel][tile]["us"] for row in timed_rows), default=None)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cuda (default), or cpu (the default with --dry-run)")
    parser.add_argument("--tiles", default=None, help=f"NxK tile sizes to time, comma-separated (default {TILES})")
    parser.add_argument("--word-tiles", default=None,
                        help=f"the words kernel's tilings, NxK[xS] or default, comma-separated (default {WORD_TILES}; "
                             "none: not timed)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per measurement (default 20; 2 dry)")
    parser.add_argument("--dry-run", action="store_true", help="a tiny shape on the CPU, in Triton's interpreter")
    parser.add_argument("--out", default=None, help="write the JSON here (default: stdout)")
    args = parser.parse_args(argv)
    device = args.device or ("cpu" if args.dry_run else "cuda")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.path.insert(0, str(REPO))
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"bench_packed: --device cuda, but torch {torch.__version__} sees no GPU here; try --dry-run")
    tiles = (args.tiles or ("16x128,32x64" if args.dry_run else TILES)).split(",")
    word_tiles = (args.word_tiles or ("default" if args.dry_run else WORD_TILES)).split(",")
    results = measure(SHAPES_DRY if args.dry_run else SHAPES_8B, tiles, device,
                      args.repeats or (2 if args.dry_run else 20), [] if word_tiles == ["none"] else word_tiles)
    document = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (Triton's interpreter)",
                "torch": torch.__version__, "rows": ROWS, "results": results, "fastest": fastest(results),
                "fastest_words": fastest(results, "words")}
    text = json.dumps(document, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
