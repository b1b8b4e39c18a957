"""What specdec asks a llama.cpp server over HTTP, as plain JSON requests (urllib; no client library): its health
and properties (`probe`), and the speculative decoding it runs (`running_spec_types`). It starts and stops nothing
(llama_server.py does) and decodes nothing itself.
"""

from __future__ import annotations

import json
import time
from typing import Any, Optional

from ..errors import SpecdecError

PROBE_SECONDS = 5.0  # a --reference URL that does not answer within this is refused
REQUEST_SECONDS = 1800.0


def request(url: str, body: Optional[dict] = None, timeout: float = REQUEST_SECONDS) -> tuple[int, Any]:
    """(HTTP status, parsed JSON or None) of a GET (no body) or a JSON POST; connection errors raise OSError."""
    import urllib.error  # here: urllib.request loads ssl, http and email, which the command line's start never needs
    import urllib.request

    data = None if body is None else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw.decode("utf-8")) if raw else None
    except (UnicodeDecodeError, ValueError):
        return status, None


def error_text(payload: Any) -> str:
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return "no error message"


def probe(base_url: str, timeout: float = PROBE_SECONDS) -> dict:
    """/health (waiting while the server says it is loading) and /props of a running server; SpecdecError when
    nothing answers there or it is not healthy."""
    deadline = time.monotonic() + max(timeout, 0.1) * 12  # a server still loading its model gets longer
    while True:
        try:
            status, payload = request(base_url + "/health", timeout=timeout)
        except OSError as error:
            reason = getattr(error, "reason", error)
            raise SpecdecError(f"--reference {base_url}: no llama.cpp server answers there ({reason})",
                               setting="reference") from None
        if status == 200:
            break
        if status == 503 and time.monotonic() < deadline:  # loading the model
            time.sleep(0.2)
            continue
        raise SpecdecError(f"--reference {base_url}: /health answered {status} ({error_text(payload)})",
                           setting="reference")
    try:
        status, props = request(base_url + "/props", timeout=timeout)
    except OSError:
        status, props = 0, None
    return props if status == 200 and isinstance(props, dict) else {}


def spec_types(params: Any) -> Optional[str]:
    """The speculative decoding a server's task parameters name ("ngram-mod"; "none" for plain decoding), or None
    where they do not say. llama.cpp lists "none" next to the types in force ("none,ngram-mod")."""
    if not isinstance(params, dict):
        return None
    value = params.get("speculative.types", params.get("speculative.type"))
    if not value:
        return None
    types = [part.strip() for part in str(value).split(",") if part.strip() and part.strip() != "none"]
    return ",".join(types) if types else "none"


def running_spec_types(base_url: str, props: dict) -> Optional[str]:
    """What a running server decodes with: its first slot's parameters (/slots), else /props' defaults (which
    leave out the server's --spec-type), else None."""
    try:
        status, slots = request(base_url + "/slots", timeout=PROBE_SECONDS)
    except OSError:
        status, slots = 0, None
    if status == 200 and isinstance(slots, list) and slots and isinstance(slots[0], dict):
        found = spec_types(slots[0].get("params"))
        if found is not None:
            return found
    return spec_types((props.get("default_generation_settings") or {}).get("params"))

