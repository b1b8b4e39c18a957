"""specdec inside vLLM, end to end: the proposers' greedy output and `specdec serve` with the `openai` client.

These run only where vLLM is installed (`make install-vllm`, then `.venv-vllm/bin/python -m pytest
tests/test_vllm.py`); elsewhere they are skipped with one line. Each starts vLLM on the default model in
float32 (a minute or two on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
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

SCRIPT = textwrap.dedent('''
    import json, sys
    if __name__ == "__main__":
        from vllm import LLM, SamplingParams
        model, method, out = sys.argv[1], sys.argv[2], sys.argv[3]
        spec = None
        if method != "plain":
            from specdec_cli.vllm_proposer import proposer_path
            spec = {"method": "custom_class", "model": proposer_path(method), "num_speculative_tokens": 6}
        llm = LLM(model=model, dtype="float32", max_model_len=1024, enforce_eager=True, gpu_memory_utilization=0.3,
                  speculative_config=spec, seed=0)
        tokenizer = llm.get_tokenizer()
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                 add_generation_prompt=True) for p in json.loads(sys.argv[4])]
        params = SamplingParams(temperature=0, max_tokens=48)
        single = [list(llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids) for p in prompts]
        batched = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
        json.dump({"single": single, "batched": batched}, open(out, "w"))
''')


def model_dir() -> str:
    from specdec_cli.models import model_location, resolve_target

    return model_location(resolve_target("default"))


def run_llm(tmp_path: Path, method: str) -> dict:
    script, out = tmp_path / "run.py", tmp_path / f"{method}.json"
    script.write_text(SCRIPT)
    subprocess.run([sys.executable, str(script), model_dir(), method, str(out), json.dumps(PROMPTS)], check=True,
                   timeout=900, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    return json.loads(out.read_text())


@pytest.mark.parametrize("drafter", ["sam", "pld"])
def test_a_specdec_proposer_leaves_vllm_greedy_output_unchanged(tmp_path, drafter):
    plain, speculative = run_llm(tmp_path, "plain"), run_llm(tmp_path, drafter)
    assert speculative["single"] == plain["single"]
    assert speculative["batched"] == plain["batched"]


def wait_for(port: int, server: subprocess.Popen, seconds: float = 600) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        assert server.poll() is None, "the server exited early"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                return
        except OSError:
            time.sleep(2)
    raise TimeoutError("the server did not come up")


def served_answers(port: int, drafter: str) -> list[str]:
    openai = pytest.importorskip("openai")
    server = subprocess.Popen([sys.executable, "-m", "specdec_cli", "serve", "--drafter", drafter, "--port", str(port),
                               "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager"],
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
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
