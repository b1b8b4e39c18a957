"""The device engine measured on a GPU (issues 48, 66), in one run: models made here, every drafter checked, the bench.

`benchmarks/gpu_check.sh` builds specdec's extension in place and runs this. Nothing is fetched: the models are
random-weight GGUF files written on the machine itself by benchmarks/write_gguf.py (the default model's shape,
`smollm2-135m`, and Llama-3-8B's, `llama-8b`, in llama.cpp's Q4_K_M recipe), with the default model's tokenizer
read from a GGUF of its metadata alone (`--tokenizer-from`: a few MB, made here with `write_gguf.py
--tokenizer-only` where the default model is installed, and carried to a machine where it is not). First
benchmarks/bench_packed.py times the packed GEMM against the dense one per matrix shape and tile size (the benches
then run at the fastest, unless SPECDEC_DEVICE_TILES is set); then each
model runs `specdec bench --device DEVICE --decoder device` with every drafter that needs no file and an oracle
row (draft length 8), whose "identical" column is the exactness check (every output token-equal to plain decoding
on the same engine): the 8B (dequantised to bfloat16, compiled: the default), its plain decoding at the file's bits
(SPECDEC_DEVICE_PACKED=1), the default shape, and last the 8B's plain decoding not compiled. Everything goes to one
folder: gpu_check.json (the goals, each bench's report with the device's bytes, the machine; rewritten after each step,
so a run cut short keeps what it measured), bench_packed.json and gpu_check.log (every command and its output).

`--dry-run` does the same on the CPU with the `tiny` shape and a few short answers (the test suite runs it):
everything but the speed. Exit status 0 when every output is identical to plain decoding's (the speed goals are
reported, not enforced); `every_drafter_identical` is null where a bench failed and nothing was compared. Before
anything is written, `--device cuda` without a GPU torch can see, and an `--out` that is not a new or empty folder
or one gpu_check wrote, are refused in one line.

Run: `benchmarks/gpu_check.sh [--dry-run] [--out DIR] [--tokenizer-from FILE]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
VENDOR = REPO / "benchmarks" / "vendor"  # pure-Python packages a machine without a registry lacks (gguf), if carried
DRAFTERS = "none,pld,sam,recycle,aded,sam+aded,sam+recycle"  # every drafter that needs no file
SPEC_BENCH = [Path(os.environ.get("SPEC_BENCH", "/nonexistent")),  # Spec-Bench's questions, where a checkout has them
              *(base / "shared" / "datasets" / "spec_bench" / "question.jsonl" for base in (REPO.parent, REPO))]


class Run:
    """What one model runs: its shape, the bench's prompts and lengths, and what it is measured against."""

    def __init__(self, name: str, shape: str, limit: int, tokens: int, goal: str, drafters: str = DRAFTERS,
                 environment: Optional[dict[str, str]] = None):
        self.name, self.shape, self.limit, self.tokens, self.goal = name, shape, limit, tokens, goal
        self.drafters, self.environment = drafters, environment or {}


FULL = [Run("llama-8b", "llama-8b", 1, 64, "weights dequantised to bfloat16 (the default), compiled: plain >= 200 "
            "tok/s; oracle-8 >= 4x plain"),
        Run("llama-8b-packed", "llama-8b", 1, 64, "at the file's bits (SPECDEC_DEVICE_PACKED=1), compiled: device "
            "memory <= 1.2x the file plus the KV cache; its speed against the dequantised weights'", drafters="none",
            environment={"SPECDEC_DEVICE_PACKED": "1"}),
        Run("default-shape", "smollm2-135m", 2, 128, "bench --limit 2, every drafter, within 120 s; best >= 3x"),
        Run("llama-8b-eager", "llama-8b", 1, 64, "dequantised, not compiled (SPECDEC_DEVICE_COMPILE=0): what "
            "compiling is measured against", drafters="none", environment={"SPECDEC_DEVICE_COMPILE": "0"})]
DRY = [Run("tiny", "tiny", 1, 12, "dry run: exactness only")]


