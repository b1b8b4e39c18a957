"""`specdec serve` on specdec's engine, driven by the real `openai` client (and raw HTTP for what a client would
never send): answers identical to the chat path's, streamed or not; the prompt cache; the error table; the key;
a client that goes away; a full queue; concurrent clients. Each server runs in this process on a free port
(uvicorn in a thread) and is always stopped. No test depends on speed: waits poll /health or the stream, bounded
by a hang guard.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from dataclasses import replace

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

HANG_GUARD = 120.0  # seconds: a wait that takes longer is stuck, not slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _chat_settings(target: str, max_new_tokens: int = 16, remember: bool = False, **values):
    from specdec_cli.session.chat import ChatSettings
    from specdec_cli.session.run_settings import run_settings

    return ChatSettings(run_settings("sam", target=target, dtype="float32", max_new_tokens=max_new_tokens, **values),
                        remember=remember)


def _sam_settings(generation):
    """A chat session's settings: sam drafting, these generation settings, the rest as the defaults."""
    from specdec_cli.session.chat import ChatSettings
    from specdec_cli.session.run_settings import DrafterSettings, RunSettings

    return ChatSettings(RunSettings(drafter=DrafterSettings("sam"), generation=generation))


@contextlib.contextmanager
def serving(session, name: str = "tiny", **changes):
    """A server around `session` on a free port, in this process; stopped on the way out, whatever happens."""
    from specdec_cli.listen import ListenSettings
    from specdec_cli.server.run import Server
    from specdec_cli.server.settings import ServerSettings

    listen = ListenSettings(port=_free_port(), api_key=changes.pop("api_key", None))
    settings = ServerSettings(listen=listen, **changes)
    server = Server(session, settings, name).start()
    try:
        yield server
    finally:
        server.stop()


def client_of(server, **options):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=options.pop("api_key", "unused"), max_retries=0,
                         timeout=HANG_GUARD, **options)


def raw_request(server, method: str, path: str, body: bytes = b"", headers=None) -> tuple[int, dict, dict]:
    """One HTTP request as bytes (what no client library would send): status, headers, JSON body."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=HANG_GUARD)
    try:
        connection.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        data = response.read()
        return response.status, dict(response.getheaders()), json.loads(data) if data else {}
    finally:
        connection.close()


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"stuck waiting for {what}")
        time.sleep(0.02)


def health(server) -> dict:
    return raw_request(server, "GET", "/health")[2]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    """The tiny model's session (what a server serves) and a chat session over the same model (the chat path)."""
    from specdec_cli.session.chat import ChatSession, open_session

    session, loaded = open_session(_chat_settings(tiny_model_dir))
    reference = ChatSession(loaded.model, loaded.tokenizer, _sam_settings(session.generation))
    return session, reference


@pytest.fixture(scope="module")
def endless(endless_model_dir):
    """A session on a model that practically never ends its answers (long enough to interrupt or queue behind)."""
    from specdec_cli.session.chat import open_session

    session, _ = open_session(_chat_settings(endless_model_dir, max_new_tokens=1500))
    return session


def _chat_answer(reference, messages: list[dict]) -> tuple[str, int]:
    """What the chat path answers to this conversation (history given, the last user turn asked)."""
    reference.clear()
    for user, assistant in zip(messages[::2], messages[1::2]):
        reference.ask(user["content"])
        assert reference.history[-1]["content"] == assistant["content"]  # the conversation the server was sent
    turn = reference.ask(messages[-1]["content"])
    return turn.answer, len(turn.generation.tokens)


# -- answers -------------------------------------------------------------------------------------------------------


