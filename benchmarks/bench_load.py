"""How long loading a GGUF takes as a user feels it, what memory it peaks at and what it leaves in SPECDEC_HOME.

For one GGUF (`--target FILE`) it runs, as a subprocess under GNU time (`/usr/bin/time -v`),

    specdec chat --target FILE --prompt PROMPT --max-new-tokens 16 --drafter none --json [--threads N]

twice with the same SPECDEC_HOME: `cold`, the home a fresh empty temporary folder (whatever specdec converts,
repacks or measures on first use happens here), then `warm`, the home as the cold run left it. For each run:
the exit code, the wall seconds, the seconds specdec reports generating (its `--json` statistics) and so the
startup (wall minus generation: interpreter, imports, loading or converting the model, tokenizer, exit), the
peak RSS (GNU time's "Maximum resident set size"; it counts mapped file pages the process touched), the file's
size and peak RSS / file size, and the bytes under SPECDEC_HOME after the run (`du`: apparent bytes and
allocated bytes, hard links counted once, per top-level folder) with the bytes the run added and their ratio to
the file's size.

With llama.cpp's `llama-bench` (`--llama-bench PATH`; by default `.venv/bin/llama-bench` of this checkout or of
the running interpreter's environment, else `llama-bench` on PATH; `--no-llama-bench` skips it) it also runs
`llama-bench -m FILE -p 0 -n 128 -t THREADS -o json [-r N]` under GNU time: llama.cpp's own decoding speed (tg 128
tokens/s, mean and standard deviation over its repetitions), its peak RSS, and its load estimated as its wall
time minus its timed repetitions (so loading, context creation, its one warm-up token and exit).

By default the specdec run is this checkout's (`python -m specdec_cli` with this repository first on
PYTHONPATH), so the numbers belong to the code beside this script; `--specdec CMD` runs another (for instance
`.venv/bin/specdec`, an installed one). It only runs the command line, so it measures any loader.

It does not drop the page cache (that needs root and disturbs the machine): `cold` means an empty SPECDEC_HOME,
not a file read from disk; run it once beforehand, or read the file (`cat FILE > /dev/null`), so both runs see
the GGUF in the page cache. The temporary home is removed at the end (`--keep-home` keeps it; `--scratch DIR`
chooses where it is made: a repacked 8B model needs gigabytes there). Output: a small table; `--json-out FILE`
writes everything as one JSON document (atomically). Exit 1 when a run failed (its last lines of stderr are shown).

Run: `python benchmarks/bench_load.py --target model.gguf [--threads 2] [--json-out load.json]`.
Not a test: nothing here is run in CI.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from stat import S_ISDIR
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GNU_TIME = "/usr/bin/time"
DEFAULT_PROMPT = "Write one sentence about the sea."
LLAMA_BENCH_GEN = 128


# ------------------------------------------------------------------------------------------------ measuring


def parse_gnu_time(report: str) -> dict[str, Any]:
    """The fields of `/usr/bin/time -v`'s report that matter here (None where absent)."""
    values: dict[str, str] = {}
    for line in report.splitlines():
        key, separator, value = line.strip().rpartition(": ")
        if separator:
            values[key.strip()] = value.strip()

    def number(key: str) -> Optional[float]:
        try:
            return float(values[key])
        except (KeyError, ValueError):
            return None

    elapsed = None
    for key, value in values.items():
        if key.startswith("Elapsed (wall clock) time"):
            seconds = 0.0
            for part in value.split(":"):  # h:mm:ss or m:ss.ss
                seconds = seconds * 60 + float(part)
            elapsed = seconds
    peak_kib = number("Maximum resident set size (kbytes)")
    status = number("Exit status")
    signal_line = next((line for line in report.splitlines() if "terminated by signal" in line), None)
    return {
        "elapsed_seconds": elapsed,
        "user_seconds": number("User time (seconds)"),
        "system_seconds": number("System time (seconds)"),
        "peak_rss_bytes": int(peak_kib * 1024) if peak_kib is not None else None,
        "exit_status": int(status) if status is not None else None,
        "signal": int(signal_line.split()[-1]) if signal_line else None,
    }


