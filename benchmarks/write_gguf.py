"""Synthetic GGUF files for the bench: random weights in llama.cpp's Q4_K_M (or IQ4_XS) recipe, a real tokenizer.

Shapes (the tokenizer, and so the vocabulary, is SmolLM2's, taken from the default model's GGUF metadata):

- `llama-1b`: Llama-3.2-1B's shape (hidden 2048, 16 layers, FFN 8192, 32 query / 8 key-value heads of 64, tied
  embeddings), arch `llama`;
- `llama-8b`: Llama-3-8B's shape (hidden 4096, 32 layers, FFN 14336, 32 query / 8 key-value heads of 128, rope
  theta 500000, context 8192, an untied output matrix `output.weight`), arch `llama`: 7.38 B weights with this
  vocabulary (8.03 B with Llama-3's own), 4.16 GiB;
- `qwen2-1.5b`: Qwen2.5-1.5B's shape (hidden 1536, 28 layers, FFN 8960, 12 query / 2 key-value heads of 128, q/k/v
  biases, rope theta 1000000, tied embeddings), arch `qwen2`: every row a multiple of 256, so nearly all K-quants
  (the real 1.5B's Q4_K_M recipe), 1.0 GiB with this vocabulary;
- `smollm2-135m`: the default model's shape (hidden 576, 30 layers, FFN 1536, 9 query / 3 key-value heads of 64,
  rope theta 100000, tied embeddings), arch `llama`: every row of 576 takes the legacy fallbacks (Q5_0/Q8_0);
- `tiny`: hidden 256, 2 layers, FFN 512, 4 query / 2 key-value heads of 64, tied (K-quants only: written in a
  second), for dry runs (benchmarks/gpu_check.sh --dry-run);
- `gemma3-270m`: Gemma-3-270M-like (hidden 640, 18 layers, FFN 2048, 4 query / 1 key-value heads of 256,
  sliding window 512, tied embeddings), arch `gemma3` with its metadata keys and norms.

The recipe (docs/algorithms.md section 10): Q4_K for most matrices; Q6_K for `attn_v` and `ffn_down` in the
"more bits" layers (the first and last eighth of the layers and every third in between, as llama.cpp's
`use_more_bits`) and for the output matrix (`output.weight` where the shape has one, its embedding `token_embd`
then Q4_K; in the tied shapes `token_embd` plays the output matrix and takes Q6_K, as llama.cpp quantises it then);
where a row's length is not a multiple of 256, the legacy fallbacks Q5_0 (for Q4_K) and Q8_0 (for Q6_K). So
gemma3-270m's rows of 640 take Q5_0/Q8_0 and only its 1024- and 2048-long rows (attn_output, ffn_down) stay K-quants.
`--recipe iq4_xs`: IQ4_XS for every matrix but the output one (Q6_K, as above), IQ4_NL where a row is not a
multiple of 256 (llama.cpp's IQ4_XS files, as their type choice falls back).

K-quant and IQ4 blocks are random bytes with f16 scales chosen so that a weight's standard deviation is about --std
(0.02 by default; Q4_K's minimum centres the weights on zero); Q5_0/Q8_0 blocks quantise Gaussian weights with
`gguf.quants.quantize`. Norm weights are ones. The file is streamed: every tensor's name, shape and type go
to the header first, then each tensor is made and written one at a time and dropped, so memory holds one tensor,
never the file (llama-8b: 4.16 GiB written in about 35 s here, a peak RSS of 266 MB while writing and 396 MB with
the read-back check). The same seed gives the same bytes. The file is written atomically (a temporary file, then
a rename), is marked as written here (`specdec.synthetic`), and a file not so marked is not overwritten without
--force. After writing, `gguf.GGUFReader` reads it back and the tensor types are checked against the recipe;
--check-transformers also loads it with transformers (`AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`)
and runs a forward.

Run: `python benchmarks/write_gguf.py --shape llama-1b -o llama-1b-Q4_K_M.gguf [--seed 0] [--check-transformers]`.
`--tokenizer-only -o tok.gguf` writes a GGUF of the tokenizer's metadata alone (no tensors: a few MB), which a
machine without the default model (a GPU machine, where at most 64 MiB travels) passes as --tokenizer-from.
Not a test: nothing here is run in CI.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MARKER = "specdec.synthetic"  # a GGUF key naming how the file was made; files without it are not overwritten
QK_K = 256
FILE_TYPE_Q4_K_M = 15  # llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M
FILE_TYPE_IQ4_XS = 30  # LLAMA_FTYPE_MOSTLY_IQ4_XS
RECIPES = {"q4_k_m": ("Q4_K_M", FILE_TYPE_Q4_K_M), "iq4_xs": ("IQ4_XS", FILE_TYPE_IQ4_XS)}


@dataclass(frozen=True)
class Shape:
    arch: str  # "llama" | "qwen2" | "gemma3"
    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    context: int
    rope_theta: float
    rms_eps: float
    sliding_window: Optional[int] = None
    tied: bool = True  # the embedding is the output matrix; False: a separate `output.weight`


SHAPES = {
    "llama-1b": Shape("llama", 2048, 16, 8192, 32, 8, 64, 131072, 500000.0, 1e-5),
    "llama-8b": Shape("llama", 4096, 32, 14336, 32, 8, 128, 8192, 500000.0, 1e-5, tied=False),
    "qwen2-1.5b": Shape("qwen2", 1536, 28, 8960, 12, 2, 128, 32768, 1000000.0, 1e-6),
    "smollm2-135m": Shape("llama", 576, 30, 1536, 9, 3, 64, 8192, 100000.0, 1e-5),
    "tiny": Shape("llama", 256, 2, 512, 4, 2, 64, 4096, 10000.0, 1e-5),
    "gemma3-270m": Shape("gemma3", 640, 18, 2048, 4, 1, 256, 32768, 1000000.0, 1e-6, sliding_window=512),
}


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers, and every third in between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def recipe_type(name: str, row: int, layer: Optional[int], layers: int, tied: bool = True,
                recipe: str = "q4_k_m") -> Any:
    """The recipe's type of one tensor (row = its row length, the number of columns; tied = no `output.weight`,
    the embedding plays the output matrix, as llama.cpp then quantises it)."""
    from gguf import GGMLQuantizationType as Q

    if name.endswith("norm.weight") or name.endswith(".bias"):
        return Q.F32
    is_output = name == "output.weight" or (name == "token_embd.weight" and tied)
    if recipe == "iq4_xs":
        if is_output:
            return Q.Q6_K if row % QK_K == 0 else Q.Q8_0
        return Q.IQ4_NL if row % QK_K else Q.IQ4_XS
    if is_output:
        wanted = Q.Q6_K
    elif layer is not None and (".attn_v." in name or ".ffn_down." in name) and more_bits(layer, layers):
        wanted = Q.Q6_K
    else:
        wanted = Q.Q4_K
    if row % QK_K:
        return Q.Q8_0 if wanted == Q.Q6_K else Q.Q5_0
    return wanted


def tensor_plan(shape: Shape, vocab: int) -> list[tuple[str, tuple[int, int], Optional[int]]]:
    """(name, (rows, row length), layer) for every tensor, in llama.cpp's naming."""
    q_width, kv_width = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    plan: list[tuple[str, tuple[int, int], Optional[int]]] = [("token_embd.weight", (vocab, shape.hidden), None)]
    for layer in range(shape.layers):
        block = f"blk.{layer}"
        plan += [
            (f"{block}.attn_norm.weight", (1, shape.hidden), layer),
            (f"{block}.attn_q.weight", (q_width, shape.hidden), layer),
            (f"{block}.attn_k.weight", (kv_width, shape.hidden), layer),
            (f"{block}.attn_v.weight", (kv_width, shape.hidden), layer),
            *([(f"{block}.attn_q.bias", (1, q_width), layer), (f"{block}.attn_k.bias", (1, kv_width), layer),
               (f"{block}.attn_v.bias", (1, kv_width), layer)] if shape.arch == "qwen2" else []),
            (f"{block}.attn_output.weight", (shape.hidden, q_width), layer),
            (f"{block}.ffn_norm.weight", (1, shape.hidden), layer),
            (f"{block}.ffn_gate.weight", (shape.ffn, shape.hidden), layer),
            (f"{block}.ffn_up.weight", (shape.ffn, shape.hidden), layer),
            (f"{block}.ffn_down.weight", (shape.hidden, shape.ffn), layer),
        ]
        if shape.arch == "gemma3":
            plan += [
                (f"{block}.attn_q_norm.weight", (1, shape.head_dim), layer),
                (f"{block}.attn_k_norm.weight", (1, shape.head_dim), layer),
                (f"{block}.post_attention_norm.weight", (1, shape.hidden), layer),
                (f"{block}.post_ffw_norm.weight", (1, shape.hidden), layer),
            ]
    plan.append(("output_norm.weight", (1, shape.hidden), None))
    if not shape.tied:
        plan.append(("output.weight", (vocab, shape.hidden), None))
    return plan