def test_answers_equal_the_chat_path_streamed_or_not(tiny):
    session, reference = tiny
    messages = [{"role": "user", "content": "Tell me about cats."}]
    expected, tokens = _chat_answer(reference, messages)
    with serving(session) as server:
        client = client_of(server)
        whole = client.chat.completions.create(model="anything-at-all", messages=messages)
        assert whole.choices[0].message.content == expected
        assert whole.usage.completion_tokens == tokens and whole.model == "anything-at-all"
        assert whole.choices[0].finish_reason in ("stop", "length")
        figures = whole.model_extra["timings"]
        assert figures["drafter"] == "sam" and figures["predicted_n"] == tokens
        assert figures["draft_n_accepted"] <= figures["draft_n"] and figures["tokens_per_step"] >= 1.0

        chunks = list(client.chat.completions.create(model="x", messages=messages, stream=True,
                                                     stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        assert text == expected
        finish = [chunk.choices[0].finish_reason for chunk in chunks
                  if chunk.choices and chunk.choices[0].finish_reason]
        assert finish == [whole.choices[0].finish_reason]
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == tokens

        listed = client.models.list()
        assert [model.id for model in listed.data] == ["tiny"]


def test_text_completions_and_stop_strings(tiny):
    session, _ = tiny
    with serving(session) as server:
        client = client_of(server)
        whole = client.completions.create(model="m", prompt="Once upon a time", max_tokens=12)
        streamed = "".join(chunk.choices[0].text for chunk in
                           client.completions.create(model="m", prompt="Once upon a time", max_tokens=12, stream=True)
                           if chunk.choices)
        assert streamed == whole.choices[0].text and whole.usage.completion_tokens <= 12
        answer = whole.choices[0].text
        assert len(answer) >= 3
        stop = answer[2:4]  # a stop string inside the answer cuts it before its first occurrence
        cut = client.completions.create(model="m", prompt="Once upon a time", max_tokens=12, stop=[stop])
        assert cut.choices[0].text == answer[: answer.find(stop)] and cut.choices[0].finish_reason == "stop"
        streamed_cut = "".join(chunk.choices[0].text for chunk in client.completions.create(
            model="m", prompt="Once upon a time", max_tokens=12, stop=[stop], stream=True) if chunk.choices)
        assert streamed_cut == cut.choices[0].text


def test_sampling_settings_reach_the_engine(tiny):
    """temperature, top_p, top_k and seed are used (the answers' law is the engine's, tested there; a seed repeats
    an answer only where the drafts repeat too, since speculative sampling draws along the draft)."""
    session, _ = tiny
    with serving(session) as server:
        client = client_of(server)
        answers = [client.completions.create(model="m", prompt="Once upon a time", max_tokens=12, temperature=0.9,
                                             top_p=0.95, seed=seed, extra_body={"top_k": 20})
                   for seed in range(4)]
        assert all(answer.usage.completion_tokens <= 12 for answer in answers)
        assert len({answer.choices[0].text for answer in answers}) > 1  # sampled, not greedy in disguise
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model="m", prompt="x", temperature=-1)
        assert refused.value.body["param"] == "temperature"


def test_the_prompt_cache_computes_only_the_new_tokens(tiny):
    """A conversation resent whole: the second turn computes only what the first did not hold, and answers as the
    chat path's second turn does."""
    session, reference = tiny
    with serving(session) as server:
        client = client_of(server)
        first_messages = [{"role": "user", "content": "Name a colour."}]
        first = client.chat.completions.create(model="m", messages=first_messages)
        second_messages = first_messages + [{"role": "assistant", "content": first.choices[0].message.content},
                                            {"role": "user", "content": "And another one?"}]
        second = client.chat.completions.create(model="m", messages=second_messages)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens  # at least the first prompt's entries were reused
    computed = second.model_extra["timings"]["prompt_n"]
    assert computed == second.usage.prompt_tokens - cached
    first_turn_context = first.usage.prompt_tokens + first.usage.completion_tokens
    assert computed <= second.usage.prompt_tokens - first_turn_context + 8  # the new turn's tokens (and the
    # template's few tokens around the answer, which the answer's own tokens may not equal)
    expected, _ = _chat_answer(reference, second_messages)
    assert second.choices[0].message.content == expected


def test_min_p_reaches_the_engine(tiny):
    """min_p 1 keeps only the likeliest token: sampled at any temperature, the answer is the greedy one."""
    session, _ = tiny
    with serving(session) as server:
        client = client_of(server)
        greedy = client.completions.create(model="m", prompt="Once upon a time", max_tokens=12, temperature=0)
        for seed in range(3):
            kept = client.completions.create(model="m", prompt="Once upon a time", max_tokens=12, temperature=1.5,
                                             seed=seed, extra_body={"min_p": 1.0})
            assert kept.choices[0].text == greedy.choices[0].text
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model="m", prompt="x", extra_body={"min_p": 2})
        assert refused.value.body["param"] == "min_p"


def test_fields_that_would_change_the_answer_are_refused_by_name_not_dropped(tiny):
    """Penalties, tools on text completions: a 400 naming the field (the answer would not be what
    the client asked for); the same fields at their neutral values, and fields that change nothing, are
    answered."""
    session, _ = tiny
    messages = [{"role": "user", "content": "hi"}]
    tool = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
    with serving(session) as server:
        client = client_of(server)
        for asked, param in (({"extra_body": {"repetition_penalty": 1.1, "repeat_penalty": 1.1}}, "repetition_penalty"),
                             ({"extra_body": {"frequency_penalty": 3}}, "frequency_penalty")):
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(model="m", messages=messages, max_tokens=2, **asked)
            assert refused.value.body["param"] == param, asked
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model="m", prompt="x", max_tokens=2, echo=True)
        assert refused.value.body["param"] == "echo"
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model="m", prompt="x", max_tokens=2, extra_body={"tools": [tool]})
        assert refused.value.body["param"] == "tools"
        status, _, answer = raw_request(server, "POST", "/completion", b'{"prompt": "x", "repetition_penalty": 1.2}')
        assert status == 400 and answer["error"]["param"] == "repetition_penalty"  # (llama.cpp's: repeat_penalty)
        status, _, answer = raw_request(server, "POST", "/completion", b'{"prompt": "x", "mirostat": 2}')
        assert status == 400 and answer["error"]["param"] == "mirostat"
        status, _, answer = raw_request(server, "POST", "/completion", b'{"prompt": "x", "n_predict": 2, '
                                                                        b'"echo": true}')
        assert status == 400 and answer["error"]["param"] == "echo", answer
        neutral = client.chat.completions.create(
            model="m", messages=messages, max_tokens=2, presence_penalty=0, frequency_penalty=0,
            response_format={"type": "text"}, user="me", store=False, parallel_tool_calls=False,
            extra_body={"repetition_penalty": 1.0, "no_such_field": 3})
        assert neutral.choices[0].message.content is not None