def disk_usage(folder: Path) -> dict[str, Any]:
    """Like `du`: apparent and allocated bytes under `folder` (hard links once), in all and per top-level entry."""
    seen: set[tuple[int, int]] = set()
    parts: dict[str, list[int]] = {}
    if not folder.exists():
        return {"apparent_bytes": 0, "allocated_bytes": 0, "entries": {}}
    for root, folders, files in os.walk(folder):
        for name in folders + files:
            path = Path(root) / name
            try:
                stat = path.lstat()
            except OSError:
                continue  # removed while walking
            if (stat.st_dev, stat.st_ino) in seen:
                continue
            seen.add((stat.st_dev, stat.st_ino))
            top = path.relative_to(folder).parts[0]
            sizes = parts.setdefault(top, [0, 0])
            sizes[0] += 0 if S_ISDIR(stat.st_mode) else stat.st_size  # `du -b` would add folders' own sizes
            sizes[1] += stat.st_blocks * 512
    return {
        "apparent_bytes": sum(sizes[0] for sizes in parts.values()),
        "allocated_bytes": sum(sizes[1] for sizes in parts.values()),
        "entries": {top: {"apparent_bytes": sizes[0], "allocated_bytes": sizes[1]}
                    for top, sizes in sorted(parts.items())},
    }


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the process group `process` leads (GNU time and what it runs)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def preread(path: Path) -> float:
    """Read the file once (into the page cache); -> seconds."""
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as handle:
        while handle.read(16 << 20):
            pass
    return time.perf_counter() - started


def timed(command: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run `command` under `/usr/bin/time -v` (its report to a file of its own); -> the measures, stdout, stderr."""
    with tempfile.TemporaryDirectory(prefix="specdec-bench-load-time-") as scratch:
        report_path = Path(scratch) / "time.txt"
        started = time.perf_counter()
        process = subprocess.Popen([GNU_TIME, "-v", "-o", str(report_path), *command], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   errors="replace", start_new_session=True)
        timed_out = False
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(process)
            stdout, stderr = process.communicate()
        except BaseException:  # Ctrl-C: the child's process group goes too
            kill_group(process)
            process.wait()
            raise
        wall = time.perf_counter() - started
        report = report_path.read_text(encoding="utf-8", errors="replace") if report_path.exists() else ""
    measures = parse_gnu_time(report)
    if measures["signal"]:
        code = -measures["signal"]
    elif measures["exit_status"] is not None:
        code = measures["exit_status"]
    else:
        code = process.returncode
    return {"exit_code": code, "timed_out": timed_out, "wall_seconds": wall, **measures,
            "stdout": stdout, "stderr": stderr}


# ------------------------------------------------------------------------------------------------ specdec


def specdec_command(custom: Optional[str]) -> tuple[list[str], Optional[str]]:
    """The command that runs specdec, and the folder to put first on PYTHONPATH (this checkout) or None."""
    if custom:
        return shlex.split(custom), None
    return [sys.executable, "-m", "specdec_cli"], str(REPO)


def chat_statistics(stdout: str) -> Optional[dict[str, Any]]:
    """specdec chat --json's document (the last line that parses as a JSON object), or None."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                document = json.loads(line)
            except ValueError:
                continue
            if isinstance(document, dict):
                return document
    try:
        document = json.loads(stdout)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def run_chat(name: str, command: list[str], target: Path, home: Path, args: argparse.Namespace,
             pythonpath: Optional[str]) -> dict[str, Any]:
    env = dict(os.environ, SPECDEC_HOME=str(home))
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, os.environ.get("PYTHONPATH")]))
    chat = [*command, "chat", "--target", str(target), "--prompt", args.prompt,
            "--max-new-tokens", str(args.max_new_tokens), "--drafter", "none", "--json"]
    if args.threads:
        chat += ["--threads", str(args.threads)]
    before = disk_usage(home)
    print(f"{name}: {shlex.join(chat)}", file=sys.stderr, flush=True)
    result = timed(chat, env, args.timeout)
    after = disk_usage(home)
    document = chat_statistics(result["stdout"]) if result["exit_code"] == 0 else None
    stats = (document or {}).get("stats") or {}
    generate = stats.get("wall_seconds")
    size = target.stat().st_size
    peak = result["peak_rss_bytes"]
    added = after["apparent_bytes"] - before["apparent_bytes"]
    return {
        "run": name,
        "command": chat,
        "exit_code": result["exit_code"],
        "timed_out": result["timed_out"],
        "wall_seconds": result["wall_seconds"],
        "user_seconds": result["user_seconds"],
        "system_seconds": result["system_seconds"],
        "generate_seconds": generate,
        "startup_seconds": result["wall_seconds"] - generate if generate is not None else None,
        "new_tokens": stats.get("new_tokens"),
        "tokens_per_second": stats.get("tokens_per_second"),
        "output": (document or {}).get("output"),
        "peak_rss_bytes": peak,
        "file_bytes": size,
        "peak_rss_per_file": peak / size if peak is not None else None,
        "home_bytes": after["apparent_bytes"],
        "home_allocated_bytes": after["allocated_bytes"],
        "home_entries": after["entries"],
        "added_bytes": added,
        "added_allocated_bytes": after["allocated_bytes"] - before["allocated_bytes"],
        "added_per_file": added / size,
        "stderr_tail": result["stderr"].strip().splitlines()[-8:],
    }


