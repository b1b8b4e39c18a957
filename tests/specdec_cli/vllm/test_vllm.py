"""specdec inside vLLM, end to end: the proposers' greedy output and `specdec serve` with the `openai` client.

These run only where vLLM is installed (`make install-vllm`, then `.venv-vllm/bin/python -m pytest
tests/specdec_cli/vllm/test_vllm.py`); elsewhere they are skipped with one line. Each starts vLLM on the default
model in float32 (a minute or two on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make install-vllm)")

PROMPTS = [
    "Repeat this list exactly, then add one more item in the same style: apples, pears, plums, apples, pears,",
    "Write a Python function that returns the squares of a list of numbers, with a docstring.",
    "Summarise in one sentence: The meeting moved to Friday. The meeting room is B12. Bring the slides.",
    "What is the capital of France? Answer in one sentence.",
]


@pytest.fixture(scope="module")
def target():
    """The default model's directory, tokenizer and end-of-answer ids (its weights run in vLLM only)."""
    from specdec_cli.target_model.load.models import load_target_text

    return load_target_text("default")


@pytest.fixture(scope="module")
def prompt_ids(target) -> list[list[int]]:
    from specdec_cli.texts.prompt_ids import format_prompt

    return [format_prompt(target.tokenizer, [{"role": "user", "content": prompt}]) for prompt in PROMPTS]


def vllm_answers(target, method: str, prompt_ids: list[list[int]]) -> dict[str, list[list[int]]]:
    """The prompts one request at a time ("single") and all four at once ("batched"), greedy, float32."""
    from specdec_cli.drafters import DrafterOptions
    from specdec_cli.session.run_settings import DrafterSettings
    from specdec_cli.target_model.load.load_settings import LoadSettings
    from specdec_cli.vllm.proposer_settings import ProposerSettings
    from specdec_cli.vllm.runner import VllmPhase, VllmSettings, run_vllm

    eos = target.eos_token_ids
    proposer = ProposerSettings(DrafterSettings(method, DrafterOptions()), num_speculative_tokens=6)
    run = run_vllm(VllmSettings(LoadSettings(target.location), proposer, max_model_len=1024),
                   [VllmPhase("single", prompt_ids, 48, eos), VllmPhase("batched", prompt_ids, 48, eos, concurrency=4)])
    return {name: [answer.tokens for answer in phase.answers] for name, phase in run.phases.items()}


@pytest.fixture(scope="module")
def plain_answers(target, prompt_ids) -> dict[str, list[list[int]]]:
    return vllm_answers(target, "none", prompt_ids)


@pytest.mark.parametrize("drafter", ["sam", "pld"])
def test_a_specdec_proposer_leaves_vllm_greedy_output_unchanged(target, prompt_ids, plain_answers, drafter):
    speculative = vllm_answers(target, drafter, prompt_ids)
    assert all(plain_answers["single"])
    assert speculative["single"] == plain_answers["single"]
    assert speculative["batched"] == plain_answers["batched"]