def test_a_logit_bias_and_penalties_are_honoured_with_and_without_drafts(tiny):
    """`logit_bias` (OpenAI's object, llama-server's pairs with false for a ban), OpenAI's presence and frequency
    penalties, vLLM's `repetition_penalty` and llama-server's windowed ones on `/completion`: the answer is plain
    decoding's with them, whichever drafter verifies it; a token outside
    the vocabulary or a bias past 100 is a 400 naming the field."""
    session, _ = tiny
    messages = [{"role": "user", "content": "hi"}]
    with serving(session) as server:
        client = client_of(server)
        free = client.chat.completions.create(model="m", messages=messages, max_tokens=12, logprobs=True)
        first = free.choices[0].logprobs.content[0].token
        banned = session.tokenizer.convert_tokens_to_ids(first) if hasattr(session.tokenizer, "convert_tokens_to_ids") \
            else session.tokenizer.encode(first, add_special_tokens=False)[0]
        answers = [client.chat.completions.create(model="m", messages=messages, max_tokens=12,
                                                  logit_bias={str(banned): -100},
                                                  extra_body={"speculative": speculative}).choices[0].message.content
                   for speculative in ({"n_max": 0}, {})]
        assert answers[0] == answers[1] != free.choices[0].message.content
        penalised = [client.chat.completions.create(model="m", messages=messages, max_tokens=12, presence_penalty=2,
                                                    frequency_penalty=1, extra_body={"speculative": speculative})
                     .choices[0].message.content for speculative in ({"n_max": 0}, {})]
        assert penalised[0] == penalised[1] != free.choices[0].message.content
        repeated = [client.chat.completions.create(model="m", messages=messages, max_tokens=12, extra_body={
            "repetition_penalty": 3.0, "speculative": speculative}).choices[0].message.content
            for speculative in ({"n_max": 0}, {})]
        assert repeated[0] == repeated[1] != free.choices[0].message.content
        windowed = []
        for speculative in ({"n_max": 0}, {}):  # llama-server's: all three over the last repeat_last_n tokens
            status, _, answer = raw_request(server, "POST", "/completion", json.dumps(
                {"prompt": "hi hi hi", "n_predict": 12, "ignore_eos": True, "repeat_penalty": 3.0, "repeat_last_n": 8,
                 "presence_penalty": 1, "speculative": speculative}).encode())
            assert status == 200, answer
            windowed.append(answer["content"])
        status, _, plain = raw_request(server, "POST", "/completion",
                                       b'{"prompt": "hi hi hi", "n_predict": 12, "ignore_eos": true}')
        assert windowed[0] == windowed[1] != plain["content"]
        dry = []
        for speculative in ({"n_max": 0}, {}):  # llama-server's DRY
            status, _, answer = raw_request(server, "POST", "/completion", json.dumps(
                {"prompt": "hi hi hi", "n_predict": 12, "ignore_eos": True, "dry_multiplier": 3.0,
                 "dry_allowed_length": 0, "speculative": speculative}).encode())
            assert status == 200, answer
            dry.append(answer["content"])
        assert dry[0] == dry[1] != plain["content"]
        status, _, answer = raw_request(server, "POST", "/completion", json.dumps(
            {"prompt": "x", "n_predict": 4, "logit_bias": [[banned, False]]}).encode())
        assert status == 200, answer
        for bias in ({"99999999": 1}, {str(banned): 101}, [[banned]], {"x": 1}):
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(model="m", messages=messages, max_tokens=2, logit_bias=bias)
            assert refused.value.body["param"] == "logit_bias", bias


def test_a_request_chooses_its_speculation_and_gets_the_same_answer(tiny):
    """`speculative.n_max` (0: plain decoding) and `speculative.drafter` (none, or the server's own) per request:
    greedy answers identical whichever is chosen, the choice reported in `timings`; anything else is a 400."""
    session, _ = tiny
    messages = [{"role": "user", "content": "Repeat: red green blue, red green blue, red green"}]
    with serving(session) as server:
        client = client_of(server)
        answers, reported = [], []
        for speculative in (None, {"n_max": 0}, {"n_max": 2}, {"drafter": "none"}, {"drafter": "sam", "n_max": 6}):
            extra = {} if speculative is None else {"extra_body": {"speculative": speculative}}
            answer = client.chat.completions.create(model="m", messages=messages, max_tokens=24, **extra)
            answers.append(answer.choices[0].message.content)
            timings = answer.model_extra["timings"]
            reported.append((timings["drafter"], timings["n_max"], timings["draft_n"]))
        assert len(set(answers)) == 1 and answers[0]
        assert reported[1][:2] == ("none", 0) and reported[1][2] == 0 and reported[3][:2] == ("none", 0)
        assert reported[2][:2] == ("sam", 2) and reported[4][:2] == ("sam", 6)
        status, _, whole = raw_request(server, "POST", "/completion", json.dumps(
            {"prompt": "red green blue, red green", "n_predict": 8, "speculative.n_max": 0}).encode())
        assert status == 200 and whole["timings"]["n_max"] == 0, whole
        for bad, param in (({"drafter": "eagle"}, "speculative.drafter"), ({"n_max": -1}, "speculative.n_max"),
                           ({"n_min": 2}, "speculative")):
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(model="m", messages=messages, max_tokens=2,
                                               extra_body={"speculative": bad})
            assert refused.value.body["param"] == param


