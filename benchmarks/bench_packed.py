"""The device engine's packed GEMM against the dense one it replaces, per matrix shape and tile size.

For each matrix of Llama-3-8B's shape in its Q4_K_M types (random blocks with write_gguf.py's scales), held at the
file's bits on the device (kernels/triton_layout.py), it times 16 rows (the engine's padded step)
through the packed Triton kernel at each tile size of `--tiles` (SPECDEC_DEVICE_TILES), and the same rows through a
bfloat16 copy of the weights (torch's GEMM: what the engine did before), and reports microseconds, the bytes read
per second, and the largest difference between the two products (another summation order: small).
The fastest tiles are what `GPU_TILES` in kernels/triton_gemm.py should be. One JSON to --out (or stdout).

`--dry-run` runs a tiny shape on the CPU in Triton's interpreter (the test suite runs it): the path, not speed.

Run: `python benchmarks/bench_packed.py [--device cuda] [--tiles 16x128,32x64] [--out packed.json]`.
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


def measure(shapes: list, tiles: list[str], device_name: str, repeats: int) -> list[dict]:
    import torch

    from specdec_cli.kernels.triton_gemm import TILES_VARIABLE, PackedGemm

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
        for tile in tiles:
            os.environ[TILES_VARIABLE] = tile  # read as the GEMM is made
            gemm = PackedGemm(matrix)
            seconds = timed(gemm, (x,), device, repeats)
            difference = float((gemm(x) - want).abs().max() / want.abs().max())
            row["tiles"][tile] = {"tiling": list(gemm.tiling), "us": round(seconds * 1e6, 1),
                                  "gb_s": round(matrix.nbytes / seconds / 1e9, 1),
                                  "over_dense": round(dense_seconds / seconds, 3),
                                  "max_relative_difference": difference}
        os.environ.pop(TILES_VARIABLE, None)
        row["best_tiles"] = min(row["tiles"], key=lambda tile: row["tiles"][tile]["us"])
        results.append(row)
        print(json.dumps({key: value for key, value in row.items() if key != "tiles"}), flush=True)
        del matrix
    return results


def fastest(results: list[dict]) -> Optional[str]:
    """The setting whose matrices took the least time together (the 8B's layer, each matrix once)."""
    settings = set.intersection(*(set(row["tiles"]) for row in results)) if results else set()
    return min(settings, key=lambda tile: sum(row["tiles"][tile]["us"] for row in results), default=None)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cuda (default), or cpu (the default with --dry-run)")
    parser.add_argument("--tiles", default=None, help=f"NxK tile sizes to time, comma-separated (default {TILES})")
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
    results = measure(SHAPES_DRY if args.dry_run else SHAPES_8B, tiles, device,
                      args.repeats or (2 if args.dry_run else 20))
    document = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (Triton's interpreter)",
                "torch": torch.__version__, "rows": ROWS, "results": results, "fastest": fastest(results)}
    text = json.dumps(document, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
