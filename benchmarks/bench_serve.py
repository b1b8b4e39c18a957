"""`specdec serve` against llama.cpp's `llama-server`, both driven the same way: the `openai` client, streaming chat
completions, one request at a time, greedy, the same GGUF, threads and prompts.

For each server it starts (a free port of 127.0.0.1, always stopped at the end, on an error and on Ctrl-C):

- `specdec serve -m FILE --drafter D --threads N` (this checkout's, `python -m specdec_cli`; one row per
  `--drafters` entry, `none` being specdec's decoding without a drafter, and `plain` the same server asked for
  `speculative.n_max: 0` on every request: no draft at all, not even the tokens a grammar forces);
- `llama-server -m FILE -t N -np 1` when it is on PATH or given as `--llama-server PATH` (skipped in one line
  otherwise).

Per request it records the time to the first streamed text (TTFT), the whole request's time, the completion tokens
(`stream_options.include_usage`), tokens/s with the prompt (tokens / whole time) and without it (tokens after the
first / time after the first), and the inter-token latency (mean gap between streamed pieces per token after the
first). With `--turns K > 1` each prompt opens a conversation resent whole every turn (the previous answers in it,
then "Go on."), so the prompt cache's effect on TTFT shows from the second turn; `--think S` waits S seconds before
each later turn, as a person reading and writing does (the server idle meanwhile). Answers are compared across
servers turn by turn: how many are identical to the first row's (specdec's answers are identical to each other
by construction; llama-server's round differently and may differ).

With `--json-schema FILE` (or `builtin`: a person's record) every server answers each prompt twice, free and under
that schema (`response_format` json_schema, which llama-server takes too): the rows `NAME +schema` beside `NAME`, and
the summary's ITL ratio is what the grammar costs a token.

Prompts: `--prompts FILE` (.jsonl with a `turns` list, as Spec-Bench's question.jsonl, or a `prompt`/`text`
field; one text per line for .txt), else a few built in; `--limit N` keeps the first N. One warm-up request per
server is not counted. Output: a table per server and request, then the means; `--json-out FILE` writes it all.

With `--clients N` the prompts are asked by N streaming clients at once (each takes the next prompt not yet
asked), one turn each: the summary's tokens/s is then the total over the wall time of all of them, and TTFT the
median. `--parallel 1,4` starts each specdec row once per value (`specdec serve --parallel P`, rows `NAME -npP`),
and `--llama-parallel N` gives llama-server `-np N` (its slots).

With `--interleave` every server is started at once (each idle while another answers) and each prompt goes to
every row in turn, `--rounds R` times (the order rotated each round), so a host whose speed drifts weighs on all rows
alike; the summary adds, per row, the median over (round, prompt) pairs of the server's own decoding speed (its
`timings`) against the first row's (`NAME +schema` rows: against the first `+schema` row, and what the schema costs
against the same server's free answer). With `--rounds` over 1 it also gives round 0's median alone: a drafter that
keeps what its server answered (ADED's table, `sam`'s memory: this benchmark starts servers `--no-memory`) drafts a
repeated prompt's answer from its own answer of the round before (and a `+schema` answer from the free answer to
the same prompt just before it), which later rounds count as speed.

Run: `python benchmarks/bench_serve.py [--target FILE.gguf] [--threads 2] [--drafters none,sam] [-n 128]`.
Not a test: nothing here is run in CI, and it takes minutes on a small machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
BUILT_IN = [
    "Explain in three sentences how a hash table works.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Correct the grammar: 'Me and him goes to the store yesterday, and we buyed three apple.'",
    "List five uses of a suffix automaton, one line each.",
]
START_SECONDS = 300.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def read_prompts(path: Optional[str], limit: Optional[int]) -> list[str]:
    if path is None:
        prompts = list(BUILT_IN)
    elif path.endswith(".jsonl"):
        prompts = []
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            turns = row.get("turns")
            prompts.append(turns[0] if isinstance(turns, list) and turns else row.get("prompt") or row.get("text"))
    else:
        prompts = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    prompts = [prompt for prompt in prompts if isinstance(prompt, str) and prompt.strip()]
    return prompts[:limit] if limit else prompts


def default_gguf() -> str:
    sys.path.insert(0, str(ROOT))
    from specdec_cli.target_model.load.target_source import default_gguf_path

    return str(default_gguf_path())


class Started:
    """A server process on a free port, stopped whatever happens."""

    def __init__(self, name: str, command: list[str], port: int, env: Optional[dict] = None):
        self.name, self.port = name, port
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"bench-serve-{name.replace(':', '-')}-", suffix=".log",
                                               delete=False)
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
        self._wait()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _wait(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}: see {self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as response:
                    if response.status == 200 and json.loads(response.read() or b"{}").get("status") == "ok":
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not become healthy in {START_SECONDS:.0f} s: see {self.log.name}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()
        os.unlink(self.log.name)


BUILTIN_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
    "languages": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4},
    "city": {"type": "string", "maxLength": 30}}, "required": ["name", "age", "languages", "city"],
    "additionalProperties": False}


def one_request(client: Any, messages: list[dict], max_tokens: int, schema: Optional[dict] = None,
                plain: bool = False) -> dict:
    """One streamed chat completion (under `schema` when given; `plain`: no drafts, speculative.n_max 0): its text
    and times."""
    started = time.perf_counter()
    first = None
    arrivals = []
    pieces = []
    usage = None
    extra = {} if schema is None else {"response_format": {"type": "json_schema", "json_schema": {
        "name": "record", "schema": schema}}}
    if plain:
        extra["extra_body"] = {"speculative": {"n_max": 0}}
    stream = client.chat.completions.create(model="bench", messages=messages, max_tokens=max_tokens,
                                            temperature=0.0, stream=True, stream_options={"include_usage": True},
                                            **extra)
    timings: dict = {}
    for chunk in stream:
        timings = (chunk.model_extra or {}).get("timings") or timings  # the server's own, on the last chunks
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            now = time.perf_counter()
            first = now if first is None else first
            arrivals.append(now)
            pieces.append(chunk.choices[0].delta.content)
    wall = time.perf_counter() - started
    tokens = usage.completion_tokens if usage is not None else len(pieces)
    ttft = (first - started) if first is not None else wall
    after = wall - ttft
    return {"text": "".join(pieces), "tokens": tokens, "prompt_tokens": getattr(usage, "prompt_tokens", None),
            "cached_tokens": getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", None),
            "wall_s": wall, "ttft_s": ttft, "tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "decode_tokens_per_s": (tokens - 1) / after if after > 0 and tokens > 1 else 0.0,
            "itl_ms": 1000.0 * after / (tokens - 1) if tokens > 1 else 0.0,
            "server_ms_per_token": timings.get("predicted_per_token_ms")}  # its decoding alone, without HTTP


def run_server(name: str, server: Started, prompts: list[str], turns: int, max_tokens: int,
               schema: Optional[dict] = None, think: float = 0.0) -> list[dict]:
    import openai

    client = openai.OpenAI(base_url=server.base_url, api_key="bench", max_retries=0, timeout=3600)
    plain = name.startswith("specdec serve plain")
    one_request(client, [{"role": "user", "content": "Say hello."}], 8, schema, plain)  # warm-up, not counted
    rows = []
    for index, prompt in enumerate(prompts):
        messages = [{"role": "user", "content": prompt}]
        for turn in range(turns):
            result = one_request(client, messages, max_tokens, schema, plain)
            rows.append({"server": name, "prompt": index, "turn": turn, **result})
            print(f"{name:>24} prompt {index} turn {turn}: {result['tokens']:4d} tokens  "
                  f"{result['tokens_per_s']:7.1f} tok/s  TTFT {1000 * result['ttft_s']:7.1f} ms  "
                  f"ITL {result['itl_ms']:6.1f} ms  cached {result['cached_tokens']}", flush=True)
            messages = messages + [{"role": "assistant", "content": result["text"]},
                                   {"role": "user", "content": "Go on."}]
            if turn + 1 < turns:
                time.sleep(think)
    return rows


def run_clients(name: str, server: "Started", prompts: list[str], clients: int, max_tokens: int,
                schema: Optional[dict] = None) -> tuple[list[dict], float]:
    """`clients` streaming clients at once, each asking the next prompt not yet asked until none is left: the rows
    (in prompt order) and the wall time of them all."""
    import queue
    import threading

    import openai

    def client() -> Any:
        return openai.OpenAI(base_url=server.base_url, api_key="bench", max_retries=0, timeout=3600)

    plain = name.startswith("specdec serve plain")
    one_request(client(), [{"role": "user", "content": "Say hello."}], 8, schema, plain)  # warm-up, not counted
    todo: queue.Queue = queue.Queue()
    for item in enumerate(prompts):
        todo.put(item)
    rows: list[dict] = []

    def ask() -> None:
        mine = client()
        while True:
            try:
                index, prompt = todo.get_nowait()
            except queue.Empty:
                return
            result = one_request(mine, [{"role": "user", "content": prompt}], max_tokens, schema, plain)
            rows.append({"server": name, "prompt": index, "turn": 0, **result})
            print(f"{name:>24} prompt {index}: {result['tokens']:4d} tokens  TTFT {1000 * result['ttft_s']:7.1f} ms"
                  f"  ITL {result['itl_ms']:6.1f} ms", flush=True)

    started = time.perf_counter()
    threads = [threading.Thread(target=ask) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(rows, key=lambda row: row["prompt"]), time.perf_counter() - started


def run_interleaved(rows_of: list[tuple[str, "Started", bool]], prompts: list[str], rounds: int, max_tokens: int,
                    schema: Optional[dict]) -> list[dict]:
    """Each prompt asked of every (row name, server, under the schema) in turn, `rounds` times, the order rotated
    each round; the rows in (round, prompt) order for every row name."""
    import openai

    clients = {}
    for _, server, _ in rows_of:
        if server.name not in clients:
            clients[server.name] = openai.OpenAI(base_url=server.base_url, api_key="bench", max_retries=0,
                                                 timeout=3600)
            one_request(clients[server.name], [{"role": "user", "content": "Say hello."}], 8)  # warm-up
    rows = []
    for round_index in range(rounds):
        for index, prompt in enumerate(prompts):
            shift = (round_index + index) % len(rows_of)
            for name, server, schematic in rows_of[shift:] + rows_of[:shift]:
                result = one_request(clients[server.name], [{"role": "user", "content": prompt}], max_tokens,
                                     schema if schematic else None, name.startswith("specdec serve plain"))
                rows.append({"server": name, "prompt": index, "turn": 0, "round": round_index, **result})
                print(f"{name:>24} round {round_index} prompt {index}: {result['tokens']:4d} tokens  "
                      f"{result['tokens_per_s']:7.1f} tok/s  server {result['server_ms_per_token'] or 0:.2f} ms/token",
                      flush=True)
    order = {name: position for position, (name, _, _) in enumerate(rows_of)}
    return sorted(rows, key=lambda row: (order[row["server"]], row["round"], row["prompt"]))


def paired_speed(rows: list[dict], name: str, reference: str, first_round: bool = False) -> Optional[float]:
    """Median over (round, prompt) pairs of the reference row's server time a token over this row's: above 1, this
    row decodes faster (None without pairs). `first_round`: round 0's pairs alone, before any server had answered
    the prompt: a drafter that keeps what its server answered (ADED's table, `sam`'s memory) drafts a repeated
    prompt's answer from its own earlier one in later rounds."""
    chosen = [row for row in rows if not first_round or row["round"] == 0]
    times = {(row["round"], row["prompt"]): row["server_ms_per_token"] for row in chosen
             if row["server"] == reference and row.get("server_ms_per_token")}
    ratios = [times[(row["round"], row["prompt"])] / row["server_ms_per_token"] for row in chosen
              if row["server"] == name and row.get("server_ms_per_token") and (row["round"], row["prompt"]) in times]
    return statistics.median(ratios) if ratios else None


