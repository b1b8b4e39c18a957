"""`specdec serve --parallel N` (server/slots.py): requests answered together, their steps in one forward, each
answer exactly what it is alone. The default model (its GGUF on the native decoder, which scores several
sequences in one forward); the requests are all queued before the first step, so they surely share forwards,
whatever this machine's speed. A client that leaves mid-answer changes no other answer and frees its slot."""

from __future__ import annotations

import http.client
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
    with serving(alone_session, name="smollm2", parallel=1) as server:
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
    with serving(alone_session, name="smollm2", parallel=1) as server:
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

    with serving(alone_session, name="smollm2", parallel=1) as server:
        alone, _, _ = converse(server)
        wait_until(lambda: health(server)["served"] == 4 and not server.worker.ahead,
                   "the next turns' openings to be computed")
        kept = [entry.tokens for entry in alone_session.prompt_cache.held]
        status, _, whole = raw_request(server, "POST", "/completion", json.dumps(
            {"prompt": "Name three colours.", "n_predict": 4, "cache_prompt": False}).encode())
        assert status == 200 and whole["timings"]["cache_n"] == 0  # one slot alike: computed whole, the entry kept
        assert [entry.tokens for entry in alone_session.prompt_cache.held] == kept and kept
    alone_session.prompt_cache.clear()
    with serving(parallel_session, name="smollm2", parallel=2) as server:
        answers, cached, prompts = converse(server)
        wait_until(lambda: health(server)["served"] == 4 and not server.worker.ahead,
                   "the next turns' openings to be computed")
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


# -- --parallel auto, and what a one-at-a-time server does, with slots ----------------------------------------------


def test_auto_answers_four_together_on_block_weights_and_one_at_a_time_elsewhere(sessions, tiny_model_dir):
    """`--parallel auto` (the default): llama-server's 4 where one forward scores several answers (the default
    model's block weights), 1 on a forward that steps answers one by one (transformers' modules) or with a drafter
    that reads the target's layer states."""
    from test_server import _chat_settings

    from specdec_cli.server.slots import slots_for
    from specdec_cli.session.chat import open_session

    _, parallel_session = sessions
    with serving(parallel_session, name="smollm2") as server:
        assert health(server)["slots"] == 4
        assert raw_request(server, "GET", "/props")[2]["total_slots"] == 4  # llama-server's name for it
    assert slots_for(2, parallel_session) == 2
    assert slots_for(None, open_session(_chat_settings(tiny_model_dir))[0]) == 1

    class ReadsLayers:
        needs = replace(parallel_session.drafter.needs, feature_layers=(1,))

    assert not parallel_session.engine.batches([ReadsLayers()])
    assert parallel_session.engine.batches([parallel_session.drafter])


COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"  # a text completion that goes on counting (greedy)


def raw_text(server, path: str) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=HANG_GUARD)
    try:
        connection.request("GET", path)
        return connection.getresponse().read().decode()
    finally:
        connection.close()


def _long(client, tokens: int = 400):
    """A streamed answer that runs long (the model counts on), open until closed."""
    return client.completions.create(model="m", prompt=COUNTING, stream=True, max_tokens=tokens)


def test_a_failing_batched_step_fails_each_open_answer_with_a_500_and_the_next_is_served(sessions, monkeypatch,
                                                                                        caplog):
    from specdec_cli.decoding.batch import Batch

    alone_session, parallel_session = sessions
    step, calls = Batch.step, []

    def failing_once(self):
        calls.append(len(self.runs) + len(self.prompts))
        if len(calls) == 2:
            raise RuntimeError("the kernels fell over\nsecond line")
        return step(self)

    gate, _ = _gate(parallel_session, monkeypatch)
    monkeypatch.setattr(Batch, "step", failing_once)
    with serving(parallel_session, name="smollm2", parallel=2) as server, \
            caplog.at_level("ERROR", logger="specdec.server"):
        failed: list = []

        def ask(prompt):
            failed.append(raw_request(server, "POST", "/v1/completions", json.dumps(
                {"prompt": prompt, "max_tokens": 40}).encode()))

        threads = [threading.Thread(target=ask, args=(prompt,)) for prompt in (COUNTING, COUNTING + " 13,")]
        for thread in threads:
            thread.start()
        wait_until(lambda: health(server)["queued"] == 1, "both requests to arrive")
        gate.set()
        for thread in threads:
            thread.join(HANG_GUARD)
        assert [status for status, _, _ in failed] == [500, 500]
        assert all(answer["error"]["message"] == "generation failed: RuntimeError: the kernels fell over"
                   for _, _, answer in failed)
        assert sum(record.exc_info is not None for record in caplog.records) == 2  # each logged in full
        assert health(server)["slots_busy"] == 0
        again = client_of(server).chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPTS[2]}])
    with serving(alone_session, name="smollm2", parallel=1) as server:
        alone = client_of(server).chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPTS[2]}])
    assert again.choices[0].message.content == alone.choices[0].message.content