def test_log_probabilities_are_plain_decodings_whole_or_streamed_with_or_without_drafts(tiny_model_dir):
    """`logprobs`/`top_logprobs` (chat), `logprobs` (text), `n_probs` (/completion): the tokens' texts make the
    answer, and the numbers are the same bits with speculation and without (n_max 0), streamed or whole, with the
    prompt cache or without (exact verification, as on block weights and 16-bit dtypes by default: each row's bits
    whatever the block)."""
    from conftest import fixed_planner

    from specdec_cli.session.chat import open_session

    session = fixed_planner(open_session(_chat_settings(tiny_model_dir, exact=True))[0])
    messages = [{"role": "user", "content": "Repeat: red green blue, red green blue, red green"}]
    with serving(session) as server:
        client = client_of(server)

        def chat(n_max=None):
            extra = {} if n_max is None else {"extra_body": {"speculative": {"n_max": n_max}}}
            return client.chat.completions.create(model="m", messages=messages, max_tokens=24, logprobs=True,
                                                  top_logprobs=3, **extra)

        drafted, plain = chat(), chat(0)
        assert drafted.model_extra["timings"]["draft_n"] > 0  # verified with drafts (test_logprobs.py: accepted)
        entries = drafted.choices[0].logprobs.content
        specials = set(session.tokenizer.all_special_tokens)  # named in `token`, absent from the answer's text
        assert "".join(entry.token for entry in entries if entry.token not in specials) == \
            drafted.choices[0].message.content
        assert all(len(entry.top_logprobs) == 3 and entry.logprob <= 0 for entry in entries)
        assert all(entry.top_logprobs[0].logprob >= entry.logprob for entry in entries)  # greedy: the best
        as_numbers = [(entry.token, entry.logprob, [(top.token, top.logprob) for top in entry.top_logprobs])
                      for entry in entries]
        assert as_numbers == [(entry.token, entry.logprob, [(top.token, top.logprob) for top in entry.top_logprobs])
                              for entry in plain.choices[0].logprobs.content]
        streamed = []
        for piece in client.chat.completions.create(model="m", messages=messages, max_tokens=24, logprobs=True,
                                                    top_logprobs=3, stream=True):
            if piece.choices and piece.choices[0].logprobs:
                streamed += [(entry.token, entry.logprob, [(top.token, top.logprob) for top in entry.top_logprobs])
                             for entry in piece.choices[0].logprobs.content]
        assert streamed == as_numbers
        text = client.completions.create(model="m", prompt="red green blue, red green blue,", max_tokens=12,
                                         logprobs=2)
        legacy = text.choices[0].logprobs
        assert "".join(token for token in legacy.tokens if token not in specials) == text.choices[0].text
        assert len(legacy.top_logprobs[0]) == 2
        assert legacy.text_offset[0] == 0 and len(legacy.token_logprobs) == len(legacy.tokens)
        status, _, whole = raw_request(server, "POST", "/completion", json.dumps(
            {"prompt": "red green blue, red green blue,", "n_predict": 12, "n_probs": 2}).encode())
        assert status == 200 and [entry["logprob"] for entry in whole["completion_probabilities"]] == \
            legacy.token_logprobs
        assert chat(0).choices[0].logprobs is not None
        assert client.chat.completions.create(model="m", messages=messages, max_tokens=4).choices[0].logprobs is None


def test_json_output_keeps_its_schema_and_speculation_keeps_the_answer(tiny):
    """response_format json_schema and json_object, llama-server's json_schema and GBNF grammar: the answer parses
    and validates, and is the same with drafts and without (n_max 0); a schema the engine cannot read is a 400."""
    import jsonschema

    session, _ = tiny
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]},
                                               "count": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["colour", "count"], "additionalProperties": False}
    messages = [{"role": "user", "content": "Give a colour and a count as JSON."}]
    with serving(session) as server:
        client = client_of(server)
        answers = []
        for speculative in (None, {"n_max": 0}):
            extra = {} if speculative is None else {"extra_body": {"speculative": speculative}}
            answer = client.chat.completions.create(model="m", messages=messages, max_tokens=60, response_format={
                "type": "json_schema", "json_schema": {"name": "pick", "schema": schema, "strict": True}}, **extra)
            assert answer.choices[0].finish_reason == "stop"
            jsonschema.validate(json.loads(answer.choices[0].message.content), schema)
            answers.append(answer.choices[0].message.content)
        assert answers[0] == answers[1]
        anything = client.chat.completions.create(model="m", messages=messages, max_tokens=60,
                                                  response_format={"type": "json_object"})
        if anything.choices[0].finish_reason == "stop":  # (a free object may run past max_tokens)
            assert isinstance(json.loads(anything.choices[0].message.content), dict)
        status, _, whole = raw_request(server, "POST", "/completion", json.dumps(
            {"prompt": "yes or no?", "n_predict": 8, "grammar": 'root ::= "yes" | "no"'}).encode())
        assert status == 200 and whole["content"] in ("yes", "no"), whole
        status, _, whole = raw_request(server, "POST", "/completion", json.dumps(
            {"prompt": "a colour:", "n_predict": 40, "json_schema": schema}).encode())
        assert status == 200 and json.loads(whole["content"])["colour"] in ("red", "green", "blue")
        nonsense = {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}
        for bad, param in ((nonsense, "response_format"), ({"type": "xml"}, "response_format")):
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(model="m", messages=messages, max_tokens=4, response_format=bad)
            assert refused.value.body["param"] == param


