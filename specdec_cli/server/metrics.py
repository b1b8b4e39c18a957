"""`GET /metrics`: the server's counters in Prometheus' text format (prometheus-client, one registry per server).

Named as vLLM names its own (`vllm:...` there, `specdec:...` here), so dashboards built for vLLM read them with the
prefix changed: requests finished (`request_success_total` by `finished_reason`) and refused or failed
(`request_failure_total`), prompt tokens computed and taken from the prompt cache, generated tokens, requests
running and waiting, time to first token and request latency (histograms), and speculation: verify steps that
carried a draft (`spec_decode_num_drafts_total`), drafted and accepted tokens, and accepted tokens by draft
position (`spec_decode_num_accepted_tokens_per_pos_total{position}`: position 0 is a draft's first token, so
position i over drafts is the acceptance rate at depth i). Nothing here generates: the worker records each answer.
"""

from __future__ import annotations

from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

PREFIX = "specdec:"
CONTENT_TYPE = CONTENT_TYPE_LATEST
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class ServerMetrics:
    def __init__(self, health: Callable[[], dict]) -> None:
        """`health`: the worker's {queued, slots, slots_busy, ...}, read for the gauges at each scrape."""
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.success = Counter(PREFIX + "request_success", "Requests answered, by finish reason.",
                               ["finished_reason"], registry=registry)
        self.failure = Counter(PREFIX + "request_failure", "Requests that failed or were cancelled after queueing.",
                               ["reason"], registry=registry)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens computed (not taken from the cache).",
                                     registry=registry)
        self.cached_tokens = Counter(PREFIX + "prompt_tokens_cached", "Prompt tokens taken from the prompt cache.",
                                     registry=registry)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "Tokens generated.", registry=registry)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Time to the first generated token.",
                              buckets=LATENCY_BUCKETS, registry=registry)
        self.latency = Histogram(PREFIX + "e2e_request_latency_seconds", "Time from the start of generation to the "
                                 "last token.", buckets=LATENCY_BUCKETS, registry=registry)
        self.drafts = Counter(PREFIX + "spec_decode_num_drafts", "Verify steps that carried a draft.",
                              registry=registry)
        self.draft_tokens = Counter(PREFIX + "spec_decode_num_draft_tokens", "Draft tokens verified.",
                                    registry=registry)
        self.accepted_tokens = Counter(PREFIX + "spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                                       registry=registry)
        self.accepted_per_pos = Counter(PREFIX + "spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted at each draft position (0: a draft's first).",
                                        ["position"], registry=registry)
        running = Gauge(PREFIX + "num_requests_running", "Requests being answered.", registry=registry)
        waiting = Gauge(PREFIX + "num_requests_waiting", "Requests waiting in the queue.", registry=registry)
        slots = Gauge(PREFIX + "num_slots", "Requests answered together at most (--parallel).", registry=registry)
        running.set_function(lambda: float(health()["slots_busy"]))
        waiting.set_function(lambda: float(health()["queued"]))
        slots.set_function(lambda: float(health()["slots"]))

    def record(self, finish_reason: str, computed_prompt: int, cached_prompt: int, generation: Any) -> None:
        """One answered request: its finish reason (OpenAI's), prompt tokens computed and cached, and the engine's
        Generation (its events give the drafts)."""
        self.success.labels(finish_reason).inc()
        self.prompt_tokens.inc(computed_prompt)
        self.cached_tokens.inc(cached_prompt)
        self.generation_tokens.inc(len(generation.tokens))
        self.ttft.observe(generation.stats.ttft_seconds)
        self.latency.observe(generation.stats.wall_seconds)
        for event in generation.events:
            if event.kind != "step" or not event.draft.tokens:
                continue
            self.drafts.inc()
            self.draft_tokens.inc(len(event.draft.tokens))
            self.accepted_tokens.inc(event.accepted)
            for position in range(event.accepted):
                self.accepted_per_pos.labels(str(position)).inc()

    def failed(self, reason: str) -> None:
        """A request that failed (`error`) or was cancelled (`cancelled`) once queued."""
        self.failure.labels(reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
