"""LLM sub-agents: a planner, four researchers in parallel with tools (one an effect), a writer."""
