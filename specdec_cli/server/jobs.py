"""Jobs: one request on its way through the server, and the bounded queue of those waiting.

`Job` holds the checked request and its generation settings (and its prompt's token ids once read), where its
messages go (an asyncio queue of the event loop that serves the request, fed from the generating thread), and its
cancel flag. `WaitingJobs` keeps them in arrival order, at most `size` whose clients still wait; withdrawn ones
leave at once; the taker may choose which to take. The worker (worker.py, slots.py) takes them from here.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..decoding.generation_config import GenerationConfig
from .api_errors import ApiError
from .requests import CompletionRequest


class Cancelled(Exception):
    """The client went away: the generation stops at the next step."""


@dataclass
class Job:
    request: CompletionRequest
    config: GenerationConfig
    loop: asyncio.AbstractEventLoop
    messages: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    prompt_ids: Optional[list[int]] = None  # the prompt's token ids, once the worker read them (slots.py)

    def send(self, kind: str, value: Any = None) -> None:
        """Hand a message to the request's event loop (from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.messages.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: the server is stopping
            self.cancelled.set()

    def cancel(self) -> None:
        self.cancelled.set()


STOPPING = "the server is stopping"


def stopping_error(what: str) -> ApiError:
    return ApiError(503, f"{STOPPING}: {what}", code="server_shutdown")


class WaitingJobs:
    """Jobs waiting in arrival order, at most `size` whose clients still wait (withdrawn ones leave at once)."""

    def __init__(self, size: int):
        self.size = size
        self._jobs: collections.deque = collections.deque()
        self._changed = threading.Condition()
        self._closed = False

    def put(self, job: Job) -> bool:
        """Queue `job`; False when `size` jobs wait already."""
        with self._changed:
            self._drop_cancelled()
            if len(self._jobs) >= self.size:
                return False
            self._jobs.append(job)
            self._changed.notify()
            return True

    def get(self, wait: bool = True, choose: Optional[Callable[[list[Job]], Job]] = None) -> Optional[Job]:
        """The next live job, waiting for one (`wait`, else None when none waits); None once closed. `choose`
        picks it among those waiting (default: the first to arrive)."""
        with self._changed:
            while True:
                self._drop_cancelled()
                if self._closed:
                    return None
                if self._jobs:
                    if choose is None:
                        return self._jobs.popleft()
                    chosen = choose(list(self._jobs))
                    self._jobs.remove(chosen)
                    return chosen
                if not wait:
                    return None
                self._changed.wait()

    def drop_cancelled(self) -> None:
        """Jobs whose clients left: out of the queue now, their requests told (their handlers return)."""
        with self._changed:
            self._drop_cancelled()

    def close(self) -> list[Job]:
        """Take no more; the jobs still waiting, handed back."""
        with self._changed:
            self._closed = True
            self._drop_cancelled()
            left, self._jobs = list(self._jobs), collections.deque()
            self._changed.notify_all()
            return left

    def __len__(self) -> int:
        with self._changed:
            self._drop_cancelled()
            return len(self._jobs)

    def _drop_cancelled(self) -> None:
        for job in [job for job in self._jobs if job.cancelled.is_set()]:
            self._jobs.remove(job)
            job.send("cancelled")
