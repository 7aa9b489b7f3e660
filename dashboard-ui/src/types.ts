// The JSON the dashboard's API sends (orchestrator/dashboard/views.py).

export interface RunSummary {
  run_id: string; workflow_name: string; workflow_version: string; status: string;
  status_reason: string | null; created_at: number; updated_at: number; deadline_at: number | null;
  lease_owner: string | null; lease_expires_at: number | null; retries_used: number;
  retry_budget: number | null; tokens_used: number; token_budget: number | null; cost_used: number;
  cost_budget: number | null; parent_run_id: string | null; labels?: Record<string, string>;
  workflow_ref?: string | null; queue?: string | null;
  /** Why nobody drives a run still running or compensating (orchestrator/undriven.py), else null. */
  no_driver?: NoDriver | null;
}

export interface NoDriver {
  why: "interrupted" | "released" | "expired" | "silent" | "gone"; since: number | null; signal: string | null;
  driver: string | null; command: string; note: string;
  /** What shows running shows instead: `interrupted` where a driver stopped, `pending` when handed on. */
  in_flight: string;
}

/** ``no_driver``: how many of the active runs under the filter nobody drives. */
export interface RunList { runs: RunSummary[]; counts: Record<string, number>; no_driver?: number; next: string | null;
  now: number }

export interface Waiting {
  run_id: string; workflow: string; node: string; since: number | null; reason: string | null;
  prompt: unknown; approvers: unknown; timeout_at: number | null;
}

export interface Row {
  node: string; node_id: string; index: number | null; status: string; attempt: number;
  not_before: number | null; started_at: number | null; finished_at: number | null;
  duration: number | null; output_digest: string | null; inherited_from?: string | null;
}

export interface Shown { value?: unknown; preview?: string; size?: number; digest?: string }

export interface GraphNode {
  id: string; kind: string; map_over: string | null; effect: boolean; critical: boolean;
  compensated: boolean; deps: string[];
}

export interface Graph { source: string; note?: string | null; nodes: GraphNode[]; edges: [string, string][] }

export interface StepState {
  row: Row | null; items: Row[]; counts: Record<string, number>; turns: number; calls: number;
  compensation: string | null;
}

/** A step as the run page's first read sends it: its own row's status only and its first items'
 * labels (the rows themselves are in `RunDoc.rows`, sent once). */
export interface StepDoc extends Omit<StepState, "row" | "items"> { row: { status: string } | null; items: string[] }

export interface RunDoc {
  run: RunSummary & { trace_id: string; workflow_ref: string | null; input: Shown; output: Shown;
    error: Record<string, unknown> | null; wake_at: number | null; event_seq: number;
    forked_from: string | null; children: { run_id: string; status: string; forked_from: string | null }[] };
  graph: Graph; steps: Record<string, StepDoc>; rows: Row[]; cursor: number; now: number;
}

export interface EventJSON { seq: number; at: number; kind: string; node: string | null; data: unknown }

export interface Change {
  events: EventJSON[]; nodes: Row[]; counts: Record<string, Record<string, number>>; run: RunSummary;
  /** The run's step rows and every fan-out's counts, read again after a run-level event. */
  full?: boolean;
  /** Turns and tool calls of the agent steps the change touched, every item counted. */
  agents?: Record<string, { turns: number; calls: number }>;
}

export interface Turn extends Row {
  stop_reason?: string; model?: string; input_tokens?: number; output_tokens?: number; cost?: number;
  tool_uses?: { name: string; input: Shown }[]; text?: string; output: Shown; error: unknown;
}

/** A waiting approval's request as its form needs it (views.approval_form): whole but for a
 * prompt or schema above 64 KB (cut, its size said) and the payload (a preview when large). */
export interface ApprovalDoc {
  prompt: string; prompt_size: number | null; approvers: string[] | null; approvers_count: number | null;
  quorum: number; timeout_at: number | null; on_timeout: string; tool: string | null; takes_answer: boolean;
  answer_schema: Record<string, unknown> | null; answer_schema_size: number; payload: Shown;
  prefill: Record<string, unknown>;
}

export interface NodeDoc {
  node: string; step: string; row: Row | null; output: Shown | null; approval?: ApprovalDoc | null;
  /** why a waiting approval has no form: its request could not be read (a missing blob) */
  approval_error?: string | null;
  error: Record<string, unknown> | null;
  attempts: EventJSON[];
  effects: { key: string; node: string; effect: string; status: string; result: Shown; external_id: string | null;
    created_at: number; updated_at: number }[];
  compensation: (Row & { error: unknown })[]; turns: Turn[];
}
