"""`bench --engine vllm` and `distill generate --engine vllm` without vLLM: method lists, the rows computed from
vLLM's answers and counters, the child's protocol, rows written from streamed answers, and the one-line errors.
tests/specdec_cli/vllm/test_vllm.py runs them in vLLM."""

from __future__ import annotations

import io
import json

import pytest
from typer.testing import CliRunner

from specdec_cli.bench.vllm_bench import RESULT_COLUMNS, result_rows, vllm_methods
from specdec_cli.cli import app
from specdec_cli.defaults import VLLM_DRAFT_MAX
from specdec_cli.drafters import DrafterOptions
from specdec_cli.errors import SpecdecError
from specdec_cli.session.run_settings import DrafterSettings
from specdec_cli.target_model.load.load_settings import LoadSettings
from specdec_cli.texts.prompts import Conversation
from specdec_cli.vllm.proposer_settings import ProposerSettings
from specdec_cli.vllm.runner import VllmAnswer, VllmPhaseResult, VllmSettings, _collect

ACCEPTED, DRAFTED = "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_draft_tokens"


def names(methods) -> list[str]:
    return [method.name for method in methods]


def test_methods_start_with_plain_vllm_and_take_only_what_runs_there():
    assert names(vllm_methods(["none", "sam", "pld"], [])) == ["none", "sam", "pld", "ngram"]  # vLLM's ngram by default
    assert names(vllm_methods(["sam"], ["suffix", "ngram"])) == ["none", "sam", "suffix", "ngram"]
    with pytest.raises(SpecdecError, match="does not run in vLLM"):
        vllm_methods(["none", "ttr"], [])
    with pytest.raises(SpecdecError, match="the references are vLLM's ngram, suffix"):
        vllm_methods(["none"], ["llama.cpp"])


def test_a_repeated_method_is_dropped_with_one_warning(recwarn):
    methods = vllm_methods(["none", "sam", "sam", "none"], ["ngram", "ngram"])
    assert [(method.name, method.kind) for method in methods] == [("none", "engine"), ("sam", "engine"),
                                                                  ("ngram", "vllm")]
    assert [str(warning.message) for warning in recwarn] == [
        "dropped the repeated methods 'sam', 'none', 'ngram': each method is benchmarked once"]
    recwarn.clear()
    vllm_methods(["none", "sam"], [])  # `none` named once, before the one always run: no warning
    assert not recwarn.list


def engine(method: str, draft_max=None, **proposer) -> VllmSettings:
    drafter = DrafterSettings(method, DrafterOptions())
    return VllmSettings(LoadSettings("m"), ProposerSettings(drafter, num_speculative_tokens=draft_max, **proposer))


def test_speculative_settings_name_vllm_methods_and_specdec_proposers():
    assert VllmSettings(LoadSettings("m")).speculative() == (None, {})
    ngram, env = engine("ngram", draft_max=5).speculative()
    assert ngram["method"] == "ngram" and ngram["num_speculative_tokens"] == 5 and env == {}
    assert engine("suffix").speculative()[0]["num_speculative_tokens"] == VLLM_DRAFT_MAX  # the one default
    custom, env = engine("sam+pld", draft_max=4, min_match=2).speculative()
    assert custom == {"method": "custom_class", "model": "specdec_cli.vllm.proposer.SamProposer",
                      "num_speculative_tokens": 4}
    assert json.loads(env["SPECDEC_VLLM_DRAFTER"]) == {"drafter": "sam+pld", "min_match": 2}
    with pytest.raises(SpecdecError, match="vLLM runs none"):
        engine("eagle").check()
    with pytest.raises(SpecdecError, match="weights int8: vLLM chooses it"):
        VllmSettings(LoadSettings("m", weights="int8")).check()


def phase(answers: list[list[int]], seconds: float, accepted: float = 0, drafted: float = 0) -> VllmPhaseResult:
    done = [VllmAnswer("p", index, tokens, "length", seconds / len(answers)) for index, tokens in enumerate(answers)]
    return VllmPhaseResult("p", seconds, done, {ACCEPTED: accepted, DRAFTED: drafted})


def test_rows_give_speed_tau_acceptance_and_identity_per_regime_and_category():
    conversations = [Conversation("1", "code", ("a",)), Conversation("2", "qa", ("b",))]
    plain = [[1, 2, 3, 4], [5, 6, 7, 8]]
    regimes = {
        "none": {"single": phase(plain, 4.0), "concurrent": phase(plain, 2.0)},
        # 8 tokens with 4 of them accepted drafts: 4 target forwards, tau 2; one answer differs when batched
        "sam": {"single": phase(plain, 2.0, accepted=4, drafted=8),
                "concurrent": phase([[1, 2, 3, 4], [5, 6, 7, 9]], 1.0, accepted=4, drafted=16)},
    }
    rows = {(row["regime"], row["category"], row["method"]): row for row in result_rows(regimes, conversations)}
    single = rows[("single", "overall", "sam")]
    assert single["tokens_per_second"] == 4.0 and single["speedup"] == 2.0
    assert single["mean_accepted_tokens"] == 2.0 and single["acceptance_rate"] == 0.5
    assert single["identical"] == single["compared"] == 2
    concurrent = rows[("concurrent", "overall", "sam")]
    assert concurrent["speedup"] == 2.0 and concurrent["acceptance_rate"] == 0.25 and concurrent["identical"] == 1
    code = rows[("single", "code", "sam")]  # per category: from each request's own time
    assert code["prompts"] == 1 and code["tokens_per_second"] == 4.0 and code["mean_accepted_tokens"] is None
    assert ("concurrent", "code", "sam") not in rows  # concurrent requests share their time: overall only
    assert all(tuple(row) == RESULT_COLUMNS for row in result_rows(regimes, conversations))  # the CSV's columns
    assert rows[("single", "overall", "none")]["mean_accepted_tokens"] is None


