// Node and run states: a colour AND a symbol each (never colour alone).

export const SYMBOL: Record<string, string> = {
  completed: "✓", running: "●", retrying: "↻", failed: "✗", pending: "○", skipped: "⊘",
  cancelled: "⊗", waiting: "◷", compensating: "↺", compensated: "↺", compensation_failed: "✗",
  waiting_human: "◷", waiting_timer: "◷", paused: "‖", committed: "✓",
  // a node in flight (or a run) that no driver drives: interrupted, its driver dead
  interrupted: "◌",
};

export const RUN_STATES = ["pending", "running", "waiting_human", "waiting_timer", "paused", "compensating",
  "completed", "failed", "compensated", "compensation_failed", "cancelled"];

export function symbol(state: string): string {
  // its own keys only: `SYMBOL["constructor"]` is Object's
  return Object.prototype.hasOwnProperty.call(SYMBOL, state) ? SYMBOL[state]! : "?";
}

export function cls(state: string): string {
  return "st-" + state.replace(/[^a-z_]/g, "");
}

// A fan-out's state from its items' counts (its own row, when it has one, wins).
export function fanState(counts: Record<string, number>): string {
  const n = (k: string): number => counts[k] ?? 0;
  if (n("running") || n("retrying")) return "running";
  if (n("waiting")) return "waiting";
  if (n("failed")) return "failed";
  const total = Object.values(counts).reduce((a, b) => a + b, 0);
  if (total && n("cancelled") && !n("pending")) return "cancelled";  // a cancel ended it (fan_states.py)
  if (total && n("completed") === total) return "completed";
  if (total) return "running";
  return "pending";
}