def test_full_slots_and_a_full_queue_answer_429_and_a_stop_cuts_every_open_stream(sessions):
    """Two slots busy and one request waiting (`--queue 1`): the next is refused with 429, and /metrics counts both
    slots running; stopping the server ends each open stream with an error event (no finish, no [DONE]) and the
    waiting request gets 503."""
    from prometheus_client.parser import text_string_to_metric_families

    _, parallel_session = sessions
    server_context = serving(parallel_session, name="smollm2", parallel=2, queue=1)
    server = server_context.__enter__()
    waiting: list = []
    try:
        client = client_of(server)
        streams = [_long(client) for _ in range(2)]
        for stream in streams:
            next(iter(stream))
        wait_until(lambda: health(server)["slots_busy"] == 2, "both slots to answer")
        thread = threading.Thread(target=lambda: waiting.append(raw_request(
            server, "POST", "/v1/chat/completions", json.dumps(
                {"messages": [{"role": "user", "content": PROMPTS[2]}], "max_tokens": 4}).encode())))
        thread.start()
        wait_until(lambda: health(server)["queued"] == 1, "a request to wait")
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPTS[3]}])
        assert int(refused.value.response.headers["retry-after"]) >= 1
        gauges = {sample.name: sample.value for family in text_string_to_metric_families(
            raw_text(server, "/metrics")) for sample in family.samples if sample.name.startswith("specdec:num_")}
        assert gauges == {"specdec:num_requests_running": 2, "specdec:num_requests_waiting": 1, "specdec:num_slots": 2}
    finally:
        server_context.__exit__(None, None, None)
    for stream in streams:
        with pytest.raises(openai.APIError) as cut:
            for _ in stream:
                pass
        assert "server" in str(cut.value).lower()
    thread.join(HANG_GUARD)
    status, _, answer = waiting[0]
    assert status == 503 and answer["error"]["code"] == "server_shutdown"


def test_sam_drafts_from_what_a_server_with_slots_answered(real_target, tmp_path):
    """With the answer memory on, each answer a slot finishes is remembered and a drafter rebuilt from the memory
    takes the next slot that begins: the same question asked again is drafted from the remembered answer."""
    from specdec_cli.decoding.generation_config import GenerationConfig
    from specdec_cli.drafters import target_info
    from specdec_cli.session.chat import ChatSession
    from specdec_cli.texts.memory import Memory

    loaded = real_target("float32", "auto")
    info = target_info(loaded.model, loaded.tokenizer)
    memory = Memory(tmp_path / "memory", info.fingerprint, "smollm2", cap=100_000)
    settings = _sam_settings(GenerationConfig(max_new_tokens=24))
    drafter = settings.run.drafter
    settings = replace(settings, run=replace(settings.run, drafter=replace(
        drafter, options=replace(drafter.options, memory=str(memory.directory)))))
    session = ChatSession(loaded.model, loaded.tokenizer, settings, memory, info)
    question = [{"role": "user", "content": "Tell me a story about a fox."}]
    with serving(session, name="smollm2") as server:
        assert health(server)["slots"] == 4
        client = client_of(server)
        first = client.chat.completions.create(model="m", messages=question, extra_body={"cache_prompt": False})
        wait_until(lambda: memory.recall().tokens >= first.usage.completion_tokens, "the answer to be remembered")
        wait_until(lambda: server.worker.fresh is not None, "a drafter to be rebuilt from the memory")
        again = client.chat.completions.create(model="m", messages=question, extra_body={"cache_prompt": False})
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.model_extra["timings"]["draft_sources"].get("sam-memory", 0) > 0