def _mean(values: list) -> Optional[float]:
    known = [value for value in values if value is not None]
    return sum(known) / len(known) if known else None


def summary(rows: list[dict], names: list[str], walls: Optional[dict] = None) -> list[dict]:
    """Per server: tokens/s (with `walls`, clients at once: all tokens over the wall time of them all), TTFT,
    ITL, and how many answers equal the first row's."""
    table = []
    for name in names:
        schema = name.endswith(" +schema")  # compared with the first row answering as it does (free or under it)
        first = [row for row in rows if row["server"] == next(n for n in names if n.endswith(" +schema") == schema)]
        mine = [row for row in rows if row["server"] == name]
        if not mine:
            continue
        tokens = sum(row["tokens"] for row in mine)
        wall = walls[name] if walls and name in walls else sum(row["wall_s"] for row in mine)
        same = sum(a["text"] == b["text"] for a, b in zip(first, mine))
        opening = [row["ttft_s"] for row in mine if row["turn"] == 0]
        later = [row["ttft_s"] for row in mine if row["turn"] > 0]
        table.append({"server": name, "requests": len(mine), "tokens_per_s": tokens / wall if wall else 0.0,
                      "ttft_ms": 1000 * sum(row["ttft_s"] for row in mine) / len(mine),
                      "ttft_median_ms": 1000 * sorted(row["ttft_s"] for row in mine)[len(mine) // 2],
                      "ttft_first_turn_ms": 1000 * sum(opening) / len(opening) if opening else None,
                      "ttft_later_turns_ms": 1000 * sum(later) / len(later) if later else None,
                      "ttft_later_over_first_median": statistics.median(later) / statistics.median(opening)
                      if later and opening else None,  # (medians: a rare pause of the host weighs on neither)
                      "itl_ms": sum(row["itl_ms"] for row in mine) / len(mine),
                      "server_ms_per_token": _mean([row["server_ms_per_token"] for row in mine]),
                      "identical_to_first_row": f"{same}/{len(mine)}"})
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", "-m", help="a GGUF file (default: the default model's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drafters", default="none,sam", help="specdec rows, comma-separated")
    parser.add_argument("--llama-server", help="llama-server binary (default: on PATH); none: no llama-server row")
    parser.add_argument("--prompts")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--turns", type=int, default=1)
    parser.add_argument("--think", type=float, default=0.0, help="seconds before each later turn (a person's)")
    parser.add_argument("--max-tokens", "-n", type=int, default=128)
    parser.add_argument("--json-schema", help="a JSON schema file, or builtin: each prompt again under it")
    parser.add_argument("--clients", type=int, default=1, help="streaming clients asking at once (one turn each)")
    parser.add_argument("--parallel", default="1", help="specdec serve --parallel values, comma-separated: a row each")
    parser.add_argument("--llama-parallel", type=int, default=1, help="llama-server's -np (slots)")
    parser.add_argument("--interleave", action="store_true",
                        help="start every server at once and ask each prompt of every row in turn")
    parser.add_argument("--rounds", type=int, default=1, help="--interleave: passes over the prompts")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    if args.interleave and (args.clients > 1 or args.turns > 1):
        parser.error("--interleave asks one prompt at a time, one turn each: no --clients or --turns")
    schema = None
    if args.json_schema:
        schema = BUILTIN_SCHEMA if args.json_schema == "builtin" else json.loads(Path(args.json_schema).read_text())
    gguf = args.target or default_gguf()
    prompts = read_prompts(args.prompts, args.limit)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "SPECDEC_NO_MEMORY": "1"}  # a measurement neither reads nor feeds the answer memory
    plans = []
    parallels = [int(value) for value in args.parallel.split(",") if value.strip()]
    for drafter in [name.strip() for name in args.drafters.split(",") if name.strip()]:
        for parallel in parallels:
            port = free_port()
            suffix = f" -np{parallel}" if len(parallels) > 1 or parallel > 1 else ""
            plans.append((f"specdec serve {drafter}{suffix}", [
                sys.executable, "-m", "specdec_cli", "serve", "-m", gguf, "--drafter",
                "none" if drafter == "plain" else drafter, "--threads", str(args.threads), "--port", str(port),
                "--no-memory", "--parallel", str(parallel)], port, env))
    binary = args.llama_server or shutil.which("llama-server") or (
        str(ROOT / ".venv/bin/llama-server") if (ROOT / ".venv/bin/llama-server").is_file() else None)
    if binary == "none":
        pass
    elif binary:
        port = free_port()
        slots = args.llama_parallel
        plans.append(("llama-server" + (f" -np{slots}" if slots > 1 else ""), [
            binary, "-m", gguf, "-t", str(args.threads), "-np", str(slots), "--host", "127.0.0.1", "--port",
            str(port), "-c", str(8192 * slots)], port, None))
    else:
        print("llama-server: not on PATH (give --llama-server PATH): its row is skipped", file=sys.stderr)
    rows: list[dict] = []
    names = []
    walls: dict = {}
    if args.interleave:
        started: list[Started] = []
        try:
            for name, command, port, run_env in plans:
                started.append(Started(name, command, port, run_env))
            rows_of = [(server.name, server, False) for server in started]
            if schema is not None:
                rows_of += [(f"{server.name} +schema", server, True) for server in started]
            names = [name for name, _, _ in rows_of]
            rows = run_interleaved(rows_of, prompts, args.rounds, args.max_tokens, schema)
        finally:
            for server in started:
                server.stop()
        plans = []
    for name, command, port, run_env in plans:  # one server at a time: they would share the cores
        server = Started(name, command, port, run_env)
        try:
            names.append(name)
            if args.clients > 1:
                mine, walls[name] = run_clients(name, server, prompts, args.clients, args.max_tokens)
                rows += mine
                continue
            rows += run_server(name, server, prompts, args.turns, args.max_tokens, think=args.think)
            if schema is not None:
                names.append(f"{name} +schema")
                rows += run_server(f"{name} +schema", server, prompts, args.turns, args.max_tokens, schema, args.think)
        finally:
            server.stop()
    table = summary(rows, names, walls)
    print()
    for line in table:
        later = line["ttft_later_turns_ms"]
        print(f"{line['server']:>24}: {line['tokens_per_s']:7.1f} tok/s  TTFT {line['ttft_ms']:7.1f} ms"
              + (f" (median {line['ttft_median_ms']:.1f})" if args.clients > 1 else "")
              + (f" (turn 1 {line['ttft_first_turn_ms']:.1f}, later {later:.1f}; medians' ratio "
                 f"{line['ttft_later_over_first_median']:.2f})" if later is not None else "")
              + f"  ITL {line['itl_ms']:6.1f} ms"
              + (f" (server {line['server_ms_per_token']:.2f} ms/token)" if line["server_ms_per_token"] else "")
              + f"  identical {line['identical_to_first_row']}")
    if args.interleave:
        print()
        free = [name for name in names if not name.endswith(" +schema")]
        constrained = [name for name in names if name.endswith(" +schema")]
        for group in (free, constrained):
            for name in group:
                speed = paired_speed(rows, name, group[0])
                first = paired_speed(rows, name, group[0], first_round=True) if args.rounds > 1 else None
                cost = paired_speed(rows, name[: -len(" +schema")], name) if name in constrained else None
                line = next(line for line in table if line["server"] == name)
                line["paired_speed"], line["paired_speed_first_round"], line["schema_cost"] = speed, first, cost
                print(f"{name:>24}: {speed or 0:.3f}x {group[0]}'s decoding speed (median of pairs"
                      + (f"; first round alone {first:.3f}x" if first else "") + ")"
                      + (f"; the schema costs {cost:.3f}x a free answer's time a token" if cost else ""))
    if args.json_out:
        payload = {"target": gguf, "threads": args.threads, "max_tokens": args.max_tokens, "turns": args.turns,
                   "interleave": args.interleave, "rounds": args.rounds,
                   "clients": args.clients, "parallel": parallels, "llama_parallel": args.llama_parallel,
                   "json_schema": schema,
                   "prompts": prompts, "summary": table, "requests": rows,
                   "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
        temporary = args.json_out + ".tmp"
        Path(temporary).write_text(json.dumps(payload, indent=2), encoding="utf-8")
        os.replace(temporary, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
