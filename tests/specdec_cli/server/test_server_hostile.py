"""`specdec serve` against careless and hostile clients: bodies no parser should choke on, clients that leave while
sending or while waiting, clients that never finish their headers, a server stopped mid-answer, and the settings
that bound all of it. Every fault is the client's: a 4xx in OpenAI's shape or a closed connection, never a 500 and
never a traceback in the log. No test depends on speed: waits are bounded by a hang guard, never timed.
"""

from __future__ import annotations

import json
import logging
import socket
import threading

import pytest
from test_server import HANG_GUARD, _chat_settings, client_of, health, raw_request, serving, wait_until

openai = pytest.importorskip("openai")

HI = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'


@pytest.fixture(scope="module")
def tiny_session(tiny_model_dir):
    from specdec_cli.session.chat import open_session

    return open_session(_chat_settings(tiny_model_dir))[0]


@pytest.fixture(scope="module")
def endless(endless_model_dir):
    """A session whose answers practically never end (long enough to queue behind or to cut)."""
    from specdec_cli.session.chat import open_session

    return open_session(_chat_settings(endless_model_dir, max_new_tokens=1500))[0]


@pytest.fixture
def no_tracebacks(caplog):
    """Every log record of the test (uvicorn's too: the server leaves them to the root logger), checked at its end:
    none carries a traceback or is an error."""
    caplog.set_level(logging.INFO)
    yield caplog
    bad = [record for record in caplog.get_records("call") if record.exc_info or record.levelno >= logging.ERROR]
    assert not bad, [record.getMessage() for record in bad]


def _send(port: int, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD)
    if data:
        sock.sendall(data)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    parts = []
    while True:
        try:
            part = sock.recv(65536)
        except ConnectionResetError:
            break
        if not part:
            break
        parts.append(part)
    return b"".join(parts)


# -- bodies --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("body, needle", [
    (b"[" * 100_000 + b"]" * 100_000, "nests arrays or objects too deeply"),
    (b'{"max_tokens": ' + b"7" * 5000 + b"}", "more than 4300 digits"),
    (b"null", "got null"),
    (b"[1, 2]", "got an array"),
    (b'"text"', "got a string"),
    (b'{"prompt": "a\\ud800b", "messages": [{"role": "user", "content": "x\\uDFFF"}]}', "half of a UTF-16"),
])
def test_bodies_that_are_not_requests_are_400s(tiny_session, no_tracebacks, body, needle):
    session = tiny_session
    with serving(session) as server:
        for path in ("/v1/chat/completions", "/v1/completions", "/completion"):
            status, _, answer = raw_request(server, "POST", path, body)
            assert status == 400 and needle in answer["error"]["message"], answer
        assert raw_request(server, "POST", "/v1/chat/completions", HI)[0] == 200


def test_a_surrogate_pair_is_one_character_and_half_of_one_is_refused():
    from specdec_cli.server.api_errors import ApiError
    from specdec_cli.server.requests import read_json

    assert read_json(b'{"prompt": "\\ud83d\\ude00", "note": "\\\\ud800 is text"}') == {
        "prompt": "\U0001F600", "note": "\\ud800 is text"}
    for body in (b'{"\\ud800": 1}', b'{"a": ["x", {"b": "\\ude00"}]}'):
        with pytest.raises(ApiError, match="half of a UTF-16"):
            read_json(body)


def test_n_predict_out_of_range_is_named_as_sent(tiny_session):
    session = tiny_session
    with serving(session) as server:
        for n_predict in (-5, 10**9):
            status, _, answer = raw_request(server, "POST", "/completion", json.dumps(
                {"prompt": "hi", "n_predict": n_predict}).encode())
            assert status == 400 and answer["error"]["param"] == "n_predict", answer
            assert "'n_predict'" in answer["error"]["message"] and "max_tokens" not in answer["error"]["message"]
        status, _, answer = raw_request(server, "POST", "/completion", b'{"prompt": "hi", "n_predict": -1}')
        assert status == 200 and answer["tokens_predicted"] >= 1


