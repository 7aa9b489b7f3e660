"""raysaga.agents: LLM sub-agent nodes (see the issue \"LLM sub-agents on the anthropic SDK\")."""