def test_tokenize_and_detokenize_as_llama_server_shapes_them(tiny):
    session, _ = tiny
    tokenizer = session.tokenizer
    with serving(session) as server:
        status, _, tokens = raw_request(server, "POST", "/tokenize", b'{"content": "Hello world"}')
        assert status == 200 and tokens["tokens"] == tokenizer.encode("Hello world", add_special_tokens=False)
        status, _, pieces = raw_request(server, "POST", "/tokenize", b'{"content": "Hello world", "with_pieces": true}')
        assert [piece["id"] for piece in pieces["tokens"]] == tokens["tokens"]
        assert "".join(piece["piece"] for piece in pieces["tokens"]) == "Hello world"
        status, _, text = raw_request(server, "POST", "/detokenize", json.dumps({"tokens": tokens["tokens"]}).encode())
        assert status == 200 and text["content"] == "Hello world"
        for path, body, param in (("/tokenize", b'{"content": 5}', "content"),
                                  ("/detokenize", b'{"tokens": [1, -2]}', "tokens"),
                                  ("/detokenize", b'{"tokens": [99999999]}', "tokens")):
            status, _, answer = raw_request(server, "POST", path, body)
            assert status == 400 and answer["error"]["param"] == param


def _preflight(server, headers: dict) -> tuple[int, dict]:
    """A browser's preflight request (its body is text, not JSON): the status and the headers, names lowered."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=HANG_GUARD)
    try:
        connection.request("OPTIONS", "/v1/chat/completions", headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status, {name.lower(): value for name, value in response.getheaders()}
    finally:
        connection.close()


def test_cors_only_for_the_origins_named(tiny):
    """No CORS headers unless --cors-origins names the page's origin; a browser's preflight is answered without the
    key; `*` is refused where others reach the server without a key."""
    from specdec_cli.errors import SpecdecError
    from specdec_cli.listen import ListenSettings
    from specdec_cli.server.settings import ServerSettings

    session, _ = tiny
    preflight = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    with serving(session) as server:
        _, headers, _ = raw_request(server, "GET", "/v1/models", headers={"Origin": "http://localhost:3000"})
        assert "access-control-allow-origin" not in {name.lower() for name in headers}
    with serving(session, cors_origins=("http://localhost:3000",), api_key="k") as server:
        status, headers = _preflight(server, preflight)
        assert status == 200 and headers["access-control-allow-origin"] == "http://localhost:3000"
        status, headers, _ = raw_request(server, "GET", "/v1/models", headers={
            "Origin": "http://localhost:3000", "Authorization": "Bearer k"})
        assert status == 200 and {name.lower(): value for name, value in headers.items()}[
            "access-control-allow-origin"] == "http://localhost:3000"
        status, headers = _preflight(server, {**preflight, "Origin": "http://evil.example"})
        assert status == 400 and "access-control-allow-origin" not in headers
    with pytest.raises(SpecdecError, match="any web page could use"):
        ServerSettings(listen=ListenSettings(host="0.0.0.0"), cors_origins=("*",)).check()
    with pytest.raises(SpecdecError, match="is not an origin"):
        ServerSettings(cors_origins=("localhost:3000/app",)).check()
    ServerSettings(listen=ListenSettings(host="0.0.0.0", api_key="k"), cors_origins=("*",)).check()


# -- errors ----------------------------------------------------------------------------------------------------------


def _good(server) -> None:
    assert client_of(server).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2).choices[0].message.content is not None


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", b'{"messages": [', None),  # malformed JSON
    ("/v1/chat/completions", b"[1, 2]", None),  # not an object
    ("/v1/chat/completions", b'{"messages": "hi"}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "hi"}]}', "messages[0].role"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}', "max_tokens"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "5"}', "max_tokens"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 99999999}',
     "max_tokens"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}',
     "temperature"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "top_p": 0}', "top_p"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', "stream"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "stop": [1]}', "stop"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "n": 2}', "n"),
    ("/v1/completions", b'{"prompt": 7}', "prompt"),
    ("/v1/completions", b'{"prompt": [1, 99999]}', "prompt"),
])
def test_bad_requests_get_openai_errors_and_the_server_stays_up(tiny, path, body, param):
    session, _ = tiny
    with serving(session) as server:
        status, _, answer = raw_request(server, "POST", path, body)
        assert status == 400, answer
        error = answer["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
        assert error["param"] == param and "\n" not in error["message"] and error["message"]
        _good(server)


def test_the_rest_of_the_error_table(tiny):
    """A prompt longer than the context, an oversized body, an unknown route or method, the typed client's 400."""
    session, _ = tiny
    with serving(session, max_body_bytes=64 * 1024) as server:
        client = client_of(server)
        with pytest.raises(openai.BadRequestError) as too_long:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 3000}])
        assert too_long.value.status_code == 400 and too_long.value.code == "context_length_exceeded"
        with pytest.raises(openai.BadRequestError):  # also when streaming: refused before the stream starts
            list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 3000}],
                                                stream=True))
        status, _, answer = raw_request(server, "POST", "/v1/chat/completions", b'{"messages": "' + b"x" * 70000
                                        + b'"}')
        assert status == 413 and answer["error"]["type"] == "invalid_request_error"
        assert raw_request(server, "GET", "/v1/nowhere")[0] == 404
        status, _, answer = raw_request(server, "GET", "/v1/chat/completions")
        assert status == 405 and "error" in answer
        with pytest.raises(openai.BadRequestError) as out_of_range:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=-3)
        assert out_of_range.value.body["param"] == "max_tokens"
        _good(server)


def test_a_failure_inside_generation_is_a_500_and_the_next_request_is_served(tiny, monkeypatch, caplog):
    session, _ = tiny
    generate = session.generate
    calls = []

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the kernels fell over\nsecond line")
        return generate(*args, **kwargs)

    monkeypatch.setattr(session, "generate", failing_once)
    with serving(session) as server, caplog.at_level("ERROR", logger="specdec.server"):
        status, _, answer = raw_request(server, "POST", "/v1/chat/completions",
                                        b'{"messages": [{"role": "user", "content": "hi"}]}')
        assert status == 500 and answer["error"]["type"] == "server_error"
        assert answer["error"]["message"] == "generation failed: RuntimeError: the kernels fell over"
        assert any(record.exc_info for record in caplog.records)  # the traceback is logged
        _good(server)


