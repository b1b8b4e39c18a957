"""A stand-in for llama.cpp's `llama-server`, for tests that must not need the real binary.

It answers /health, /props and /completion in llama.cpp's response shapes (a prompt of token ids, `timings` with
prompt_n, prompt_ms, predicted_n, predicted_ms, and draft_n/draft_n_accepted under --spec-type, `tokens` when
asked for them). Time is made up: 2 ms per prompt token and 4 ms per new token, so a test knows the speeds.

In a test: `FakeServer(answer)` runs it on a thread (the `--reference URL` path). As a program (the binary path):
`python fake_llama_server.py --port P [--spec-type T] ...` answers by repeating the prompt; environment variables
make it misbehave: FAKE_LLAMA_PIDFILE (write its pid there), FAKE_LLAMA_FAIL_START (print a few log lines and exit
3 before serving), FAKE_LLAMA_EXIT_AFTER=N (exit after N completions).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional

PROMPT_MS = 2.0
TOKEN_MS = 4.0


def repeat_prompt(prompt: list[int], n_predict: int) -> tuple[list[int], str]:
    tokens = [prompt[index % len(prompt)] for index in range(n_predict)] if prompt else []
    return tokens, ""


class _State:
    def __init__(self, answer: Callable, spec_type: str, n_ctx: int, model_path: str, return_tokens: bool,
                 exit_after: Optional[int]):
        self.answer, self.spec_type, self.n_ctx, self.model_path = answer, spec_type, n_ctx, model_path
        self.return_tokens, self.exit_after = return_tokens, exit_after
        self.requests: list[dict] = []
        self.types = f"none,{spec_type}" if spec_type else "none"  # as llama.cpp lists them


def _handler(state: _State):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format, *args):  # noqa: A002 - the base class's name
            sys.stderr.write("fake-llama-server: " + format % args + "\n")

        def _send(self, status: int, payload: dict) -> None:
            raw = json.dumps(payload).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):  # noqa: N802 - http.server's naming
            if self.path == "/health":
                self._send(200, {"status": "ok"})
            elif self.path == "/props":
                self._send(200, {"default_generation_settings": {
                    "n_ctx": state.n_ctx, "params": {"speculative.types": state.spec_type or "none"}},
                    "model_path": state.model_path, "build_info": "fake", "total_slots": 1})
            elif self.path == "/slots":
                self._send(200, [{"id": 0, "n_ctx": state.n_ctx, "params": {"speculative.types": state.types}}])
            else:
                self._send(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})

        def do_POST(self):  # noqa: N802
            if self.path != "/completion":
                self._send(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            state.requests.append(body)
            if state.exit_after is not None and len(state.requests) > state.exit_after:
                sys.stderr.write("fake-llama-server: giving up, as told\n")
                sys.stderr.flush()
                os._exit(4)
            prompt = [int(token) for token in body["prompt"]]
            if len(prompt) + body["n_predict"] > state.n_ctx:
                self._send(400, {"error": {"code": 400, "message": "the request exceeds the available context size",
                                           "type": "exceed_context_size_error"}})
                return
            tokens, text = state.answer(prompt, int(body["n_predict"]))
            timings = {"cache_n": 0, "prompt_n": len(prompt), "prompt_ms": PROMPT_MS * len(prompt),
                       "predicted_n": len(tokens), "predicted_ms": TOKEN_MS * len(tokens)}
            if state.spec_type:
                timings.update(draft_n=len(tokens), draft_n_accepted=len(tokens) // 2)
            payload = {"index": 0, "content": text, "tokens": tokens if body.get("return_tokens") and
                       state.return_tokens else [], "stop": True,
                       "stop_type": "limit" if len(tokens) >= body["n_predict"] else "eos", "timings": timings,
                       "generation_settings": {"speculative.types": state.types}}
            self._send(200, payload)

    return Handler


class FakeServer:
    """The fake on a thread of the test process, at `self.url`; `answer(prompt_ids, n_predict) -> (ids, text)`."""

    def __init__(self, answer: Callable = repeat_prompt, spec_type: str = "", n_ctx: int = 4096,
                 return_tokens: bool = True):
        self.state = _State(answer, spec_type, n_ctx, "/models/fake.gguf", return_tokens, None)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def requests(self) -> list[dict]:
        return self.state.requests

    def __enter__(self) -> "FakeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("-m", dest="model", default="")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("-t", dest="threads", type=int, default=1)
    parser.add_argument("-tb", dest="threads_batch", type=int, default=1)
    parser.add_argument("-np", dest="parallel", type=int, default=1)
    parser.add_argument("-c", dest="ctx", type=int, default=4096)
    parser.add_argument("--spec-type", default="")
    args = parser.parse_args(argv)
    if os.environ.get("FAKE_LLAMA_PIDFILE"):
        with open(os.environ["FAKE_LLAMA_PIDFILE"], "w") as handle:
            handle.write(str(os.getpid()))
    print(f"fake-llama-server: model {args.model}, {args.threads} threads, spec {args.spec_type or 'none'}",
          flush=True)
    if os.environ.get("FAKE_LLAMA_FAIL_START"):
        print("fake-llama-server: loading the model\nfake-llama-server: error: failed to load model", flush=True)
        return 3
    exit_after = os.environ.get("FAKE_LLAMA_EXIT_AFTER")
    state = _State(repeat_prompt, args.spec_type, args.ctx, args.model, True,
                   int(exit_after) if exit_after else None)
    httpd = ThreadingHTTPServer((args.host, args.port), _handler(state))
    httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
