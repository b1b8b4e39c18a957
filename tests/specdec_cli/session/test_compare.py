"""One prompt answered plainly and speculatively on the same engine (what `make demo` shows)."""

from __future__ import annotations

import pytest
from conftest import TINY_EOS, fixed_engine, hf_greedy

from specdec_cli.decoding.engine import Engine, GenerationConfig
from specdec_cli.drafters.pld import PromptLookupDrafter
from specdec_cli.errors import SpecdecError
from specdec_cli.session.compare import compare

PROMPT = [1, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11]


def test_compare_runs_both_and_finds_them_identical(tiny_llama):
    engine = fixed_engine(tiny_llama)
    config = GenerationConfig(max_new_tokens=24, eos_token_ids=(TINY_EOS,))
    seen = []
    result = compare(engine, PROMPT, PromptLookupDrafter(), config, on_event=seen.append)
    assert result.plain.tokens == hf_greedy(tiny_llama, PROMPT, 24)
    assert result.identical and result.first_divergence is None
    assert result.plain.stats.drafted_tokens == 0 and result.plain.stats.mean_accepted_tokens == pytest.approx(1.0)
    assert [event.kind for event in seen][0] == "prefill" and len(seen) == len(result.speculative.events)
    assert result.speedup > 0


def test_compare_reports_where_outputs_diverge(tiny_llama):
    engine = Engine(tiny_llama)
    config = GenerationConfig(max_new_tokens=8, eos_token_ids=(TINY_EOS,), cost_aware=False)
    result = compare(engine, PROMPT, PromptLookupDrafter(), config)
    result.speculative.tokens[3] += 1  # what a broken verifier would do
    assert not result.identical and result.first_divergence == 3


def test_compare_needs_greedy(tiny_llama):
    with pytest.raises(SpecdecError, match="greedy"):
        compare(Engine(tiny_llama), PROMPT, PromptLookupDrafter(), GenerationConfig(temperature=0.7))


def test_cli_compare_json(tiny_model_dir):
    import json

    from conftest import invoke

    result = invoke("chat", "--target", tiny_model_dir, "--prompt", "abcabcabc", "--drafter", "pld", "-n", "16",
                    "--compare", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["identical"] is True and payload["first_divergence"] is None
    assert payload["plain"]["output_token_ids"] == payload["speculative"]["output_token_ids"]
    assert payload["plain"]["stats"]["mean_accepted_tokens"] == 1.0 and payload["speedup"] > 0


def test_cli_compare_text(tiny_model_dir):
    from conftest import invoke

    result = invoke("chat", "--target", tiny_model_dir, "--prompt", "abcabcabc", "--drafter", "pld", "-n", "16",
                    "--compare", "--plain")
    assert result.returncode == 0, result.stderr
    assert "plain decoding:" in result.stderr and "pld:" in result.stderr and "outputs identical" in result.stderr


def test_cli_compare_with_llama_cpps_penalties(tiny_model_dir):
    """`chat --repeat-penalty/--repeat-last-n/--presence-penalty`: both answers carry them (the speculative one
    identical to plain decoding's) and they change the answer."""
    import json

    from conftest import invoke

    def answer(*flags: str) -> dict:
        result = invoke("chat", "--target", tiny_model_dir, "--prompt", "abcabcabc", "--drafter", "pld", "-n", "16",
                        "--compare", "--json", *flags)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    free = answer()
    penalised = answer("--repeat-penalty", "3", "--repeat-last-n", "8", "--presence-penalty", "1.5")
    assert penalised["identical"] is True
    assert penalised["plain"]["output_token_ids"] != free["plain"]["output_token_ids"]
