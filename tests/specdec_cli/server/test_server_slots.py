"""`specdec serve --parallel N` (server/slots.py): requests answered together, their steps in one forward, each
answer exactly what it is alone. The default model (its GGUF on the native decoder, which scores several
sequences in one forward); the requests are all queued before the first step, so they surely share forwards,
whatever this machine's speed. A client that leaves mid-answer changes no other answer and frees its slot."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import pytest
from test_server import HANG_GUARD, _sam_settings, client_of, health, raw_request, serving, wait_until

openai = pytest.importorskip("openai")

PROMPTS = ["Name three colours.", "Count from one to ten.", "What is a compiler?", "Write a haiku about rain.",
           "List the days of the week.", "Say hello in French."]


@pytest.fixture(scope="module")
def sessions(real_target):
    """Two sessions over the default model's block weights: one answering alone, one for a --parallel server."""
    from specdec_cli.decoding.generation_config import GenerationConfig
    from specdec_cli.session.chat import ChatSession

    loaded = real_target("float32", "auto")
    make = lambda: ChatSession(loaded.model, loaded.tokenizer,  # noqa: E731
                               _sam_settings(replace(GenerationConfig(max_new_tokens=40))))
    return make(), make()


def _gate(session, monkeypatch):
    """Hold the worker in its first answer's start until the test opens the gate (the rest queue meanwhile);
    record how many answers each step of the batch advanced."""
    from specdec_cli.decoding.batch import Batch

    gate, widths = threading.Event(), []
    start_in = session.start_in

    def held(*args, **kwargs):
        assert gate.wait(HANG_GUARD), "the gate was never opened"
        return start_in(*args, **kwargs)

    step = Batch.step

    def counted(self):
        widths.append(len(self.runs))
        return step(self)

    monkeypatch.setattr(session, "start_in", held)
    monkeypatch.setattr(Batch, "step", counted)
    return gate, widths


def _ask_all(server, prompts, stream_each=True) -> dict:
    answers, threads = {}, []

    def ask(prompt):
        client = client_of(server)
        if stream_each:
            pieces = [chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": prompt}], stream=True) if chunk.choices]
            answers[prompt] = "".join(pieces)
        else:
            answers[prompt] = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": prompt}]).choices[0].message.content

    for prompt in prompts:
        threads.append(threading.Thread(target=ask, args=(prompt,)))
        threads[-1].start()
    return {"threads": threads, "answers": answers}


def test_answers_in_parallel_are_the_answers_alone(sessions, monkeypatch):
    alone_session, parallel_session = sessions
    with serving(alone_session, name="smollm2") as server:
        client = client_of(server)
        alone = {prompt: client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}])
                 .choices[0].message.content for prompt in PROMPTS}
    gate, widths = _gate(parallel_session, monkeypatch)
    with serving(parallel_session, name="smollm2", parallel=4) as server:
        asked = _ask_all(server, PROMPTS)
        wait_until(lambda: health(server)["queued"] == len(PROMPTS) - 1, "the requests to queue")
        assert health(server)["slots"] == 4
        gate.set()
        for thread in asked["threads"]:
            thread.join(HANG_GUARD)
        wait_until(lambda: health(server)["served"] == len(PROMPTS), "the worker to count its answers")
        assert health(server)["slots_busy"] == 0
    assert asked["answers"] == alone
    assert max(widths) == 4  # four answers shared each forward while the queue held more


def test_a_client_that_leaves_frees_its_slot_and_changes_no_other_answer(sessions, monkeypatch):
    alone_session, parallel_session = sessions
    with serving(alone_session, name="smollm2") as server:
        alone = {prompt: client_of(server).chat.completions.create(
            model="m", messages=[{"role": "user", "content": prompt}]).choices[0].message.content
            for prompt in PROMPTS[:3]}
    gate, _ = _gate(parallel_session, monkeypatch)
    with serving(parallel_session, name="smollm2", parallel=3) as server:
        leaving = client_of(server).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Tell me a long story about a dragon."}], stream=True,
            max_tokens=400)
        asked = _ask_all(server, PROMPTS[:3], stream_each=False)
        wait_until(lambda: health(server)["queued"] == 3, "the requests to queue")
        gate.set()
        next(iter(leaving))  # the first chunk: the leaving request is being answered
        leaving.close()  # the client goes away mid-answer
        for thread in asked["threads"]:
            thread.join(HANG_GUARD)
        wait_until(lambda: health(server)["slots_busy"] == 0, "every slot to free")
    assert asked["answers"] == alone