def test_a_bug_outside_generation_is_a_json_500_too(tiny, monkeypatch):
    session, _ = tiny

    def broken(self, *args, **kwargs):
        raise ValueError("a bug in the request path")

    monkeypatch.setattr("specdec_cli.server.requests.CompletionRequest.generation", broken)
    with serving(session) as server:
        status, _, answer = raw_request(server, "POST", "/v1/chat/completions",
                                        b'{"messages": [{"role": "user", "content": "hi"}]}')
        assert status == 500 and answer["error"]["message"] == "internal error: ValueError: a bug in the request path"
        monkeypatch.undo()
        _good(server)


def test_the_api_key(tiny, monkeypatch):
    session, _ = tiny
    with serving(session, api_key="s3cret") as server:
        with pytest.raises(openai.AuthenticationError):
            client_of(server, api_key="wrong").models.list()
        status, _, answer = raw_request(server, "POST", "/v1/chat/completions", b"{}")
        assert status == 401 and answer["error"]["type"] == "authentication_error"
        assert client_of(server, api_key="s3cret").models.list().data
        assert health(server)["status"] == "ok"  # /health needs no key, as llama-server's


def test_the_key_comes_from_the_environment(monkeypatch):
    from specdec_cli.server.settings import API_KEY_ENV, server_settings

    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert server_settings(drafter="pld").listen.api_key == "from-env"
    assert server_settings(drafter="pld", api_key="flag").listen.api_key == "flag"
    assert not server_settings(drafter="pld", host="0.0.0.0").open_to_others
    monkeypatch.delenv(API_KEY_ENV)
    assert server_settings(drafter="pld", host="0.0.0.0").open_to_others
    assert not server_settings(drafter="pld", host="::1").open_to_others


# -- the queue, disconnects, concurrent clients -------------------------------------------------------------------


def test_a_client_that_disconnects_stops_its_generation_and_the_next_is_served(endless, monkeypatch):
    from specdec_cli.server.worker import Cancelled

    generate, ended = endless.generate, []

    def recording(prompt_ids, config, on_event=None, **options):
        try:
            generation = generate(prompt_ids, config, on_event, **options)
        except Cancelled:
            ended.append("cancelled")
            raise
        ended.append(len(generation.tokens))
        return generation

    monkeypatch.setattr(endless, "generate", recording)
    with serving(endless) as server:
        client = client_of(server)
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go on"}],
                                                stream=True, max_tokens=1500)
        pieces = 0
        for chunk in stream:
            pieces += bool(chunk.choices and chunk.choices[0].delta.content)
            if pieces >= 2:
                break
        stream.close()
        wait_until(lambda: ended, "the generation to stop")
        assert ended == ["cancelled"]
        wait_until(lambda: not health(server)["busy"], "the worker to be free")
        answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert answer.usage.completion_tokens == 3 and ended[-1] == 3


def test_a_full_queue_answers_429_with_retry_after(endless):
    with serving(endless, queue=1) as server:
        client = client_of(server)
        running = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "one"}],
                                                 stream=True, max_tokens=1500)
        next(iter(running))  # the first is being answered
        waiting: list = []
        thread = threading.Thread(target=lambda: waiting.append(client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "two"}], max_tokens=4)))
        thread.start()
        try:
            wait_until(lambda: health(server)["queued"] == 1, "the second request to wait")
            with pytest.raises(openai.RateLimitError) as refused:
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "three"}])
            assert int(refused.value.response.headers["retry-after"]) >= 1
            assert refused.value.body["type"] == "rate_limit_error"
        finally:
            running.close()  # the first goes away: the waiting one is answered
            thread.join(HANG_GUARD)
        assert waiting and waiting[0].usage.completion_tokens == 4


def test_concurrent_clients_are_answered_in_turn_as_if_alone(tiny):
    session, _ = tiny
    prompts = ["alpha", "beta", "gamma"]
    with serving(session) as server:
        client = client_of(server)
        alone = {prompt: client.completions.create(model="m", prompt=prompt, max_tokens=8).choices[0].text
                 for prompt in prompts}
        results: list = []

        def ask(prompt: str, stream: bool) -> None:
            if stream:
                text = "".join(chunk.choices[0].text for chunk in client.completions.create(
                    model="m", prompt=prompt, max_tokens=8, stream=True) if chunk.choices)
            else:
                text = client.completions.create(model="m", prompt=prompt, max_tokens=8).choices[0].text
            results.append((prompt, text))

        threads = [threading.Thread(target=ask, args=(prompt, index % 2 == 0))
                   for index, prompt in enumerate(prompts * 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(HANG_GUARD)
        assert sorted(results) == sorted((prompt, alone[prompt]) for prompt in prompts * 2)
        wait_until(lambda: health(server)["served"] == 9, "the worker to count its answers")  # counted after sending


# -- the default model and the command line --------------------------------------------------------------------


def test_the_default_model_answers_as_the_chat_path(real_target):
    from specdec_cli.decoding.generation_config import GenerationConfig
    from specdec_cli.session.chat import ChatSession

    loaded = real_target("float32", "auto")
    generation = GenerationConfig(max_new_tokens=24)
    session = ChatSession(loaded.model, loaded.tokenizer, _sam_settings(generation))
    reference = ChatSession(loaded.model, loaded.tokenizer, _sam_settings(replace(generation)))
    messages = [{"role": "user", "content": "Explain what a compiler does, briefly."}]
    expected, tokens = _chat_answer(reference, messages)
    with serving(session, name="smollm2") as server:
        client = client_of(server)
        whole = client.chat.completions.create(model="gpt-4o", messages=messages)
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
            model="gpt-4o", messages=messages, stream=True) if chunk.choices)
    assert whole.choices[0].message.content == expected == streamed
    assert whole.usage.completion_tokens == tokens


