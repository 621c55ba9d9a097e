"""A real agent framework drives the server unchanged: the OpenAI Agents SDK (openai-agents, from the registry) runs
an agent over streamed chat completions, dispatches the client tool the server streamed as call deltas, sends the
result back, and reads the answer. The engine is scripted (real SmolLM2 tokenizer ids, streamed token by token):
SmolLM2 does not call functions itself."""

from __future__ import annotations

import openai
import pytest
from test_serve_tool_stream import StreamingScriptedEngine

from rstar2_agent.serve.app import create_app
from rstar2_agent.serve.server import ServeConfig, Server

from conftest import uvicorn_app

agents = pytest.importorskip("agents", reason="the OpenAI Agents SDK (openai-agents) comes with `make install`")


async def test_the_agents_sdk_runs_a_client_tool_through_streamed_chat_completions_with_a_scripted_engine(
        smol_tokenizer, sandbox):
    agents.set_tracing_disabled(True)  # nothing leaves the machine
    asked: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"sunny, 21 C in {city}"

    replies = ["<think>The user wants the weather.</think>\n<tool_call>\n"
               "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
               "It is sunny and 21 C in Paris."]
    engine = StreamingScriptedEngine(smol_tokenizer, replies)
    server = Server(engine, sandbox, ServeConfig(model_name="m", format="hermes"))
    async with uvicorn_app(create_app(server, manage=False)) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        model = agents.OpenAIChatCompletionsModel(model="m", openai_client=client)
        agent = agents.Agent(name="weather", instructions="Answer with the tool.", model=model,
                             tools=[get_weather])
        run = agents.Runner.run_streamed(agent, "What is the weather in Paris?")
        kinds = [event.type async for event in run.stream_events()]
        await client.close()
    assert asked == ["Paris"]  # the SDK dispatched the call it read from the streamed deltas
    assert run.final_output == "It is sunny and 21 C in Paris."
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    assert "sunny, 21 C in Paris" in engine.prompt_text(1)  # the tool's result went back to the model
    assert "<tool_call>" in engine.prompt_text(1) and "get_weather" in engine.prompt_text(0)  # and the call it made
