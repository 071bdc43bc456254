"""The function tools the model can call."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from livekit.agents import ToolError, llm

from agent.tools import ALL_TOOLS, describe_time, get_current_time


def test_time_is_described_for_speech() -> None:
    moment = datetime(2025, 5, 13, 9, 5, tzinfo=ZoneInfo("Europe/Paris"))
    assert describe_time(moment) == "Tuesday 13 May 2025, 09:05 (Europe/Paris)"


async def test_current_time_in_a_named_zone() -> None:
    said = await get_current_time("Asia/Tokyo")
    assert said.endswith("(Asia/Tokyo)")


async def test_an_unknown_zone_is_an_error_the_model_can_read() -> None:
    with pytest.raises(ToolError, match="unknown time zone"):
        await get_current_time("Mars/Olympus_Mons")


def test_the_model_is_told_what_the_argument_means() -> None:
    (schema,) = llm.ToolContext(ALL_TOOLS).parse_function_tools("openai")
    function = schema["function"]
    assert function["name"] == "get_current_time"
    assert "IANA time zone" in function["parameters"]["properties"]["timezone"]["description"]
