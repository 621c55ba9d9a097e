"""Prometheus metrics of `rstar2 serve` (a registry per server: no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rstar2_agent.trajectory import Trajectory


class ServeMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("rstar2_requests", "HTTP requests by path and status", ["path", "status"], registry=r)
        self.latency = Histogram("rstar2_request_seconds", "Request latency by path", ["path"], registry=r,
                                 buckets=(.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300))
        self.ttft = Histogram("rstar2_time_to_first_token_seconds", "Streaming time to first content token",
                              registry=r, buckets=(.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
        self.tokens = Counter("rstar2_tokens", "Tokens by kind (prompt, completion)", ["kind"], registry=r)
        self.tool_calls = Counter("rstar2_tool_calls", "Server-side tool calls by status", ["status"], registry=r)
        self.in_flight = Gauge("rstar2_requests_in_flight", "Requests being generated", registry=r)
        self.stalled = Counter("rstar2_requests_stalled", "Generations aborted for making no progress (no token for "
                               "the stall timeout)", registry=r)

    def observe_trajectory(self, traj: Trajectory) -> None:
        self.tokens.labels("prompt").inc(len(traj.prompt_ids))
        self.tokens.labels("completion").inc(traj.num_generated_tokens)
        for call in traj.tool_calls:
            self.tool_calls.labels(call.status or "not_run").inc()
