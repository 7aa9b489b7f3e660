"""``ANTHROPIC_BASE_URL`` is checked as ``AnthropicModel(base_url=)`` is (stop 47).

A value without its scheme (``localhost:9``) was never checked: the run was recorded and its agent
failed after 6 attempts with ``APIConnectionError: Connection error.``, naming neither the variable
nor what was wrong; the same value as ``base_url=`` was refused at once.
"""

from __future__ import annotations

import pytest

from raysaga.agents import AnthropicModel
from raysaga.agents.messages import ModelRequest
from raysaga.agents.models import env_base_url
from raysaga.errors import InvalidOptionError, Permanent


@pytest.mark.parametrize("bad", ["localhost:9", "gateway.example.com", "ftp://host", "http://"])
def test_a_malformed_base_url_variable_is_refused_when_the_model_is_made(
        bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", bad)
    with pytest.raises(InvalidOptionError, match="ANTHROPIC_BASE_URL must be an http"):
        AnthropicModel("claude-x")
    # a model given its own base_url does not read the variable
    assert AnthropicModel("claude-x", base_url="http://127.0.0.1:9").base_url == "http://127.0.0.1:9"


def test_on_a_worker_whose_variable_is_malformed_the_call_fails_for_good_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = AnthropicModel("claude-x", api_key_env="RAYSAGA_TEST_KEY_STOP47")
    monkeypatch.setenv("RAYSAGA_TEST_KEY_STOP47", "sk-test-not-a-real-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "localhost:9")  # the worker's environment differs
    with pytest.raises(Permanent, match="ANTHROPIC_BASE_URL must be an http"):
        model.complete(ModelRequest(model="claude-x", messages=[{"role": "user", "content": "hi"}]))


def test_unset_or_empty_is_the_real_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "")
    assert env_base_url() is None
    monkeypatch.delenv("ANTHROPIC_BASE_URL")
    assert env_base_url() is None
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:8000")
    assert env_base_url() == "http://127.0.0.1:8000"
