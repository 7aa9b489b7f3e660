"""Option objects a workflow author passes to steps and runs."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RetryPolicy:
    """How a step's failed attempts are retried.

    Only failures classified transient are retried (see ``raysaga.orchestrator.retry``);
    the delay before attempt ``n+1`` is drawn with full jitter:
    ``uniform(0, min(cap, base * 2 ** (n - 1)))``.
    """

    max_attempts: int = 3
    """Attempts in all, the first included. 1 means never retry."""
    base: float = 0.5
    """Seconds: the ceiling of the first backoff draw."""
    cap: float = 30.0
    """Seconds: no backoff draw exceeds this."""
    transient: tuple[type[BaseException], ...] = ()
    """Extra exception types to treat as transient (retry)."""
    permanent: tuple[type[BaseException], ...] = ()
    """Extra exception types to treat as permanent (never retry); wins over ``transient``."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if self.base < 0 or self.cap < 0:
            raise ValueError("RetryPolicy.base and .cap must be >= 0 seconds")


DEFAULT_RETRY = RetryPolicy()
NO_RETRY = RetryPolicy(max_attempts=1)


@dataclass(frozen=True)
class RunOptions:
    """Per-run knobs; every field has a safe default."""

    deadline: float | None = None
    """Seconds from the run's creation after which it stops with reason ``deadline``."""
    retry_budget: int | None = None
    """Retries the whole run may spend across all nodes (None: only per-step limits)."""
    lease_ttl: float = 15.0
    """Seconds a driver's lease lasts without a heartbeat; a dead driver's run is free after this."""
    blob_threshold: int = 64 * 1024
    """Outputs larger than this many bytes of JSON go to the blob store by digest."""
    max_output_bytes: int = 16 * 1024 * 1024
    """Outputs larger than this fail their node permanently with a clear error."""
    token_budget: int | None = None
    """Model tokens (input + output) the whole run may spend; at the budget agents stop calling
    the model (the run pauses, or the node fails, as each agent declares). Raise it on resume."""
    cost_budget: float | None = None
    """Model cost in USD the whole run may spend (prices: ``raysaga.agents.price_of``)."""
    labels: dict[str, str] = field(default_factory=dict)