def test_each_conversation_goes_back_to_its_own_entries_with_several_slots(sessions):
    """Two conversations taking turns on a two-slot server: each later turn computes only its new tokens (the
    prompt cache holds a context per slot), the second conversation's first turn copies the system prompt the first
    one's entries begin with, and every answer is the one-slot server's."""
    alone_session, parallel_session = sessions

    def converse(server) -> tuple[list[str], list[int], list[int]]:
        client = client_of(server)
        histories = {name: [{"role": "user", "content": prompt}]
                     for name, prompt in (("a", "Name three colours."), ("b", "What is a compiler?"))}
        answers, cached, prompts = [], [], []
        for _turn in range(2):
            for name in ("a", "b"):
                reply = client.chat.completions.create(model="m", messages=histories[name], max_tokens=12)
                text = reply.choices[0].message.content
                answers.append(text)
                cached.append(reply.usage.prompt_tokens_details.cached_tokens)
                prompts.append(reply.usage.prompt_tokens)
                histories[name] += [{"role": "assistant", "content": text}, {"role": "user", "content": "Go on."}]
        return answers, cached, prompts

    with serving(alone_session, name="smollm2") as server:
        alone, _, _ = converse(server)
        kept = [entry.tokens for entry in alone_session.prompt_cache.held]
        status, _, whole = raw_request(server, "POST", "/completion", json.dumps(
            {"prompt": "Name three colours.", "n_predict": 4, "cache_prompt": False}).encode())
        assert status == 200 and whole["timings"]["cache_n"] == 0  # one slot alike: computed whole, the entry kept
        assert [entry.tokens for entry in alone_session.prompt_cache.held] == kept and kept
    alone_session.prompt_cache.clear()
    with serving(parallel_session, name="smollm2", parallel=2) as server:
        answers, cached, prompts = converse(server)
        kept = [entry.tokens for entry in parallel_session.prompt_cache.held]
        status, _, whole = raw_request(server, "POST", "/completion", json.dumps(
            {"prompt": "Name three colours.", "n_predict": 4, "cache_prompt": False}).encode())
        assert status == 200 and whole["timings"]["cache_n"] == 0  # computed whole...
        assert [entry.tokens for entry in parallel_session.prompt_cache.held] == kept  # ...and the others kept
    assert answers == alone
    system = cached[1]  # b's first turn: what it shares with a's first turn, the system prompt
    assert 0 < system < prompts[1] - 4
    for later, earlier in ((2, 0), (3, 1)):  # each later turn holds its own first turn, prompt and answer
        assert cached[later] > prompts[earlier]


def test_requests_taken_together_begin_with_the_least_to_compute(sessions, monkeypatch):
    """Each first token waits for the prompts begun before it: of the requests waiting when slots free, the
    shortest prompt begins first (here three queue behind a held first one, the longest first)."""
    _, parallel_session = sessions
    gate, _ = _gate(parallel_session, monkeypatch)
    begun = []
    held = parallel_session.start_in

    def recording(batch, prompt_ids, *args, **kwargs):
        begun.append(len(prompt_ids))
        return held(batch, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(parallel_session, "start_in", recording)
    prompts = ["Say hi.", "Write a long, careful essay about the history of the printing press in Europe, with dates.",
               "Name a colour.", "List three fruits, then three vegetables, then three grains, one per line."]
    with serving(parallel_session, name="smollm2", parallel=4) as server:
        first = _ask_all(server, prompts[:1])
        wait_until(lambda: health(server)["slots_busy"] == 1, "the first request to hold the worker")
        rest = []
        for count, prompt in enumerate(prompts[1:], start=1):  # queued one by one, in this order
            rest.append(_ask_all(server, [prompt]))
            wait_until(lambda count=count: health(server)["queued"] == count, "the request to queue")
        gate.set()
        for asked in [first, *rest]:
            for thread in asked["threads"]:
                thread.join(HANG_GUARD)
    assert len(begun) == 4 and begun[1:] == sorted(begun[1:]) and begun[1] < begun[2] < begun[3]
