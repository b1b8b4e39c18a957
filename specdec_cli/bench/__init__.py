"""`specdec bench`: plain decoding and drafters on the same prompts in one process, measured as the field does.

Conventions (docs/methods.md section 8, after Spec-Bench): batch size 1, greedy by default, a warm-up
excluded, the baseline (`none`, plain decoding through the same engine) in the same run on the same prompts.
The package, one concept a module:

- methods.py: method names -> rows in running order (`none`, drafters, oracle rows, transformers rows);
- settings.py: `BenchSettings`, checked before the model loads;
- runner.py: `run_bench`, every method on every conversation, interleaved, after a warm-up;
- hf_reference.py: transformers' own `generate` and prompt lookup, timed like the engine;
- llama_cpp.py, llama_server.py: llama.cpp's rows, through its Python binding and through its own server binary
  (llama_server_names.py: the row names and the binary; llama_server_http.py: the requests to a server);
- metrics.py: tokens/s, speedup, tau, acceptance, identity, per category and overall (`ResultRow`);
- environment.py: the machine, the software and the verify-cost curve the engine planned with;
- report.py: `BenchReport` and its JSON and CSV files.

Nothing here prints or imports Typer or Rich (cli/bench_cmd.py renders); torch is imported inside functions.
"""

from .llama_server import plan as llama_server_rows
from .methods import (
    BASELINE,
    DEFAULT_ORACLE_LENGTHS,
    OVERALL,
    REFERENCES,
    Method,
    parse_lengths,
    resolve_methods,
    split_names,
)
from .metrics import RESULT_FIELDS, ResultRow, TurnRun, aggregate, first_divergence, per_prompt_rows
from .report import BenchReport, csv_text, to_json_text, write_csv, write_json
from .runner import ProgressEvent, run_bench
from .settings import BenchSettings, bench_settings

__all__ = [
    "BASELINE", "DEFAULT_ORACLE_LENGTHS", "OVERALL", "REFERENCES", "RESULT_FIELDS", "BenchReport", "BenchSettings",
    "Method", "ProgressEvent", "ResultRow", "TurnRun", "aggregate", "bench_settings", "csv_text",
    "first_divergence", "llama_server_rows", "parse_lengths", "per_prompt_rows", "resolve_methods", "run_bench",
    "split_names",
    "to_json_text", "write_csv", "write_json",
]