# ------------------------------------------------------------------------------------------------ llama-bench


def find_llama_bench(given: Optional[str]) -> Optional[Path]:
    if given:
        return Path(given).expanduser()
    for candidate in (REPO / ".venv" / "bin" / "llama-bench", Path(sys.executable).parent / "llama-bench"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("llama-bench")
    return Path(found) if found else None


def parse_llama_bench(stdout: str, n_gen: int = LLAMA_BENCH_GEN) -> dict[str, Any]:
    """From `llama-bench -o json`'s array: the generation test's tokens/s and the seconds all tests were timed."""
    lines = stdout.splitlines()
    first = next((index for index, line in enumerate(lines) if line.lstrip().startswith("[")), None)
    if first is None:
        raise ValueError("no JSON array in llama-bench's output")
    text = "\n".join(lines[first:])
    tests = json.loads(text[: text.rfind("]") + 1])
    if not isinstance(tests, list) or not tests:
        raise ValueError("llama-bench's JSON holds no test")
    generation = [test for test in tests if int(test.get("n_gen", 0)) == n_gen and int(test.get("n_prompt", 0)) == 0]
    if not generation:
        raise ValueError(f"llama-bench's JSON has no tg {n_gen} test")
    test = generation[0]
    timed_ns = 0.0
    for entry in tests:
        samples = entry.get("samples_ns")
        timed_ns += sum(samples) if samples else float(entry.get("avg_ns", 0))
    return {
        "tokens_per_second": float(test["avg_ts"]),
        "tokens_per_second_std": float(test.get("stddev_ts", 0.0)),
        "repetitions": len(test.get("samples_ts") or []) or None,
        "timed_seconds": timed_ns / 1e9,
        "threads": test.get("n_threads"),
        "build": f"{test.get('build_commit', '?')} ({test.get('build_number', '?')})",
        "model_type": test.get("model_type"),
        "model_size_bytes": test.get("model_size"),
        "backends": test.get("backends"),
        "use_mmap": test.get("use_mmap"),
    }


def run_llama_bench(binary: Path, target: Path, threads: int, repetitions: Optional[int],
                    timeout: float) -> dict[str, Any]:
    command = [str(binary), "-m", str(target), "-p", "0", "-n", str(LLAMA_BENCH_GEN), "-t", str(threads),
               "-o", "json"]
    if repetitions:
        command += ["-r", str(repetitions)]
    print(f"llama-bench: {shlex.join(command)}", file=sys.stderr, flush=True)
    result = timed(command, dict(os.environ), timeout)
    size = target.stat().st_size
    row: dict[str, Any] = {
        "command": command,
        "exit_code": result["exit_code"],
        "timed_out": result["timed_out"],
        "wall_seconds": result["wall_seconds"],
        "peak_rss_bytes": result["peak_rss_bytes"],
        "peak_rss_per_file": result["peak_rss_bytes"] / size if result["peak_rss_bytes"] is not None else None,
        "stderr_tail": result["stderr"].strip().splitlines()[-8:],
    }
    if result["exit_code"] == 0:
        try:
            parsed = parse_llama_bench(result["stdout"])
        except (ValueError, KeyError, TypeError) as error:
            row["error"] = f"cannot read llama-bench's output: {error}"
        else:
            row.update(parsed)
            row["load_seconds_estimate"] = result["wall_seconds"] - parsed["timed_seconds"]
    return row


# ------------------------------------------------------------------------------------------------ report


def human_bytes(value: Optional[float]) -> str:
    if value is None:
        return "-"
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.2f} {unit}"
        value /= 1024
    return f"{value}"


