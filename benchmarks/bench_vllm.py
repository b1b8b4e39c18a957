"""vLLM plain decoding against vLLM's `ngram` and specdec's proposers: speed, acceptance and identity.

Run it in the vLLM environment (`make install-vllm`):

    .venv-vllm/bin/python benchmarks/bench_vllm.py --methods plain,ngram,sam,pld \\
        --prompts ../shared/datasets/spec_bench/question.jsonl --per-category 1 -n 64

Each method runs in its own process (vLLM's engine starts with spawn, one `LLM` per process): the prompts one
request at a time ("single"), then all together ("concurrent"), greedy, float32 by default. It prints one row
per method: tokens/s of both, acceptance from vLLM's counters, and how many outputs equal vLLM plain's. It
measures and asserts nothing; docs/vllm.md holds a run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NGRAM = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def run_method(args: argparse.Namespace) -> None:
    """The child: one method over the prompts, written as JSON to args.out."""
    from vllm import LLM, SamplingParams

    spec = None
    if args.method == "ngram":
        spec = dict(NGRAM, num_speculative_tokens=args.draft_max)
    elif args.method != "plain":
        from specdec_cli.vllm_proposer import proposer_path

        spec = {"method": "custom_class", "model": proposer_path(args.method), "num_speculative_tokens": args.draft_max}
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=4096, enforce_eager=True, seed=0,
              gpu_memory_utilization=args.memory_fraction, disable_log_stats=False, speculative_config=spec)
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True) for text in json.loads(args.texts)]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)  # warm-up
    started = time.perf_counter()
    single = [list(llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids) for prompt in prompts]
    single_seconds = time.perf_counter() - started
    started = time.perf_counter()
    together = [list(out.outputs[0].token_ids) for out in llm.generate(prompts, params, use_tqdm=False)]
    concurrent_seconds = time.perf_counter() - started
    counters = {metric.name: metric.value for metric in llm.get_metrics()
                if "spec_decode" in metric.name and hasattr(metric, "value")}
    Path(args.out).write_text(json.dumps({"single": single, "concurrent": together, "single_seconds": single_seconds,
                                          "concurrent_seconds": concurrent_seconds, "counters": counters}))


def load_texts(path: str, per_category: int) -> list[str]:
    taken: dict[str, int] = {}
    texts = []
    for line in Path(path).expanduser().read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        category = row.get("category", "prompts")
        if taken.get(category, 0) < per_category:
            taken[category] = taken.get(category, 0) + 1
            texts.append(row["turns"][0] if "turns" in row else row["prompt"])
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="plain,ngram,sam,pld")
    parser.add_argument("--prompts",
                        default=str(Path(__file__).parents[2] / "shared/datasets/spec_bench/question.jsonl"))
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("-n", "--max-tokens", type=int, default=64)
    parser.add_argument("--draft-max", type=int, default=8)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--memory-fraction", type=float, default=0.3)
    parser.add_argument("--target", default="default")
    parser.add_argument("--method", help=argparse.SUPPRESS)  # the child's
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--texts", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.method:
        run_method(args)
        return
    from specdec_cli.models import model_location, resolve_target

    model = model_location(resolve_target(args.target))
    texts = json.dumps(load_texts(args.prompts, args.per_category))
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for method in args.methods.split(","):
            out = Path(folder) / f"{method}.json"
            subprocess.run([sys.executable, __file__, "--method", method, "--model", model, "--texts", texts,
                            "--out", str(out), "-n", str(args.max_tokens), "--draft-max", str(args.draft_max),
                            "--dtype", args.dtype, "--memory-fraction", str(args.memory_fraction)], check=True)
            results[method] = json.loads(out.read_text())
    plain = results.get("plain")
    print(f"{'method':>8} {'single tok/s':>13} {'concurrent tok/s':>17} {'acceptance':>11} {'identical':>10}")
    for method, result in results.items():
        tokens = sum(len(answer) for answer in result["single"])
        drafted = result["counters"].get("vllm:spec_decode_num_draft_tokens", 0)
        accepted = result["counters"].get("vllm:spec_decode_num_accepted_tokens", 0)
        same = "-" if plain is None else (f"{sum(a == b for a, b in zip(result['single'], plain['single']))}/"
                                          f"{sum(a == b for a, b in zip(result['concurrent'], plain['concurrent']))}")
        print(f"{method:>8} {tokens / result['single_seconds']:>13.1f} "
              f"{sum(len(a) for a in result['concurrent']) / result['concurrent_seconds']:>17.1f} "
              f"{(accepted / drafted if drafted else 0):>11.0%} {same:>10}")


if __name__ == "__main__":
    main()
