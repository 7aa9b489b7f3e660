"""The run's token and cost budgets: what the model calls used, and whether another may start."""

from __future__ import annotations

from dataclasses import dataclass

from raysaga.orchestrator.records import merge_run
from raysaga.state import Batch, RunUpdate


@dataclass
class Budgets:
    tokens: int = 0
    cost: float = 0.0
    token_budget: int | None = None
    cost_budget: float | None = None

    def charge(self, tokens: int, cost: float, batch: Batch) -> None:
        """Count a model response's usage against the run (durable with the response itself)."""
        self.tokens += tokens
        self.cost += cost
        batch.run = merge_run(batch.run, RunUpdate(tokens_delta=tokens, cost_delta=cost))

    def stop(self) -> str | None:
        """Why no further model call may start (a budget is spent), or None."""
        if self.token_budget is not None and self.tokens >= self.token_budget:
            return f"budget: {self.tokens} tokens used of a budget of {self.token_budget}"
        if self.cost_budget is not None and self.cost >= self.cost_budget:
            return f"budget: ${self.cost:.4f} spent of a budget of ${self.cost_budget:.4f}"
        return None