def number(value: Optional[float], digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(document: dict[str, Any]) -> str:
    target = document["target"]
    lines = [f"target: {target['path']} ({human_bytes(target['bytes'])})",
             f"specdec: {shlex.join(document['settings']['specdec_command'])}"
             + (f" (PYTHONPATH {document['settings']['pythonpath']})" if document["settings"]["pythonpath"] else "")]
    header = ["run", "exit", "wall s", "startup s", "tok/s", "peak RSS", "RSS/file", "home after", "added",
              "added/file"]
    rows = [[run["run"], str(run["exit_code"]), number(run["wall_seconds"]), number(run["startup_seconds"]),
             number(run["tokens_per_second"]), human_bytes(run["peak_rss_bytes"]),
             number(run["peak_rss_per_file"], 2), human_bytes(run["home_bytes"]), human_bytes(run["added_bytes"]),
             number(run["added_per_file"], 2)] for run in document["runs"]]
    bench = document.get("llama_bench")
    if bench:
        rows.append(["llama-bench", str(bench["exit_code"]), number(bench["wall_seconds"]),
                     number(bench.get("load_seconds_estimate")),
                     number(bench.get("tokens_per_second"), 2), human_bytes(bench["peak_rss_bytes"]),
                     number(bench["peak_rss_per_file"], 2), "-", "-", "-"])
    widths = [max(len(row[index]) for row in [header, *rows]) for index in range(len(header))]
    for row in [header, *rows]:
        lines.append("  ".join(cell.ljust(width) if index == 0 else cell.rjust(width)
                               for index, (cell, width) in enumerate(zip(row, widths))))
    for run in document["runs"]:
        entries = ", ".join(f"{top} {human_bytes(sizes['apparent_bytes'])}"
                            for top, sizes in run["home_entries"].items())
        lines.append(f"{run['run']}: home holds {entries or 'nothing'}")
    if bench:
        if bench.get("tokens_per_second") is not None:
            lines.append(f"llama-bench: tg {LLAMA_BENCH_GEN} {bench['tokens_per_second']:.2f} "
                         f"± {bench['tokens_per_second_std']:.2f} tok/s over {bench['repetitions']} repetitions, "
                         f"{bench['threads']} threads, build {bench['build']}; load ~ wall minus timed "
                         f"{bench['timed_seconds']:.1f} s")
        elif bench.get("error"):
            lines.append(f"llama-bench: {bench['error']}")
    elif document["settings"]["llama_bench"] is None and not document["settings"]["llama_bench_skipped"]:
        lines.append("llama-bench: not found (--llama-bench PATH), skipped")
    lines.append("startup s = wall s minus the seconds specdec reports generating (llama-bench: wall minus its "
                 "timed repetitions)")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="the .gguf file to load")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None,
                        help="passed to specdec chat --threads and llama-bench -t (default: specdec's own choice; "
                             "llama-bench: the usable cores)")
    parser.add_argument("--specdec", default=None,
                        help="the command that runs specdec (default: this checkout, python -m specdec_cli)")
    parser.add_argument("--llama-bench", default=None, help="llama-bench binary (default: found as said above)")
    parser.add_argument("--no-llama-bench", action="store_true", help="skip llama-bench")
    parser.add_argument("--llama-bench-repetitions", type=int, default=None,
                        help="llama-bench -r (default: llama-bench's own, 5)")
    parser.add_argument("--no-preread", action="store_true",
                        help="do not read the file once before the runs (to put it in the page cache)")
    parser.add_argument("--scratch", default=None, help="where to make the temporary SPECDEC_HOME")
    parser.add_argument("--keep-home", action="store_true", help="keep the temporary SPECDEC_HOME")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed per run (default 3600)")
    parser.add_argument("--json-out", default=None, help="write the measurements as JSON to this file")
    args = parser.parse_args(argv)
    target = Path(args.target).expanduser().resolve()
    if not target.is_file() or target.suffix.lower() != ".gguf":
        parser.error(f"--target must be an existing .gguf file: {args.target}")
    if args.max_new_tokens < 1 or (args.threads is not None and args.threads < 1):
        parser.error("--max-new-tokens and --threads must be positive")
    if not (os.path.isfile(GNU_TIME) and os.access(GNU_TIME, os.X_OK)):
        parser.error(f"needs GNU time at {GNU_TIME} (apt-get install time)")
    if args.json_out and not Path(args.json_out).expanduser().resolve().parent.is_dir():
        parser.error(f"no such directory for --json-out: {Path(args.json_out).parent}")
    llama_bench = None if args.no_llama_bench else find_llama_bench(args.llama_bench)
    if llama_bench is not None and not (llama_bench.is_file() and os.access(llama_bench, os.X_OK)):
        parser.error(f"--llama-bench: not an executable file: {llama_bench}")
    command, pythonpath = specdec_command(args.specdec)
    from specdec_cli.machine import cpu_model, usable_cores

    threads = args.threads or usable_cores() or 1
    preread_seconds = None if args.no_preread else preread(target)
    home = Path(tempfile.mkdtemp(prefix="specdec-bench-load-home-", dir=args.scratch))
    runs = []
    try:
        for name in ("cold", "warm"):
            runs.append(run_chat(name, command, target, home, args, pythonpath))
    finally:
        if args.keep_home:
            print(f"SPECDEC_HOME kept: {home}", file=sys.stderr)
        else:
            shutil.rmtree(home, ignore_errors=True)
    bench = (run_llama_bench(llama_bench, target, threads, args.llama_bench_repetitions, args.timeout)
             if llama_bench else None)
    document = {
        "environment": {
            "cpu": cpu_model(), "cores": usable_cores(), "platform": platform.platform(),
            "python": platform.python_version(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "checkout": str(REPO), "commit": git_commit(),
        },
        "settings": {
            "specdec_command": command, "pythonpath": pythonpath, "prompt": args.prompt,
            "max_new_tokens": args.max_new_tokens, "threads": args.threads, "llama_bench_threads": threads,
            "llama_bench": str(llama_bench) if llama_bench else None, "llama_bench_skipped": args.no_llama_bench,
            "llama_bench_repetitions": args.llama_bench_repetitions, "home": str(home), "kept": args.keep_home,
            "preread_seconds": preread_seconds,
        },
        "target": {"path": str(target), "bytes": target.stat().st_size},
        "runs": runs,
        "llama_bench": bench,
    }
    print(table(document))
    failed = [run for run in runs if run["exit_code"] != 0] + ([bench] if bench and bench["exit_code"] else [])
    for row in failed:
        name = row.get("run", "llama-bench")
        print(f"{name} failed (exit {row['exit_code']}{', timed out' if row['timed_out'] else ''}):",
              file=sys.stderr)
        for line in row["stderr_tail"]:
            print(f"  {line}", file=sys.stderr)
    if args.json_out:
        from specdec_cli.files import write_json_atomic

        write_json_atomic(Path(args.json_out).expanduser().resolve(), document)
    return 1 if failed else 0


def git_commit() -> Optional[str]:
    """This checkout's commit (with `+changes` when its tracked files differ from it), or None."""
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (commit + ("+changes" if dirty else "")) or None


if __name__ == "__main__":
    sys.exit(main())