def test_a_megabyte_prompt_is_refused_before_it_is_tokenized(tiny_session, monkeypatch):
    """A text far past the context is refused from its length in characters, with the code clients look for, and
    the tokenizer never sees it."""
    session = tiny_session
    seen: list[int] = []
    with serving(session, max_body_bytes=4 * 1024 * 1024) as server:
        tokenizer = session.tokenizer
        encode = type(tokenizer).__call__
        monkeypatch.setattr(type(tokenizer), "__call__",
                            lambda self, text, *args, **kwargs: seen.append(len(text)) or encode(self, text, *args,
                                                                                                 **kwargs))
        for path, body in (("/v1/completions", {"prompt": "x" * 3_000_000}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "y" * 3_000_000}]})):
            status, _, answer = raw_request(server, "POST", path, json.dumps(body).encode())
            error = answer["error"]
            assert status == 400 and error["code"] == "context_length_exceeded", answer
            assert error["param"] == ("prompt" if path == "/v1/completions" else "messages")
            assert "characters" in error["message"] and "--raw" not in error["message"]
        assert not any(size >= 3_000_000 for size in seen)


# -- clients that leave ---------------------------------------------------------------------------------------------


def test_a_client_that_leaves_while_sending_its_body_leaves_no_traceback(tiny_session, no_tracebacks):
    session = tiny_session
    with serving(session) as server:
        for _ in range(3):
            sock = _send(server.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         b"application/json\r\nContent-Length: 1000\r\n\r\n{\"messages\": ")
            sock.close()
        wait_until(lambda: raw_request(server, "POST", "/v1/chat/completions", HI)[0] == 200, "a served request")


def test_waiting_requests_whose_clients_left_free_their_places(endless):
    """Clients that give up while queued leave the queue at once: /health counts only those still waiting, and a
    new client is queued, not refused with 429."""
    with serving(endless, queue=2) as server:
        client = client_of(server)
        running = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "one"}],
                                                 stream=True, max_tokens=1500)
        next(iter(running))
        try:
            leaving = [_send(server.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                             b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(HI), HI)) for _ in range(2)]
            wait_until(lambda: health(server)["queued"] == 2, "two requests to wait")
            for sock in leaving:
                sock.close()
            wait_until(lambda: health(server)["queued"] == 0, "the queue to forget the clients that left")
            answered: list = []
            thread = threading.Thread(target=lambda: answered.append(client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "two"}], max_tokens=3)))
            thread.start()
            wait_until(lambda: health(server)["queued"] == 1, "the new request to wait, not be refused")
        finally:
            running.close()
        thread.join(HANG_GUARD)
        assert answered and answered[0].usage.completion_tokens == 3


# -- a server that stops --------------------------------------------------------------------------------------------


def test_a_stream_cut_by_the_server_stopping_ends_with_an_error_event(endless):
    """Stopping the server mid-answer: the stream's last event is an error a client can tell from a whole answer
    (no finish chunk, no [DONE]); a request still waiting gets 503."""
    server_context = serving(endless, queue=2)
    server = server_context.__enter__()
    try:
        sock = _send(server.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: %d\r\n\r\n%s" % (
                         len(body := json.dumps({"messages": [{"role": "user", "content": "go"}], "stream": True,
                                                 "max_tokens": 1500}).encode()), body))
        first = sock.recv(65536)
        assert b"200 OK" in first
        waiting: list = []
        thread = threading.Thread(target=lambda: waiting.append(raw_request(server, "POST", "/v1/chat/completions",
                                                                            HI)))
        thread.start()
        wait_until(lambda: health(server)["queued"] == 1, "a request to wait")
    finally:
        server_context.__exit__(None, None, None)
    rest = first + _read_all(sock)
    sock.close()
    thread.join(HANG_GUARD)
    events = [line[len(b"data: "):] for line in rest.split(b"\n") if line.startswith(b"data: ")]
    assert events and b"[DONE]" not in events
    last = json.loads(events[-1])
    assert last["error"]["code"] == "server_shutdown" and last["error"]["type"] == "server_error"
    assert not any(b'"finish_reason": "' in event for event in events)
    status, _, answer = waiting[0]
    assert status == 503 and answer["error"]["code"] == "server_shutdown"


