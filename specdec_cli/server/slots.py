"""Several requests answered together (`specdec serve --parallel N`), each answer exactly what it would be alone.

The worker's thread runs this loop instead of answering one job at a time: waiting jobs take free slots (each
prompt computed a piece a step in the rows the open answers leave, so a new prompt never stops them: batch.py),
then every open answer advances one step in one forward (decoding/batch.py: each sequence's rows attend over its own KV
cache only, and no row's bits depend on the others), then answers that ended leave and their slots take the next
jobs. A client that goes away frees its slot before the next step; a stopping server cuts every open answer
with an error event, as one answered alone. Each slot keeps a drafter of its own (drafters keep state between
steps); with the answer memory on, one rebuilt from it after each answer takes the next slot that begins, so `sam`
drafts from what the server answered before. The session's prompt cache holds as many contexts as there are
slots: a resent conversation takes the entries its last turn left, and a new one copies the beginning it shares
with another (a system prompt).

What a client receives is built as for a job answered alone (answering.py); what is refused is refused the same
way (worker.py's `fail`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

from ..decoding.batch import Batch
from ..decoding.prompt_cache import PromptCache
from ..defaults import AUTO_SERVE_PARALLEL
from .answering import Answering
from .jobs import Job


def slots_for(parallel: Optional[int], session: Any) -> int:
    """How many requests the server answers together: `--parallel`'s count, or for `auto` (None) llama-server's 4
    where one forward scores several answers with the session's drafter (block weights, no drafter reading the
    target's layer states), else 1: answers stepped one by one gain nothing from sharing a step, and one at a time
    the first in the queue is answered soonest."""
    if parallel is not None:
        return parallel
    return AUTO_SERVE_PARALLEL if session.engine.batches([session.drafter]) else 1


@dataclass
class _Slot:
    job: Job
    answering: Answering
    drafter: Any
    prompt_tokens: int
    started: float
    run: Any = None


class Slots:
    def __init__(self, worker: Any):  # worker.Worker
        self.worker = worker
        self.session = worker.session
        self.batch = Batch(self.session.engine)
        self.session.prompt_cache = PromptCache(worker.parallel)  # each conversation finds its own last turn
        self.open: list[_Slot] = []
        self.spare_drafters: list[Any] = []

    def run(self) -> None:
        worker = self.worker
        while not worker.stopping:
            if not self._admit():
                break  # the queue closed: the server is stopping
            self._withdraw_cancelled()
            if self.open:
                self._step()
        for slot in list(self.open):  # stopping: every open answer cut, with an error event
            self._leave(slot)
            worker.cancelled(slot.job)
            worker.ended(slot.started)

    def _admit(self) -> bool:
        """Waiting jobs into free slots (waiting for one when none is open); False once the queue closed. Each free
        slot takes the waiting job with the least to compute: a first token waits for the prompts begun before it,
        so the shortest first makes the waits shortest (ties in arrival order; each prompt is read once)."""
        worker = self.worker
        if not self.open:
            worker.compute_ahead()  # idle: the answered conversations' next turns begun
        while len(self.open) < worker.parallel:
            job = worker.jobs.get(wait=not self.open, choose=lambda jobs: min(jobs, key=self._to_compute))
            if job is None:
                return bool(self.open) or not worker.stopping
            self._begin(job)
        return True

    def _to_compute(self, job: Job) -> int:
        """Prompt tokens the job's prompt cache does not hold (-1 for a prompt that cannot be read: refused first)."""
        if job.prompt_ids is None:
            try:
                job.prompt_ids = self.worker.prompt_for(job.request)
            except Exception:
                return -1  # _begin reads it again and refuses it
        held = self.session.prompt_cache.common_prefix(job.prompt_ids) if job.request.cache_prompt else 0
        return len(job.prompt_ids) - held

    def _begin(self, job: Job) -> None:
        worker, session, started = self.worker, self.session, time.perf_counter()
        try:
            prompt_ids = job.prompt_ids if job.prompt_ids is not None else worker.prompt_for(job.request)
            job.send("started")
            slot = _Slot(job, Answering(job, session, len(prompt_ids), worker.offered_format(job.request)),
                         self._drafter(), len(prompt_ids), started)
            self.open.append(slot)
            worker.running.append(job)
            slot.run = session.start_in(self.batch, prompt_ids, job.config, slot.drafter, slot.answering.on_event,
                                        cached=job.request.cache_prompt)  # false: computed whole, others' kept
        except Exception as error:
            self._failed(job, error, started)
            return
        if slot.run.finish is not None:
            self._end(slot)

    def _drafter(self) -> Any:
        """A drafter for a slot that begins: one the worker built from the answer memory since (it drafts from
        every answer so far; the spares, built before, are dropped), else a spare, else a new one."""
        fresh, self.worker.fresh = self.worker.fresh, None
        if fresh is not None:
            self.spare_drafters.clear()
            return fresh
        return self.spare_drafters.pop() if self.spare_drafters else self.session.make_drafter()

    def _withdraw_cancelled(self) -> None:
        for slot in [slot for slot in self.open if slot.job.cancelled.is_set()]:
            self._leave(slot)
            self.worker.cancelled(slot.job)
            self.worker.ended(slot.started)

    def _step(self) -> None:
        try:
            ended = self.batch.step()
        except Exception as error:  # a failing model: every open answer fails (in one line), the slots free
            for slot in list(self.open):
                self._failed(slot.job, error, slot.started)
            return
        for run in ended:
            self._end(next(slot for slot in self.open if slot.run is run))

    def _end(self, slot: _Slot) -> None:
        worker = self.worker
        try:
            generation = self.session.finish_in(self.batch, slot.run)
            outcome = slot.answering.finish(generation, self.session.drafter_name)
            worker.metrics.record(outcome.finish_reason, slot.prompt_tokens - generation.cached_tokens,
                                  generation.cached_tokens, generation)
            slot.answering.done(outcome)  # the client has its answer; then it is remembered
            worker.remember(generation.tokens, list(slot.run.events[0].prompt_tokens))  # (and the next slots' drafter)
            worker.answered(slot.job.request, outcome)
        except Exception as error:
            self._failed(slot.job, error, slot.started)
            return
        self._leave(slot)
        worker.ended(slot.started)

    def _failed(self, job: Job, error: Exception, started: float) -> None:
        for slot in [slot for slot in self.open if slot.job is job]:
            self._leave(slot)
        self.worker.fail(job, error)
        self.worker.ended(started)

    def _leave(self, slot: _Slot) -> None:
        """A slot freed: its sequence out of the batch, its drafter kept for the next job."""
        if slot.run is not None:
            self.batch.drop(slot.run)
        if slot in self.open:
            self.open.remove(slot)
            self.spare_drafters.append(slot.drafter)
        if slot.job in self.worker.running:
            self.worker.running.remove(slot.job)