@pytest.mark.parametrize("args, needle", [
    (["--queue", "0"], "--queue must be in 1..4096"),
    (["--queue", "100000000"], "--queue must be in 1..4096"),
    (["--max-connections", "0"], "--max-connections must be in 1..65536"),
    (["--timeout", "0"], "--timeout must be a number of seconds"),
    (["--timeout", "nan"], "--timeout must be a number of seconds"),
    (["--api-key", " padded "], "--api-key must not begin or end with spaces"),
    (["--api-key", "clé"], "--api-key must be printable ASCII"),
    (["--port", "70000"], "--port must be in 1..65535"),
    (["--drafter", "nope"], "nope"),
    (["--cors-origins", "*", "--host", "0.0.0.0"], "--cors-origins *: any web page could use"),
    (["--cors-origins", "example.com/x"], "--cors-origins: 'example.com/x' is not an origin"),
    (["--max-num-seqs", "4"], "--max-num-seqs 4"),
    (["--parallel", "9"], "--parallel must be in 1..8"),
    (["--parallel", "many"], "--parallel must be auto or a count in 1..8"),
    (["--min-match", "2"], "--min-match: only --engine vllm uses it"),
    (["--engine", "vllm", "--queue", "3", "--aux", "pld"], "--aux, --queue: only --engine specdec uses them"),
])
def test_bad_serve_flags_are_one_line_before_the_model_loads(args, needle):
    from conftest import assert_one_line_error, invoke

    assert_one_line_error(invoke("serve", *args), needle)


def test_a_port_in_use_is_one_line_before_the_model_loads():
    from conftest import assert_one_line_error, invoke

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = invoke("serve", "--port", str(port), "-m", "/nonexistent-model-dir")  # refused before the load
    assert_one_line_error(result, f"cannot listen on 127.0.0.1:{port}")


def test_an_empty_key_in_the_environment_is_refused(monkeypatch):
    from conftest import assert_one_line_error, invoke

    assert_one_line_error(invoke("serve", env_extra={"SPECDEC_API_KEY": " "}), "SPECDEC_API_KEY")


def test_the_command_serves_until_sigterm(tiny_model_dir):
    """`specdec serve` as users start it: one line says where it serves, a request is answered, SIGTERM (a service
    manager's stop) stops it in one line with exit 0, as Ctrl-C does; no traceback."""
    import signal
    import subprocess
    import sys
    import urllib.request

    from conftest import cli_env

    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "specdec_cli", "serve", "-m", tiny_model_dir, "--port", str(port),
                               "--threads", "1", "-n", "4"], env=cli_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        def up() -> bool:
            assert server.poll() is None, server.communicate()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    return response.status == 200
            except OSError:
                return False

        wait_until(up, "the server to listen")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0, timeout=HANG_GUARD)
        answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert answer.usage.completion_tokens == 4  # the server's --max-new-tokens where a request sends none
        server.send_signal(signal.SIGTERM)
        _, stderr = server.communicate(timeout=HANG_GUARD)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 0, stderr
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines[0].startswith("serving ") and f"http://127.0.0.1:{port}/v1" in lines[0]
    assert lines[1:] == ["server stopped (SIGTERM)"], stderr


def test_streamed_text_never_takes_back_what_it_sent(real_target):
    """Token by token on the default model's byte-level tokenizer: split UTF-8 characters wait for their last byte,
    the last characters wait while they could begin a stop string, and the pieces add up to the answer."""
    from specdec_cli.texts.text_stream import TextStream

    tokenizer = real_target("float32", "auto").tokenizer
    text = "Café — naïve 🙂 façade: 東京 is big.\n  Indented line, end."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    for stop in ((), ("d.!",)):  # the text ends in "d.", which may still begin the stop string
        stream = TextStream(tokenizer, stop)
        pieces = [stream.add([token]) for token in ids]
        assert all("\ufffd" not in piece for piece in pieces)
        if stop:
            assert "".join(pieces) == text[:-2]  # the held-back tail goes out at the end
        assert "".join(pieces) + stream.finish(text) == text


