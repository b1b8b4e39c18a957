"""Code completion as an editor asks for it: `specdec serve`'s `/infill`, drafted against plain decoding.

llama.vim and llama.vscode send the lines before the cursor and after it to `/infill` and show what comes back. This
benchmark makes such requests from Python source files (default: the running Python's standard library): in a
module of at least 200 lines, a line indented inside a block is picked at random, the cursor put a third of the way
into its text; the prefix is the 60 lines before it and the line up to the cursor, the suffix the next 29 lines,
`n_predict` 64 and `n_indent` the line's indentation (as llama.vim sends them), greedy (`temperature` 0: llama-server
would sample at 0.8). One server (`specdec serve -m FILE
--no-memory --parallel 1`) answers every case `--rounds` times plainly (`"speculative": {"n_max": 0}`) and drafted,
alternated, after one untimed request that puts the prompt in its cache; it reports the server's own decoding time
(`timings.predicted_ms`) of both, their ratio (summed and the median over pairs), tokens a step, and how many
answers were identical in text and tokens (all of them, or a bug). Where llama.cpp's `llama-server` is on PATH (or
`--llama-server PATH`; `none` leaves it out), the same cases go to `llama-server -m FILE -t N -np 1` too, `--rounds`
times after the same untimed request (`--llama-spec-type ngram-mod`: with its own n-gram drafts), and its decoding
time is set beside specdec's (its answers round differently: they are counted, not required, to match).

Needs a model with fill-in-the-middle tokens (the real Qwen2.5-Coder-0.5B: benchmarks/fetch_qwen_coder.py); the
default model has none. Not a test: nothing here runs in CI.

    python benchmarks/bench_infill.py -m ~/.cache/specdec/models/qwen2.5-coder-0.5b-instruct.gguf --cases 24
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import shutil
import statistics
import sys
import sysconfig
from pathlib import Path
from typing import Optional

from bench_serve import ROOT, Started, free_port

BEFORE, AFTER = 60, 29  # lines of prefix and of suffix around the cursor's line


def make_cases(folder: Path, count: int, seed: int = 1) -> list[dict]:
    """`count` /infill bodies cut from the .py files directly in `folder` (see the module's docstring)."""
    files = sorted(path for path in folder.glob("*.py") if path.is_file())
    modules = []
    for path in files:
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
        if len(lines) >= 200:
            modules.append(lines)
    if not modules:
        raise SystemExit(f"no Python module of 200 lines or more in {folder}")
    generator, cases = random.Random(seed), []
    while len(cases) < count:
        lines = generator.choice(modules)
        index = generator.randrange(BEFORE, len(lines) - AFTER - 1)
        line = lines[index]
        if not line.strip() or not line.startswith("    "):
            continue
        indent = len(line) - len(line.lstrip())
        cursor = indent + len(line.strip()) // 3
        cases.append({"input_prefix": "\n".join(lines[index - BEFORE : index]) + "\n" + line[:cursor],
                      "input_suffix": "\n" + "\n".join(lines[index + 1 : index + 1 + AFTER]),
                      "n_predict": 64, "n_indent": indent, "temperature": 0})  # (greedy: llama-server samples)
    return cases


def ask(port: int, body: dict) -> dict:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        connection.request("POST", "/infill", json.dumps(body), {"Content-Type": "application/json"})
        answer = json.loads(connection.getresponse().read())
    finally:
        connection.close()
    if "error" in answer:
        raise SystemExit(f"/infill refused: {answer['error']['message']}")
    return answer


def llama_server(args: argparse.Namespace) -> Optional[str]:
    """The llama-server binary to measure beside specdec, or None."""
    if args.llama_server == "none":
        return None
    local = ROOT / ".venv/bin/llama-server"
    return args.llama_server or shutil.which("llama-server") or (str(local) if local.is_file() else None)


def run_llama(binary: str, args: argparse.Namespace, cases: list[dict], answers: list[str]) -> dict:
    """llama-server's decoding time on the same cases (`answers`: specdec's texts, to count the same ones)."""
    port = free_port()
    command = [binary, "-m", args.target, "-t", str(args.threads), "-np", "1", "--host", "127.0.0.1", "--port",
               str(port), "-c", "8192"]
    server = Started("llama-server-infill", command + (["--spec-type", args.llama_spec_type]
                                                       if args.llama_spec_type else []), port)
    predicted_ms, same = 0.0, 0
    try:
        for case, text in zip(cases, answers):
            ask(port, case)
            for _ in range(args.rounds):
                answer = ask(port, case)
                predicted_ms += answer["timings"]["predicted_ms"]
                same += answer["content"] == text
    finally:
        server.stop()
    return {"llama_server_ms": predicted_ms, "llama_server_same": same}


def run(args: argparse.Namespace) -> dict:
    cases = make_cases(Path(args.source), args.cases, args.seed)
    port = free_port()
    server = Started("specdec-infill", [sys.executable, "-m", "specdec_cli", "serve", "-m", args.target, "--drafter",
                                        args.drafter, "--threads", str(args.threads), "--port", str(port),
                                        "--no-memory", "--parallel", "1"], port)
    plain_ms, drafted_ms, ratios, identical, tokens, steps, texts = 0.0, 0.0, [], 0, 0, 0, []
    try:
        for case in cases:
            texts.append(ask(port, case)["content"])  # untimed: the prompt goes into the cache for both
            for _ in range(args.rounds):
                plain, drafted = ask(port, {**case, "speculative": {"n_max": 0}}), ask(port, case)
                identical += (plain["content"], plain["tokens"]) == (drafted["content"], drafted["tokens"])
                plain_ms += plain["timings"]["predicted_ms"]
                drafted_ms += drafted["timings"]["predicted_ms"]
                ratios.append(plain["timings"]["predicted_ms"] / max(1e-9, drafted["timings"]["predicted_ms"]))
                tokens, steps = tokens + drafted["tokens_predicted"], steps + drafted["timings"].get("steps", 0)
    finally:
        server.stop()
    result = {"cases": len(cases), "answers": len(ratios), "identical": identical, "plain_ms": plain_ms,
              "drafted_ms": drafted_ms, "speed_over_plain": plain_ms / max(1e-9, drafted_ms),
              "median_of_pairs": statistics.median(ratios), "tokens_per_step": tokens / max(1, steps),
              "drafter": args.drafter}
    binary = llama_server(args)
    if binary is not None:
        result.update(run_llama(binary, args, cases, texts))
    elif args.llama_server != "none":
        print("llama-server: not on PATH (give --llama-server PATH): its row is skipped", file=sys.stderr)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", "-m", required=True, help="a GGUF file of a model with fill-in-the-middle tokens")
    parser.add_argument("--drafter", default="sam")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cases", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--source", default=sysconfig.get_paths()["stdlib"], help="a folder of .py files")
    parser.add_argument("--llama-server", help="llama-server binary (default: on PATH); none: no llama-server row")
    parser.add_argument("--llama-spec-type", help="llama-server's --spec-type (ngram-mod, ngram-simple, ...): its "
                        "own n-gram drafts (default: plain decoding)")
    parser.add_argument("--json-out")
    args = parser.parse_args(argv)
    result = run(args)
    print(f"{result['cases']} completions x {args.rounds}: `{args.drafter}` {result['speed_over_plain']:.2f}x plain "
          f"decoding's time (median of pairs {result['median_of_pairs']:.2f}x), {result['tokens_per_step']:.2f} "
          f"tokens a step, identical {result['identical']}/{result['answers']}")
    if "llama_server_ms" in result:
        mode = f" --spec-type {args.llama_spec_type}" if args.llama_spec_type else ""
        print(f"llama-server{mode} on the same cases: decoding {result['llama_server_ms']:.0f} ms against specdec's "
              f"{result['plain_ms']:.0f} plain and {result['drafted_ms']:.0f} drafted: `{args.drafter}` "
              f"{result['llama_server_ms'] / max(1e-9, result['drafted_ms']):.2f}x llama-server's speed; "
              f"{result['llama_server_same']}/{result['answers']} of its answers the same text as specdec's")
    if args.json_out:
        sys.path.insert(0, str(ROOT))
        from specdec_cli.files import write_json_atomic

        write_json_atomic(Path(args.json_out), result)
    return 0 if result["identical"] == result["answers"] else 1


if __name__ == "__main__":
    sys.exit(main())