def specdec(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdec_cli", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])})


def test_bench_runs_plain_vllm_its_ngram_and_a_specdec_proposer_on_the_same_prompts(tmp_path):
    done = specdec("bench", "--engine", "vllm", "--suite", "builtin", "--categories", "code,summarization",
                   "--limit", "1", "-d", "none,pld", "--reference", "ngram", "--max-new-tokens", "32",
                   "--concurrency", "2", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    overall = {(row["regime"], row["method"]): row for row in report["results"] if row["category"] == "overall"}
    methods = ("none", "pld", "ngram")
    assert set(overall) == {(regime, method) for regime in ("single", "concurrent") for method in methods}
    for (_, method), row in overall.items():
        assert row["prompts"] == 2 and row["new_tokens"] > 0 and row["tokens_per_second"] > 0
        assert row["identical"] == row["compared"] == 2  # float32: vLLM verifies every draft
        if method != "none":
            assert row["acceptance_rate"] is not None and row["mean_accepted_tokens"] >= 1.0
    assert report["environment"]["dtype"] == "float32"


def test_distill_generate_answers_through_vllm_and_resumes(tmp_path):
    data = tmp_path / "answers.jsonl"
    args = ("distill", "generate", "--engine", "vllm", "--suite", "distill", "--max-prompts", "6",
            "--max-new-tokens", "24", "-o", str(data))
    first = specdec(*args)
    assert first.returncode == 0, first.stderr[-2000:]
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert len(rows) == 6 and len({row["prompt"] for row in rows}) == 6
    assert all(1 <= len(row["answer_ids"]) <= 24 and row["answer"] and row["prompt_ids"] for row in rows)
    again = specdec(*args)
    said = " ".join(again.stderr.split())  # Rich wraps the line at the terminal width
    assert again.returncode == 0 and "0 new rows" in said and "6 already answered" in said


def get(port: int, path: str, key: str = "") -> int:
    """The HTTP status of GET http://127.0.0.1:PORT/PATH, with `Authorization: Bearer KEY` when a key is given."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def wait_for(port: int, server: subprocess.Popen, seconds: float = 600, key: str = "") -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        assert server.poll() is None, "the server exited early"
        try:
            get(port, "/v1/models", key)
            return
        except OSError:
            time.sleep(2)
    raise TimeoutError("the server did not come up")


def served_answers(port: int, drafter: str) -> list[str]:
    openai = pytest.importorskip("openai")
    server = subprocess.Popen([sys.executable, "-m", "specdec_cli", "serve", "--engine", "vllm", "--drafter", drafter,
                               "--port", str(port),
                               "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager"],
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])})
    try:
        wait_for(port, server)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        name = client.models.list().data[0].id

        def ask(prompt: str) -> str:
            stream = client.chat.completions.create(model=name, messages=[{"role": "user", "content": prompt}],
                                                    temperature=0, max_tokens=48, stream=True)
            return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)

        with ThreadPoolExecutor(len(PROMPTS)) as pool:  # four clients at once, each streaming
            return list(pool.map(ask, PROMPTS))
    finally:
        server.terminate()
        assert server.wait(timeout=120) in (0, 143, -15)


def test_serve_answers_concurrent_streaming_clients_as_the_plain_server_does():
    plain = served_answers(8471, "none")
    speculative = served_answers(8472, "sam")
    assert all(plain) and speculative == plain


@pytest.mark.parametrize("through", ["flag", "environment"])
def test_serve_with_an_api_key_refuses_requests_without_it(through):
    """--api-key (or VLLM_API_KEY, which keeps the key out of `ps`): a request without the key, or with another, is
    refused (401); with it, answered."""
    key, port = "s3cret-key", 8473 if through == "flag" else 8474
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])}
    args = ["--api-key", key] if through == "flag" else []
    if through == "environment":
        env["VLLM_API_KEY"] = key
    server = subprocess.Popen([sys.executable, "-m", "specdec_cli", "serve", "--engine", "vllm", "--drafter", "none",
                               "--port", str(port),
                               "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager", *args], env=env)
    try:
        wait_for(port, server, key=key)
        assert get(port, "/v1/models") == 401
        assert get(port, "/v1/models", "another-key") == 401
        assert get(port, "/v1/models", key) == 200
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):  # vLLM's server got the key by its environment
            try:
                words = cmdline.read_bytes()
            except OSError:
                continue
            assert not (b"vllm.entrypoints" in words and key.encode() in words), "the key shows in ps"
    finally:
        server.terminate()
        assert server.wait(timeout=120) in (0, 143, -15)


def test_an_eagle3_head_specdec_trained_drafts_in_vllms_own_eagle3_without_changing_answers(tmp_path):
    """`specdec distill --kind eagle3` writes the layout vLLM loads: `bench --engine vllm --reference eagle3
    --draft-model DIR` runs vLLM's EAGLE-3 with it, every answer identical to plain vLLM's (float32)."""
    data, head = tmp_path / "answers.jsonl", tmp_path / "head"
    answered = specdec("distill", "generate", "--suite", "distill", "--max-prompts", "4", "--max-new-tokens", "24",
                       "-o", str(data))
    assert answered.returncode == 0, answered.stderr[-2000:]
    trained = specdec("distill", "train", "--kind", "eagle3", "--data", str(data), "-o", str(head), "--steps", "4")
    assert trained.returncode == 0, trained.stderr[-2000:]
    done = specdec("bench", "--engine", "vllm", "--suite", "builtin", "--categories", "code", "--limit", "2",
                   "-d", "none", "--reference", "eagle3", "--draft-model", str(head), "--max-new-tokens", "32",
                   "--concurrency", "2", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    rows = [row for row in report["results"] if row["category"] == "overall" and row["method"] == "eagle3"]
    assert {row["regime"] for row in rows} == {"single", "concurrent"}
    for row in rows:
        assert row["identical"] == row["compared"] == 2 and row["new_tokens"] > 0
        assert row["acceptance_rate"] is not None  # vLLM drafted with the head