class FakeChild:
    def __init__(self, lines: list[dict]):
        self.stdout = io.StringIO("".join(json.dumps(line) + "\n" for line in lines))


def test_the_childs_lines_become_phases_with_counters_of_each_phase_alone():
    seen = []
    run, error = _collect(FakeChild([
        {"started": {"dtype": "float32", "device": "cpu", "version": "0.32.0"}},
        {"answer": {"phase": "warmup", "index": 0, "tokens": [1], "finish_reason": "length", "seconds": 0.1}},
        {"phase": "warmup", "seconds": 0.1, "counters": {ACCEPTED: 2.0}},
        {"answer": {"phase": "all", "index": 1, "tokens": [7, 2], "finish_reason": "eos", "seconds": 0.5}},
        {"answer": {"phase": "all", "index": 0, "tokens": [5], "finish_reason": "length", "seconds": 0.6}},
        {"phase": "all", "seconds": 0.6, "counters": {ACCEPTED: 5.0}},
    ]), seen.append)
    assert error is None and run is not None and run.dtype == "float32"
    assert [answer.index for answer in run.phases["all"].answers] == [0, 1]  # prompt order, not finishing order
    assert run.phases["all"].counters == {ACCEPTED: 3.0} and run.phases["all"].new_tokens == 3
    assert [answer.phase for answer in seen] == ["warmup", "all", "all"]
    _, error = _collect(FakeChild([{"error": "RuntimeError: no memory"}]), None)
    assert error == "RuntimeError: no memory"


def test_distill_rows_are_written_from_vllms_answers_as_they_come_and_a_rerun_skips_them(tmp_path, monkeypatch):
    from conftest import make_char_tokenizer

    tokenizer = make_char_tokenizer()
    calls = []

    def fake_run(settings, phases, on_answer=None):
        calls.append((settings, phases))
        for index in reversed(range(len(phases[0].prompts))):  # finishing out of order
            on_answer(VllmAnswer("answers", index, [5 + index, 6], "length", 0.1))

    monkeypatch.setattr("specdec_cli.vllm.runner.run_vllm", fake_run)
    from specdec_cli.distill.generate import generate_data_vllm

    prompts = [Conversation(str(i), "qa", (f"question {i}",)) for i in range(3)]
    out = tmp_path / "rows.jsonl"
    summary = generate_data_vllm("/models/m", tokenizer, "m", prompts, str(out), eos_token_ids=[0], max_new_tokens=2,
                                 concurrency=2)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary.written == 3 and [row["prompt"] for row in rows] == ["question 2", "question 1", "question 0"]
    assert rows[0]["answer_ids"] == [7, 6] and rows[0]["prompt_ids"] and rows[0]["target"] == "m"
    assert calls[0][1][0].concurrency == 2 and calls[0][1][0].max_tokens == 2
    again = generate_data_vllm("/models/m", tokenizer, "m", prompts, str(out), eos_token_ids=[0], max_new_tokens=2)
    assert again.written == 0 and again.skipped == 3 and len(calls) == 1  # nothing left: vLLM is not started


def failure(args: list[str]) -> str:
    """The one line a bad command fails with (main() prints a SpecdecError's message as `specdec: error: ...`)."""
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0
    assert isinstance(result.exception, SpecdecError), result.exception
    return str(result.exception)


def test_without_vllm_both_commands_say_how_to_install_it(monkeypatch):
    monkeypatch.setattr("specdec_cli.vllm.runner.vllm_installed", lambda: False)
    assert "make install-vllm" in failure(["bench", "--engine", "vllm", "--limit", "1"])
    assert "make install-vllm" in failure(["distill", "generate", "--engine", "vllm", "--suite", "distill",
                                           "-o", "x.jsonl"])


@pytest.mark.parametrize("args, message", [
    (["bench", "--engine", "vllm", "--oracle"], "--oracle: not with --engine vllm"),
    (["bench", "--engine", "vllm", "--temperature", "0.7"], "--temperature: not with --engine vllm"),
    (["bench", "--engine", "vllm", "-d", "none,ttr"], "does not run in vLLM"),
    (["bench", "--engine", "vllm", "--concurrency", "0"], "concurrency must be >= 1"),
    (["bench", "--engine", "mlx"], "engine must be one of specdec, vllm, got 'mlx'"),
    (["bench", "--engine", "vllm", "--reference", "eagle3"], "method eagle3: give --draft-model DIR"),
    (["bench", "--engine", "vllm", "--reference", "ngram", "--draft-model", "x"], "--draft-model: not with --engine"),
    (["distill", "generate", "--engine", "vllm", "--suite", "distill", "-o", "x.jsonl", "--temperature", "0.5"],
     "vLLM answers greedily"),
])
def test_bad_vllm_flags_fail_in_one_line_before_anything_loads(args, message):
    assert message in failure(args)
