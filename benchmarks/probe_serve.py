"""Probe a running `specdec serve` the way careless and hostile clients would, and say what broke.

    specdec serve --port 8090 &            # the server under test (any model; greedy by default)
    .venv/bin/python benchmarks/probe_serve.py --url http://127.0.0.1:8090 [--key KEY] [--flood 20000]

Each probe prints one line, `ok` or `BROKEN`, and the run ends non-zero when any broke:
- streams with stop strings equal the same request answered whole (stops inside a token, across tokens, at the
  start, at the end, "\\n", one letter);
- bodies no parser should choke on (nested 100,000 deep, a 5,000-digit integer, null, an array) are 4xx;
- clients that leave while sending a body, or while waiting in the queue, free their places (/health's `queued`);
- `--flood N` half-sent requests from this client: /health answers (503 or 200, never a timeout) while they are
  held, and again once the server closed them.
What the server logged is for the person running it to read (a traceback there is a failure too). This script
sends what no client library would (raw sockets) and never loads a model itself.
"""

from __future__ import annotations

import argparse
import http.client
import json
import resource
import socket
import sys
import threading
import time
from urllib.parse import urlparse

CHAT = "/v1/chat/completions"


class Probe:
    def __init__(self, url: str, key: str | None):
        parsed = urlparse(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        self.broken = 0

    def request(self, path: str, body: bytes = b"", method: str = "POST", timeout: float = 300) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            connection.request(method, path, body=body if method == "POST" else None, headers=self.headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def health(self, timeout: float = 10) -> dict:
        status, body = self.request("/health", method="GET", timeout=timeout)
        return json.loads(body) if status == 200 else {"status": status}

    def say(self, name: str, ok: bool, detail: str = "") -> None:
        self.broken += not ok
        print(f"{'ok    ' if ok else 'BROKEN'}  {name}{': ' + detail if detail else ''}", flush=True)

    def whole_and_streamed(self, body: dict) -> tuple[str, str]:
        status, whole = self.request(CHAT, json.dumps(body).encode())
        assert status == 200, whole
        text = json.loads(whole)["choices"][0]["message"]["content"]
        status, raw = self.request(CHAT, json.dumps({**body, "stream": True}).encode())
        pieces = []
        for line in raw.split(b"\n"):
            if line.startswith(b"data: {"):
                event = json.loads(line[6:])
                for choice in event.get("choices", []):
                    pieces.append(choice.get("delta", {}).get("content") or "")
        return text, "".join(pieces)


def probe_streams(probe: Probe) -> None:
    base = {"messages": [{"role": "user", "content": "List three colors."}], "max_tokens": 48}
    answer, _ = probe.whole_and_streamed(base)
    stops = [["\n"], ["e"], ["Blue"], [answer[:2]], [answer[-2:]], [answer[len(answer) // 2: len(answer) // 2 + 3]],
             ["§"], [" ", "."]]
    bad = []
    for stop in stops:
        whole, streamed = probe.whole_and_streamed({**base, "stop": stop})
        if whole != streamed:
            bad.append(f"stop {stop!r}: streamed {streamed[-20:]!r}, whole {whole[-20:]!r}")
    probe.say(f"streams equal whole answers ({len(stops)} stop sets)", not bad, "; ".join(bad))


def probe_bodies(probe: Probe) -> None:
    bodies = {"nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000, "5,000-digit integer": b"1" * 5000,
              "null": b"null", "[1,2]": b"[1,2]", "not JSON": b"{", "not UTF-8": b"\xff\xfe"}
    for name, body in bodies.items():
        status, answer = probe.request(CHAT, body)
        probe.say(f"body {name}", 400 <= status < 500, f"{status} {answer[:100]!r}")


def _partial(probe: Probe, data: bytes) -> socket.socket:
    sock = socket.create_connection((probe.host, probe.port), timeout=30)
    sock.sendall(data)
    return sock


def probe_leavers(probe: Probe) -> None:
    head = "".join(f"{name}: {value}\r\n" for name, value in probe.headers.items())
    for _ in range(5):
        _partial(probe, f"POST {CHAT} HTTP/1.1\r\nHost: x\r\n{head}Content-Length: 1000\r\n\r\n{{".encode()).close()
    probe.say("clients leaving mid-body", probe.request(CHAT, json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode())[0] == 200)
    long = json.dumps({"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 400,
                       "stream": True}).encode()
    slots = int(probe.health().get("slots") or 1)  # (each slot takes a long answer: then the next ones queue)
    runners = [_partial(probe, f"POST {CHAT} HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {len(long)}\r\n\r\n"
                        .encode() + long) for _ in range(slots)]
    for running in runners:
        running.recv(1024)
    short = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    waiting = [_partial(probe, f"POST {CHAT} HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {len(short)}\r\n\r\n"
                        .encode() + short) for _ in range(4)]
    time.sleep(1)
    queued = probe.health().get("queued")
    for sock in waiting:
        sock.close()
    time.sleep(1)
    after = probe.health().get("queued")
    for running in runners:
        running.close()
    probe.say("queued clients that left free their places", queued == 4 and after == 0, f"queued {queued} -> {after}")


def probe_flood(probe: Probe, count: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, count + 256)), hard))
    held, refused = [], 0
    started = time.perf_counter()
    for _ in range(count):
        try:
            held.append(_partial(probe, f"POST {CHAT} HTTP/1.1\r\nHost: x\r\n".encode()))
        except OSError:
            refused += 1
    opened = time.perf_counter() - started
    started = time.perf_counter()
    try:
        during = probe.health(timeout=30).get("status", "?")
    except OSError as error:
        during = f"{type(error).__name__}"
    waited = time.perf_counter() - started
    closed = threading.Event()

    def drain() -> None:
        for sock in held:
            try:
                sock.settimeout(120)
                sock.recv(1024)
            except OSError:
                pass
            sock.close()
        closed.set()

    threading.Thread(target=drain, daemon=True).start()
    closed.wait(180)
    after = probe.health(timeout=30).get("status", "?")
    probe.say(f"{count} half-sent requests", waited < 10 and closed.is_set() and after == "ok",
              f"opened in {opened:.1f} s ({refused} refused by the OS), /health during: {during} in {waited:.2f} s, "
              f"all closed by the server: {closed.is_set()}, /health after: {after}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--key", default=None)
    parser.add_argument("--flood", type=int, default=2000, help="half-sent requests to hold (0: none)")
    args = parser.parse_args()
    probe = Probe(args.url, args.key)
    probe_streams(probe)
    probe_bodies(probe)
    probe_leavers(probe)
    if args.flood:
        probe_flood(probe, args.flood)
    print(f"{probe.broken} broken")
    return 1 if probe.broken else 0


if __name__ == "__main__":
    sys.exit(main())