# -- connections ----------------------------------------------------------------------------------------------------


def test_connections_past_the_limit_are_answered_503_at_once(tiny_session, no_tracebacks):
    """Half-sent requests hold connections (no key is needed to send half a request): those past --max-connections
    get a 503 as they arrive, and the server answers again once the held ones go."""
    with serving(tiny_session, max_connections=4, api_key="k") as server:
        held = [_send(server.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n") for _ in range(4)]
        # accepted in order after the held four, so refused; they send nothing (a refused request's unread bytes
        # would turn the server's close into a reset, losing its 503)
        more = [_send(server.port, b"") for _ in range(8)]
        replies = [_read_all(sock) for sock in more]
        assert all(reply.startswith(b"HTTP/1.1 503") and b"too_many_connections" in reply for reply in replies)
        for sock in held + more:
            sock.close()
        wait_until(lambda: raw_request(server, "POST", "/v1/chat/completions", HI,
                                       {"Authorization": "Bearer k"})[0] == 200, "the server to answer again")


def test_headers_that_do_not_arrive_in_time_close_the_connection(tiny_session, no_tracebacks):
    with serving(tiny_session, timeout=2.0) as server:
        half = _send(server.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        silent = _send(server.port, b"")  # says nothing at all
        assert _read_all(half) == b"" and _read_all(silent) == b""  # closed by the server, not by the guard
        half.close()
        silent.close()
        assert raw_request(server, "POST", "/v1/chat/completions", HI)[0] == 200


def test_a_body_that_does_not_arrive_in_time_is_408(tiny_session, no_tracebacks):
    with serving(tiny_session, timeout=2.0) as server:
        sock = _send(server.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: 100\r\n\r\n{\"messages\"")
        reply = _read_all(sock)
        sock.close()
        assert reply.startswith(b"HTTP/1.1 408") and b"request_timeout" in reply, reply
        assert raw_request(server, "POST", "/v1/chat/completions", HI)[0] == 200


def test_two_servers_on_one_port_cannot_both_pass_the_check(tiny_model_dir, monkeypatch):
    """The address is bound before the model loads and held until uvicorn serves on it: a second server started
    while the first loads is refused in one line, not after its own load."""
    from test_server import _free_port

    from specdec_cli.errors import SpecdecError
    from specdec_cli.server import run
    from specdec_cli.server.settings import server_settings

    port = _free_port()
    settings = server_settings(target=tiny_model_dir, port=port)
    during_load: list = []

    def loading(chat_settings, on_status=None):
        try:
            run.listening_socket("127.0.0.1", port)
        except SpecdecError as error:
            during_load.append(str(error))
        raise SpecdecError("stop here")

    monkeypatch.setattr("specdec_cli.session.chat.open_session", loading)
    with pytest.raises(SpecdecError, match="stop here"):
        run.serve(settings)
    assert during_load and f"cannot listen on 127.0.0.1:{port}" in during_load[0]
    run.listening_socket("127.0.0.1", port).close()  # released once serving ended


# -- settings -------------------------------------------------------------------------------------------------------


def test_the_answer_memory_is_on_by_default_only_for_a_private_server(monkeypatch):
    from specdec_cli.server.settings import server_settings

    monkeypatch.delenv("SPECDEC_API_KEY", raising=False)
    assert server_settings().chat.remember
    assert not server_settings(host="0.0.0.0", api_key="k").chat.remember
    assert not server_settings(api_key="k").chat.remember
    assert not server_settings(host="0.0.0.0").chat.remember
    assert server_settings(host="0.0.0.0", api_key="k", remember=True).chat.remember
    assert not server_settings(remember=False).chat.remember