# ------------------------------------------------------------------------------------------------ blocks


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(*values.shape, 2)


def q4_k_blocks(rng: np.random.Generator, rows: int, row: int, std: float) -> np.ndarray:
    """Random Q4_K super-blocks (f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles):
    w = d * scale * q - dmin * min, with dmin = 7.5 d so the weights centre on zero; std(w) is about 258 d."""
    blocks = rows * row // QK_K
    raw = rng.integers(0, 256, size=(blocks, 144), dtype=np.uint8)
    d = (std / 258.0) * rng.uniform(0.75, 1.25, size=blocks)
    raw[:, 0:2] = _f16_bytes(d)
    raw[:, 2:4] = _f16_bytes(7.5 * d)
    return raw.reshape(rows, row // QK_K * 144)


def q6_k_blocks(rng: np.random.Generator, rows: int, row: int, std: float) -> np.ndarray:
    """Random Q6_K super-blocks (128 bytes of low nibbles, 64 of high bits, 16 int8 scales, f16 d):
    w = d * scale * (q - 32), scales drawn from [-64, 63] so std(w) is about 682 d."""
    blocks = rows * row // QK_K
    raw = rng.integers(0, 256, size=(blocks, 210), dtype=np.uint8)
    raw[:, 192:208] = rng.integers(-64, 64, size=(blocks, 16), dtype=np.int8).view(np.uint8)
    raw[:, 208:210] = _f16_bytes((std / 682.0) * rng.uniform(0.75, 1.25, size=blocks))
    return raw.reshape(rows, row // QK_K * 210)


def iq4_blocks(rng: np.random.Generator, qtype: Any, rows: int, row: int, std: float) -> np.ndarray:
    """Random IQ4_NL blocks (f16 d, 16 bytes of nibbles: w = d * value[q], std(value) about 66) or IQ4_XS
    super-blocks (f16 d, 2 + 4 bytes of 6-bit scales ls, 128 bytes of nibbles: w = d * (ls - 32) * value[q], the
    scales drawn from 40-55 so std(w) is about 1020 d)."""
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as Q

    per, size = GGML_QUANT_SIZES[qtype]
    blocks = rows * row // per
    raw = rng.integers(0, 256, size=(blocks, size), dtype=np.uint8)
    if qtype == Q.IQ4_NL:
        raw[:, 0:2] = _f16_bytes((std / 66.0) * rng.uniform(0.75, 1.25, size=blocks))
        return raw.reshape(rows, row // per * size)
    scales = rng.integers(40, 56, size=(blocks, 8)).astype(np.uint16)
    high = np.zeros(blocks, dtype=np.uint16)
    for i in range(8):
        high |= (scales[:, i] >> 4) << (2 * i)
    raw[:, 0:2] = _f16_bytes((std / 1020.0) * rng.uniform(0.75, 1.25, size=blocks))
    raw[:, 2:4] = high.view(np.uint8).reshape(blocks, 2)
    raw[:, 4:8] = ((scales[:, 0::2] & 15) | ((scales[:, 1::2] & 15) << 4)).astype(np.uint8)
    return raw.reshape(rows, row // per * size)


def random_tensor(rng: np.random.Generator, qtype: Any, rows: int, row: int, std: float) -> np.ndarray:
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    if qtype == Q.F32:  # norm weights (biases are written as zeros by the caller)
        return np.ones(row, dtype=np.float32)
    if qtype == Q.Q4_K:
        return q4_k_blocks(rng, rows, row, std)
    if qtype == Q.Q6_K:
        return q6_k_blocks(rng, rows, row, std)
    if qtype in (Q.IQ4_NL, Q.IQ4_XS):
        return iq4_blocks(rng, qtype, rows, row, std)
    weights = (rng.standard_normal((rows, row), dtype=np.float32) * std).astype(np.float32)
    return quantize(weights, qtype)


# ------------------------------------------------------------------------------------------------ metadata


def tokenizer_fields(source: str) -> tuple[list[tuple[str, Any, Any, Any]], int]:
    """The `tokenizer.*` key-values of a GGUF as (key, value, type, sub type), and its vocabulary size."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(source)
    fields = []
    vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        main = field.types[0]
        sub = field.types[-1] if main == GGUFValueType.ARRAY else None
        value = field.contents()
        if key == "tokenizer.ggml.tokens":
            vocab = len(value)
        fields.append((key, value, main, sub))
    if not vocab:
        raise SystemExit(f"{source}: no tokenizer.ggml.tokens in its metadata")
    return fields, vocab


def default_tokenizer_gguf() -> str:
    from specdec_cli.target_model.load.target_source import default_gguf_path

    return str(default_gguf_path())


def add_metadata(writer: Any, shape: Shape, shape_name: str, vocab: int, seed: int, std: float,
                 recipe: str = "q4_k_m") -> None:
    arch = shape.arch
    label, file_type = RECIPES[recipe]
    writer.add_name(f"specdec synthetic {shape_name} {label} (random weights)")
    writer.add_type("model")
    writer.add_string(MARKER, f"benchmarks/write_gguf.py --shape {shape_name} --seed {seed} --std {std} "
                              f"--recipe {recipe}")
    writer.add_file_type(file_type)
    writer.add_quantization_version(2)
    writer.add_uint32(f"{arch}.context_length", shape.context)
    writer.add_uint32(f"{arch}.embedding_length", shape.hidden)
    writer.add_uint32(f"{arch}.block_count", shape.layers)
    writer.add_uint32(f"{arch}.feed_forward_length", shape.ffn)
    writer.add_uint32(f"{arch}.attention.head_count", shape.heads)
    writer.add_uint32(f"{arch}.attention.head_count_kv", shape.kv_heads)
    writer.add_float32(f"{arch}.rope.freq_base", shape.rope_theta)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", shape.rms_eps)
    if arch == "llama":
        writer.add_uint32(f"{arch}.vocab_size", vocab)
        writer.add_uint32(f"{arch}.rope.dimension_count", shape.head_dim)
    else:  # gemma3: explicit head sizes (256 != hidden / heads) and the local layers' window
        writer.add_uint32(f"{arch}.attention.key_length", shape.head_dim)
        writer.add_uint32(f"{arch}.attention.value_length", shape.head_dim)
        writer.add_uint32(f"{arch}.attention.sliding_window", shape.sliding_window or 512)


# ------------------------------------------------------------------------------------------------ the file


def refuse_overwrite(path: Path, force: bool) -> None:
    """A file that exists and was not written here (no MARKER key) is kept unless --force."""
    if not path.exists() or force:
        return
    try:
        from gguf import GGUFReader

        ours = MARKER in GGUFReader(str(path)).fields
    except Exception:
        ours = False
    if not ours:
        raise SystemExit(f"{path} exists and was not written by write_gguf.py; pass --force to overwrite it")


def write(path: Path, shape_name: str, seed: int, std: float, tokenizer_gguf: str, recipe: str = "q4_k_m") -> dict:
    from gguf import GGML_QUANT_SIZES, GGUFWriter
    from gguf import GGMLQuantizationType as Q

    shape = SHAPES[shape_name]
    fields, vocab = tokenizer_fields(tokenizer_gguf)
    rng = np.random.default_rng(seed)
    from specdec_cli.files import atomic_file  # a temporary beside it, synced, renamed; removed on any failure

    counts: dict[str, int] = {}
    with atomic_file(path) as temporary:
        writer = GGUFWriter(str(temporary), shape.arch)
        add_metadata(writer, shape, shape_name, vocab, seed, std, recipe)
        for key, value, main, sub in fields:
            writer.add_key_value(key, value, main, sub)
        # Streamed: every tensor's info first (name, shape, type, size), then the data one tensor at a time, each
        # made just before it is written and dropped after, so the writer holds one tensor, never the whole file.
        plan = [(name, rows, row, recipe_type(name, row, layer, shape.layers, shape.tied, recipe))
                for name, (rows, row), layer in tensor_plan(shape, vocab)]
        for name, rows, row, qtype in plan:
            if qtype == Q.F32:
                writer.add_tensor_info(name, (row,), np.dtype(np.float32), row * 4)
            else:
                block, size = GGML_QUANT_SIZES[qtype]
                writer.add_tensor_info(name, (rows, row // block * size), np.dtype(np.uint8),
                                       rows * row // block * size, raw_dtype=qtype)
            counts[qtype.name] = counts.get(qtype.name, 0) + rows * row
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for name, rows, row, qtype in plan:  # in the order of the infos, as the writer expects
            bias = name.endswith(".bias")
            data = np.zeros(row, dtype=np.float32) if bias else random_tensor(rng, qtype, rows, row, std)
            writer.write_tensor_data(data)
        writer.close()
    return counts


def write_tokenizer(path: Path, tokenizer_gguf: str) -> int:
    """A GGUF holding only the `tokenizer.*` metadata of `tokenizer_gguf` (no tensors); -> its vocabulary size."""
    from gguf import GGUFWriter

    from specdec_cli.files import atomic_file

    fields, vocab = tokenizer_fields(tokenizer_gguf)
    with atomic_file(path) as temporary:
        writer = GGUFWriter(str(temporary), "llama")
        writer.add_name("specdec tokenizer metadata (no tensors)")
        writer.add_string(MARKER, "benchmarks/write_gguf.py --tokenizer-only")
        for key, value, main, sub in fields:
            writer.add_key_value(key, value, main, sub)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        writer.close()
    return vocab


def check_read_back(path: Path, shape_name: str, recipe: str = "q4_k_m") -> dict[str, int]:
    """Read the file back with gguf.GGUFReader: every tensor present, with the recipe's type and shape."""
    from gguf import GGUFReader

    shape = SHAPES[shape_name]
    reader = GGUFReader(str(path))
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    _, vocab = tokenizer_fields(str(path))
    counts: dict[str, int] = {}
    for name, (rows, row), layer in tensor_plan(shape, vocab):
        tensor = tensors.pop(name)
        expected = recipe_type(name, row, layer, shape.layers, shape.tied, recipe)
        if tensor.tensor_type != expected:
            raise SystemExit(f"{name}: read back as {tensor.tensor_type.name}, the recipe says {expected.name}")
        logical = [int(value) for value in tensor.shape]  # GGUF lists the row length first
        if logical[0] != row or int(np.prod(logical)) != rows * row:
            raise SystemExit(f"{name}: read back with shape {logical}, expected {row} x {rows}")
        counts[expected.name] = counts.get(expected.name, 0) + rows * row
    if tensors:
        raise SystemExit(f"unexpected tensors read back: {sorted(tensors)[:5]}")
    return counts


def check_transformers(path: Path) -> str:
    """Load the file with transformers and run one forward; -> a one-line verdict."""
    try:
        import torch
        from transformers import AutoModelForCausalLM

        started = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        loaded = time.perf_counter() - started
        with torch.inference_mode():
            logits = model(torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])).logits
        finite = bool(torch.isfinite(logits).all())
        return (f"transformers: loaded as {type(model).__name__} in {loaded:.1f} s; one forward: logits "
                f"{'finite' if finite else 'NOT finite'}, std {float(logits.float().std()):.3f}")
    except Exception as error:  # reported, not raised: whether transformers reads it is what is asked
        message = " ".join(str(error).split())
        return f"transformers: cannot load it: {type(error).__name__}: {message[:300]}"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES))
    parser.add_argument("--tokenizer-only", action="store_true",
                        help="write only the tokenizer's metadata (no --shape, no tensors)")
    parser.add_argument("-o", "--out", required=True, help="the .gguf file to write")
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="q4_k_m",
                        help="llama.cpp's type mix to follow (default: q4_k_m)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--std", type=float, default=0.02, help="standard deviation of the weights (about)")
    parser.add_argument("--tokenizer-from", default=None,
                        help="a GGUF whose tokenizer.* metadata to copy (default: the default model's)")
    parser.add_argument("--force", action="store_true", help="overwrite a file not written by this script")
    parser.add_argument("--no-read-back", action="store_true", help="skip reading the file back (a dry run's time)")
    parser.add_argument("--check-transformers", action="store_true",
                        help="also load the file with transformers and run one forward")
    args = parser.parse_args(argv)
    path = Path(args.out).expanduser().resolve()
    if path.suffix.lower() != ".gguf":
        parser.error("--out must name a .gguf file")
    if not path.parent.is_dir():
        parser.error(f"no such directory: {path.parent}")
    if not 0.0 < args.std < 1.0:
        parser.error("--std must be in (0, 1)")
    refuse_overwrite(path, args.force)
    if args.tokenizer_only:
        vocab = write_tokenizer(path, args.tokenizer_from or default_tokenizer_gguf())
        print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB): tokenizer metadata, {vocab} tokens")
        return 0
    if args.shape is None:
        parser.error("--shape is required (or --tokenizer-only)")
    started = time.perf_counter()
    written = write(path, args.shape, args.seed, args.std, args.tokenizer_from or default_tokenizer_gguf(),
                    args.recipe)
    seconds = time.perf_counter() - started
    if args.no_read_back:
        print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB) in {seconds:.1f} s (not read back)")
        return 0
    counts = check_read_back(path, args.shape, args.recipe)
    assert counts == written
    total = sum(counts.values())
    mix = ", ".join(f"{name} {count / 1e6:.1f}M" for name, count in sorted(counts.items(), key=lambda item: -item[1]))
    print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB, {total / 1e6:.0f}M weights) in {seconds:.1f} s")
    print(f"read back with gguf.GGUFReader: every tensor has the recipe's type: {mix}")
    if args.check_transformers:
        print(check_transformers(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
