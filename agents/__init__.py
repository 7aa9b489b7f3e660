"""raysaga.agents: LLM sub-agents as workflow nodes.

An agent node is a loop of turns the driver advances: a model call (a Ray task whose response
is made durable before anything it asks for runs), then its tool calls (Ray tasks; effects
through the ledger), then the next model call. A resume replays persisted turns and calls the
model only for turns never answered.
"""

from raysaga.agents.agent import Agent, LoopPolicy
from raysaga.agents.breaker import BreakerPolicy
from raysaga.agents.messages import ModelRequest, ModelResponse, Usage
from raysaga.agents.models import AnthropicModel, Model, ScriptedModel, price_of, text_reply, tool_reply
from raysaga.agents.tools import Tool, ToolError, tool
from raysaga.types import RateLimit

__all__ = [
    "Agent",
    "AnthropicModel",
    "BreakerPolicy",
    "LoopPolicy",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "RateLimit",
    "ScriptedModel",
    "Tool",
    "ToolError",
    "Usage",
    "price_of",
    "text_reply",
    "tool",
    "tool_reply",
]