def test_ignore_eos_and_min_tokens_carry_the_answer_past_its_end_the_same_with_drafts_or_without(sessions):
    """llama-server's and vLLM's `ignore_eos` (to max_tokens) and vLLM's `min_tokens`: the answer goes past where
    it ended, the same with the server's drafts and with none; refused where it cannot hold (400 by name)."""
    _, parallel_session = sessions
    messages = [{"role": "user", "content": "Say hi."}]
    with serving(parallel_session, name="smollm2") as server:
        client = client_of(server)
        free = client.chat.completions.create(model="m", messages=messages, max_tokens=60)
        assert free.choices[0].finish_reason == "stop" and free.usage.completion_tokens < 30
        answers = []
        for speculative in ({"n_max": 0}, {"drafter": "sam"}):
            whole = client.chat.completions.create(model="m", messages=messages, max_tokens=60,
                                                   extra_body={"ignore_eos": True, "speculative": speculative})
            assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 60
            least = client.chat.completions.create(model="m", messages=messages, max_tokens=60,
                                                   extra_body={"min_tokens": 40, "speculative": speculative})
            assert least.usage.completion_tokens >= 40
            answers.append((whole.choices[0].message.content, least.choices[0].message.content))
        assert answers[0] == answers[1]
        assert answers[0][0].startswith(free.choices[0].message.content)  # the same answer, then past its end
        status, _, answer = raw_request(server, "POST", "/completion", json.dumps(
            {"prompt": "Hi", "n_predict": 12, "ignore_eos": True}).encode())
        assert status == 200 and len(answer["tokens"]) == 12, answer
        for bad, param in (({"ignore_eos": "yes"}, "ignore_eos"), ({"min_tokens": 61}, "min_tokens"),
                           ({"min_tokens": -1}, "min_tokens"),
                           ({"ignore_eos": True, "response_format": {"type": "json_object"}}, "ignore_eos")):
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(model="m", messages=messages, max_tokens=60, extra_body=bad)
            assert refused.value.body["param"] == param, bad


@pytest.mark.parametrize("parallel", [1, 4])
def test_a_next_turn_is_begun_while_the_server_waits_and_answers_the_same(sessions, monkeypatch, parallel):
    """Once an answer is sent and no request waits, the server computes the template's close of the answer and
    opening of a user turn into the prompt cache (Worker.compute_ahead): the next turn computes only the user's
    words and the assistant's header, and every answer is the one a server that does not compute ahead gives."""
    from specdec_cli.server.worker import Worker
    from specdec_cli.texts.prompt_ids import format_prompt, next_turn_ids, with_system

    session = sessions[1]
    tokenizer = session.tokenizer

    def converse() -> tuple[list[str], list[int], list[int]]:
        session.prompt_cache.clear()
        with serving(session, name="smollm2", parallel=parallel) as server:
            client = client_of(server)
            messages = [{"role": "user", "content": "Name three colours."}]
            answers, computed, expected = [], [], []
            for turn in range(3):
                reply = client.chat.completions.create(model="m", messages=messages, max_tokens=12)
                wait_until(lambda served=turn + 1: health(server)["served"] == served and not server.worker.ahead,
                           "the next turn's opening to be computed")
                answers.append(reply.choices[0].message.content)
                computed.append(reply.model_extra["timings"]["prompt_n"])
                messages = [*messages, {"role": "assistant", "content": answers[-1]}]
                opening = next_turn_ids(tokenizer, with_system(messages, session.system))
                messages.append({"role": "user", "content": "Go on."})
                expected.append(len(format_prompt(tokenizer, with_system(messages, session.system))) - len(opening))
        return answers, computed, expected

    answers, computed, expected = converse()
    assert computed[1:] == expected[:-1] and 0 < expected[0] < 12  # "Go on." and the assistant's header alone
    monkeypatch.setattr(Worker, "compute_ahead", lambda self: self.ahead.clear())
    without, computed_without, _ = converse()
    assert without == answers
    assert all(later > ahead for later, ahead in zip(computed_without[1:], computed[1:]))


@pytest.mark.parametrize("parallel", [1, 4])
def test_a_server_warms_up_with_what_every_conversation_begins_with(sessions, monkeypatch, parallel):
    """Before its first request a server computes the system message and a user turn's opening into the prompt
    cache (ChatSession.warm_up): the first request computes only its own words, and answers as a cold server."""
    from specdec_cli.session.chat import ChatSession
    from specdec_cli.texts.prompt_ids import next_turn_ids, with_system

    session = sessions[1]

    def first_request() -> tuple[str, int]:
        session.prompt_cache.clear()
        with serving(session, name="smollm2", parallel=parallel) as server:
            reply = client_of(server).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Name three colours."}], max_tokens=12)
        return reply.choices[0].message.content, reply.usage.prompt_tokens_details.cached_tokens

    answer, cached = first_request()
    assert cached == len(next_turn_ids(session.tokenizer, with_system([], session.system))) > 10
    monkeypatch.setattr(ChatSession, "warm_up", lambda self: 0)
    assert first_request() == (answer, 0)