class Log:
    def __init__(self, path: Path):
        self.file = path.open("a", encoding="utf-8")

    def say(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {text}"
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()

    def run(self, command: list[str], env: dict) -> tuple[int, float]:
        """Run a command, its output into the log (and the terminal); -> (exit status, seconds)."""
        self.say("$ " + " ".join(command))
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                   cwd=REPO)
        assert process.stdout is not None
        for line in process.stdout:
            self.file.write(line)
            sys.stdout.write(line)
        self.file.flush()
        status = process.wait()
        seconds = time.perf_counter() - started
        self.say(f"exit {status} after {seconds:.1f} s")
        return status, seconds


def machine(device: str) -> dict:
    import torch

    found: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                             "platform": platform.platform(), "cpus": os.cpu_count(), "device": device}
    if device == "cuda" and torch.cuda.is_available():
        found["gpu"] = torch.cuda.get_device_name(0)
        found["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    try:
        found["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                         text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        found["commit"] = None
    return found


def tokenizer_source(given: Optional[str]) -> str:
    if given:
        return given
    if os.environ.get("SPECDEC_TOKENIZER_GGUF"):
        return os.environ["SPECDEC_TOKENIZER_GGUF"]
    sys.path.insert(0, str(REPO))
    from specdec_cli.target_model.load.target_source import default_gguf_path

    try:
        return str(default_gguf_path())
    except Exception as error:
        raise SystemExit("no tokenizer: pass --tokenizer-from FILE (a GGUF of the default model's tokenizer, made "
                         "with `benchmarks/write_gguf.py --tokenizer-only -o FILE` where the default model is "
                         f"installed) ({error})") from None


def check_device(device: str) -> None:
    """Refuse, before anything is written, a device the bench cannot run on: cuda where torch sees no GPU (the
    models, gigabytes, were written first and every bench then failed)."""
    if device not in ("cuda", "cpu"):
        raise SystemExit(f"gpu_check: --device {device}: give cuda or cpu")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit(f"gpu_check: --device cuda, but torch {torch.__version__} sees no GPU on this machine; "
                             "run it where one is, or try --dry-run on the CPU")


OWN_FILE = "gpu_check.log"  # written first into every folder gpu_check writes: what tells its folders from others


def check_out(out: Path) -> None:
    """Refuse, before any work, an --out gpu_check may not write into: anything but a new folder, an empty one or
    one gpu_check wrote (it holds gpu_check.log, and regular files and folders only: a FIFO would hang a read)."""
    if not os.path.lexists(out):
        return
    if not out.is_dir():
        raise SystemExit(f"gpu_check: --out {out}: exists and is not a folder; give a new folder's name")
    try:
        entries = list(out.iterdir())
    except OSError as error:
        raise SystemExit(f"gpu_check: --out {out}: cannot read it ({error.strerror or error})") from None
    if entries and not (out / OWN_FILE).is_file():
        raise SystemExit(f"gpu_check: --out {out}: a folder gpu_check did not write (no {OWN_FILE}); give a new or "
                         "empty folder")
    special = next((entry for entry in entries if not entry.is_file() and not entry.is_dir()), None)
    if special is not None:
        raise SystemExit(f"gpu_check: --out {out}: {special.name} is not a regular file; remove it first")


def every_identical(verdicts: list[Optional[bool]]) -> Optional[bool]:
    """Whether every output compared was plain decoding's: False at the first that was not, None (unknown) when a
    verdict is missing or there is none, else True."""
    if any(verdict is False for verdict in verdicts):
        return False
    return True if verdicts and all(verdicts) else None


def summary(run: Run, report: dict, seconds: float) -> dict:
    """The goals' numbers from one bench report."""
    rows = {row["method"]: row for row in report.get("results", []) if row.get("category") in (None, "overall")}
    plain = rows.get("none", {})
    plain_speed = plain.get("tokens_per_second") or 0.0
    drafters = {name: {"tokens_per_second": row.get("tokens_per_second"), "speedup": row.get("speedup"),
                       "tokens_per_step": row.get("mean_accepted_tokens"),
                       "identical": f"{row.get('identical')}/{row.get('compared')}"}
                for name, row in rows.items()}
    exact = every_identical([None if not row.get("compared") else row.get("identical") == row.get("compared")
                             for name, row in rows.items() if name != "none"])
    best = max((row.get("speedup") or 0.0 for name, row in rows.items()
                if name != "none" and not name.startswith("oracle")), default=0.0)
    oracle = next((row.get("speedup") for name, row in rows.items() if name.startswith("oracle")), None)
    settings = report.get("settings", {})
    return {"goal": run.goal, "bench_seconds": round(seconds, 1), "plain_tokens_per_second": plain_speed,
            "every_drafter_identical": exact, "best_drafter_speedup": best, "oracle_8_speedup": oracle,
            "methods": drafters, "exact_check": settings.get("exact_check"),
            "device_memory": settings.get("device_memory")}


def save(out: Path, document: dict) -> None:
    """gpu_check.json, written whole each time (atomically)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from specdec_cli.files import write_json_atomic

    write_json_atomic(out / "gpu_check.json", document)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="the CPU, the tiny shape, short answers")
    parser.add_argument("--out", default=None, help="the folder for gpu_check.json, gpu_check.log and the models")
    parser.add_argument("--device", default=None, help="cuda (default), or cpu (the default with --dry-run)")
    parser.add_argument("--tokenizer-from", default=None, help="a GGUF holding the default model's tokenizer")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: all; 1 with --dry-run)")
    args = parser.parse_args(argv)
    device = args.device or ("cpu" if args.dry_run else "cuda")
    runs = DRY if args.dry_run else FULL
    out = Path(args.out or REPO / "benchmarks" / "out" / f"gpu_check-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    check_out(out)
    check_device(device)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SystemExit(f"gpu_check: --out {out}: cannot create it ({error.strerror or error})") from None
    log = Log(out / "gpu_check.log")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(VENDOR) if VENDOR.is_dir() else "",
                                                      env.get("PYTHONPATH")]))
    missing = subprocess.run([sys.executable, "-c", "import gguf, tokenizers, transformers, typer, rich"], env=env,
                             capture_output=True, text=True).returncode
    if missing:
        raise SystemExit("gpu_check: `gguf` (or another package specdec needs) is not importable here: copy it from "
                         "a machine that has it (`cp -r .venv/lib/python3.11/site-packages/gguf benchmarks/vendor/`) "
                         "and carry benchmarks/vendor")
    env["SPECDEC_HOME"] = str(out / "home")  # caches of this run only
    env["SPECDEC_NO_MEMORY"] = "1"
    if args.dry_run:  # a small static cache: the CPU computes attention over every slot
        env.setdefault("SPECDEC_DEVICE_CONTEXT", "512")
    threads = args.threads or (1 if args.dry_run else os.cpu_count() or 1)  # (a busy 2-core CPU: 1 is faster)
    started = time.perf_counter()
    log.say(f"gpu_check: {'dry run on ' if args.dry_run else ''}{device}, into {out}")
    document: dict[str, Any] = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "dry_run": args.dry_run,
                                "machine": machine(device), "models": {}, "commands": []}
    python = sys.executable
    source = tokenizer_source(args.tokenizer_from)
    tokenizer = out / "tokenizer.gguf"
    if not tokenizer.exists():  # the tokenizer's metadata alone, as a machine without the default model gets it
        status, _ = log.run([python, "benchmarks/write_gguf.py", "--tokenizer-only", "--tokenizer-from", source,
                             "-o", str(tokenizer)], env)
        if status:
            return status
    # Spec-Bench where this checkout has it (../shared), else the built-in prompts; a dry run takes the short ones
    spec_bench = next((path for path in SPEC_BENCH if path.is_file()), None)
    prompts = ["--prompts", str(spec_bench)] if spec_bench and not args.dry_run else ["--suite", "builtin"]
    document["prompts"] = prompts[1]
    # the packed GEMM against the dense one, per matrix shape and tile size (benchmarks/bench_packed.py)
    packed_json = out / "bench_packed.json"
    status, _ = log.run([python, "benchmarks/bench_packed.py", "--device", device, "--out", str(packed_json),
                         *(["--dry-run"] if args.dry_run else [])], env)
    document["packed_gemm"] = json.loads(packed_json.read_text()) if not status and packed_json.exists() else \
        {"error": f"bench_packed exited {status}"}
    fastest = document["packed_gemm"].get("fastest")
    if fastest and not args.dry_run and not env.get("SPECDEC_DEVICE_TILES"):  # the benches at the sweep's fastest
        env["SPECDEC_DEVICE_TILES"] = fastest
    document["tiles"] = env.get("SPECDEC_DEVICE_TILES") or "default (kernels/triton_gemm.py's GPU_TILES)"
    save(out, document)
    verdicts: list[Optional[bool]] = []  # per model: every output identical to plain decoding's (None: not compared)
    for run in runs:
        model = out / f"{run.shape}.gguf"
        if not model.exists():
            status, seconds = log.run([python, "benchmarks/write_gguf.py", "--shape", run.shape, "-o", str(model),
                                       "--tokenizer-from", str(tokenizer), "--no-read-back"], env)
            if status:
                return status
        report_path = out / f"bench-{run.name}.json"
        command = [python, "-m", "specdec_cli", "bench", "--target", str(model), "--device", device, "--decoder",
                   "device", *prompts, "--limit", str(run.limit), "-n", str(run.tokens), "--drafters", run.drafters,
                   "--oracle", "--oracle-lengths", "8", "--threads", str(threads), "--json-out", str(report_path),
                   *(["--no-warmup", "--categories", "code,math,translation"] if args.dry_run else [])]
        document["commands"].append(" ".join(command))
        status, seconds = log.run(command, {**env, **run.environment})
        if status or not report_path.exists():
            document["models"][run.name] = {"goal": run.goal, "error": f"bench exited {status}"}
            verdicts.append(None)
            continue
        report = json.loads(report_path.read_text(encoding="utf-8"))
        document["models"][run.name] = {**summary(run, report, seconds), "file_bytes": model.stat().st_size,
                                        "report": report}
        verdicts.append(document["models"][run.name]["every_drafter_identical"])
        log.say(f"{run.name}: " + json.dumps({key: value for key, value in document["models"][run.name].items()
                                               if key not in ("report", "methods")}))
        save(out, document)  # after each model: a run cut short keeps what it measured
    exact = every_identical(verdicts)
    goals: dict[str, Any] = {"every_drafter_identical": exact}  # null: a bench failed, nothing compared for it
    if not args.dry_run:
        default, big = document["models"].get("default-shape", {}), document["models"].get("llama-8b", {})
        plain = big.get("plain_tokens_per_second") or 0.0
        eager = document["models"].get("llama-8b-eager", {}).get("plain_tokens_per_second") or 0.0
        packed_run = document["models"].get("llama-8b-packed", {})
        packed = packed_run.get("plain_tokens_per_second") or 0.0
        memory = packed_run.get("device_memory") or {}
        budget = 1.2 * (packed_run.get("file_bytes") or 0) + memory.get("kv_cache_bytes", 0)
        goals.update({
            "llama_8b_plain_at_least_200_tok_s": plain >= 200, "llama_8b_plain_tok_s": plain,
            "llama_8b_packed_over_dense": round(packed / plain, 3) if plain else None,
            "llama_8b_compiled_over_eager": round(plain / eager, 3) if eager else None,
            "llama_8b_oracle_8_at_least_4x": (big.get("oracle_8_speedup") or 0.0) >= 4,
            "llama_8b_packed_memory_within_1_2x_file_plus_kv": (memory.get("peak_allocated_bytes") or 1e18) <= budget,
            "default_bench_within_120_s": (default.get("bench_seconds") or 1e9) <= 120,
            "default_best_drafter_at_least_3x": (default.get("best_drafter_speedup") or 0.0) >= 3,
        })
    document["goals"] = goals
    document["seconds"] = round(time.perf_counter() - started, 1)
    save(out, document)
    log.say(f"goals: {json.dumps(goals)}")
    log.say(f"wrote {out / 'gpu_check.json'} and {out / 'gpu_check.log'} in {document['seconds']} s")
    return 0 if exact is True else 1


if __name__ == "__main__":
    sys.exit(main())