def test_llama_cpp_endpoints_let_bench_measure_a_running_server(tiny):
    """`specdec bench --reference URL` reads a running server through llama.cpp's /completion and /props: its
    client (bench/llama_server.py) gets the same token ids the engine answers, and llama.cpp's timings."""
    from specdec_cli.bench.llama_server import LlamaServer
    from specdec_cli.decoding.generation_config import GenerationConfig

    session, _ = tiny
    prompt_ids = list(session.tokenizer("Once upon a time")["input_ids"])
    config = GenerationConfig(max_new_tokens=6, eos_token_ids=session.info.eos_token_ids)
    session.prompt_cache.clear()
    expected = session.generate(prompt_ids, config).tokens
    with serving(session) as server:
        reference = LlamaServer("llama-server@here", url=f"http://127.0.0.1:{server.port}")
        reference.start()
        assert reference.n_ctx == 2048 and reference.spec_types == "specdec:sam"
        turn = reference.generate(prompt_ids, config)
        assert turn.tokens == expected and turn.seconds > 0 and turn.drafted is not None
        assert turn.finish == ("eos" if expected[-1] in config.eos_token_ids else "length")
        assert reference.report()["build_info"].startswith("specdec")  # the bench names it `specdec serve`
        status, _, answer = raw_request(server, "POST", "/completion", json.dumps(
            {"prompt": "Once upon a time", "n_predict": 6, "stream": "yes"}).encode())
        assert status == 400 and answer["error"]["param"] == "stream"  # (streamed: test_server_fim.py)


def test_sam_learns_from_what_the_server_answered(tiny_model_dir, tmp_path, monkeypatch):
    """With the answer memory on, each answer is remembered and a drafter rebuilt from the memory takes over at the
    next new conversation: the same question asked afresh is drafted from the remembered answer."""
    from specdec_cli.session.chat import open_session

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    monkeypatch.delenv("SPECDEC_NO_MEMORY", raising=False)
    session, _ = open_session(_chat_settings(tiny_model_dir, max_new_tokens=24, remember=True))
    question = [{"role": "user", "content": "Tell me a story about a fox."}]
    with serving(session) as server:
        client = client_of(server)
        first = client.chat.completions.create(model="m", messages=question)
        assert session.memory is not None
        wait_until(lambda: session.memory.recall().tokens >= first.usage.completion_tokens,
                   "the answer to be remembered (once its client has it)")
        wait_until(lambda: server.worker.fresh is not None, "the drafter to be rebuilt from the memory")
        before = session.drafter
        again = client.chat.completions.create(model="m", messages=question)
        assert session.drafter is not before
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.model_extra["timings"]["draft_sources"].get("sam-memory", 0) > 0


def test_opening_a_session_reads_the_targets_facts_once(tiny_model_dir, tmp_path, monkeypatch):
    """open_session's answer memory and the session share one target_info: the tokenizer's fingerprint (a hash of
    the whole vocabulary, a tenth of a second or more for a real one) is worked out once a load."""
    import specdec_cli.drafters.target as target
    from specdec_cli.session.chat import open_session

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    monkeypatch.delenv("SPECDEC_NO_MEMORY", raising=False)
    fingerprints = []
    fingerprint = target.tokenizer_fingerprint
    monkeypatch.setattr(target, "tokenizer_fingerprint", lambda tokenizer: fingerprints.append(1) or
                        fingerprint(tokenizer))
    session, _ = open_session(_chat_settings(tiny_model_dir, remember=True))
    assert fingerprints == [1] and session.memory is not None
    assert session.info.fingerprint == session.memory.fingerprint == fingerprint(session.tokenizer)


def test_metrics_count_requests_tokens_and_drafts_in_prometheus_format(tiny):
    """/metrics (behind the key like the rest): after answers, the request, token and speculation counters say what
    the responses' usage and timings said, in a format prometheus-client's own parser reads."""
    from prometheus_client.parser import text_string_to_metric_families

    session, _ = tiny
    with serving(session, api_key="k") as server:
        assert raw_request(server, "GET", "/metrics")[0] == 401
        client = client_of(server, api_key="k")
        answers = [client.chat.completions.create(model="m", max_tokens=12, messages=[
            {"role": "user", "content": content}]) for content in ("Count: one two three", "Count: one two three")]
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=HANG_GUARD)
        connection.request("GET", "/metrics", headers={"Authorization": "Bearer k"})
        response = connection.getresponse()
        text = response.read().decode()
        connection.close()
    assert response.status == 200 and response.getheader("content-type").startswith("text/plain")
    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in text_string_to_metric_families(text) for sample in family.samples}

    def total(name: str) -> float:
        return sum(value for (sample, _), value in samples.items() if sample == name)

    assert total("specdec:request_success_total") == 2
    assert total("specdec:generation_tokens_total") == sum(answer.usage.completion_tokens for answer in answers)
    assert total("specdec:prompt_tokens_total") + total("specdec:prompt_tokens_cached_total") == \
        sum(answer.usage.prompt_tokens for answer in answers)
    assert total("specdec:prompt_tokens_cached_total") > 0  # the second request's prompt came from the cache
    timings = [answer.model_extra["timings"] for answer in answers]
    assert total("specdec:spec_decode_num_draft_tokens_total") == sum(figures["draft_n"] for figures in timings)
    assert total("specdec:spec_decode_num_accepted_tokens_total") == \
        sum(figures["draft_n_accepted"] for figures in timings) == \
        total("specdec:spec_decode_num_accepted_tokens_per_pos_total")
    assert total("specdec:time_to_first_token_seconds_count") == 2
    assert samples[("specdec:num_requests_waiting", ())] == 0


def test_the_grammar_engine_reads_the_tokenizer_before_the_first_grammar_request(tiny):
    """llguidance's view of a tokenizer takes about a second to build: a server builds it in the background as it
    starts, so its first JSON-schema request does not wait for it."""
    pytest.importorskip("llguidance")
    from specdec_cli.decoding import grammar

    session, _ = tiny
    grammar._TOKENIZERS.pop(id(session.tokenizer), None)
    with serving(session):
        wait_until(lambda: id(session.tokenizer) in grammar._TOKENIZERS, "the grammar engine to read the tokenizer")
