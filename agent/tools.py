"""Function tools the model may call. They run in the agent process, never on the GPU node's
critical path, and need no network: a voice agent that is asked "what time is it?" should not
have to guess."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from livekit.agents import ToolError, function_tool


def describe_time(now: datetime) -> str:
    """A sentence a voice model can read out: 'Tuesday 14 May 2025, 09:05 (Europe/Paris)'."""
    zone = now.tzname() if now.tzinfo is not None else "local time"
    if isinstance(now.tzinfo, ZoneInfo):
        zone = now.tzinfo.key
    return f"{now:%A %d %B %Y, %H:%M} ({zone})"


@function_tool
async def get_current_time(timezone: str = "UTC") -> str:
    """Get the current date and time.

    Args:
        timezone: An IANA time zone name such as "Europe/Paris" or "America/New_York". Use
            "UTC" when the user names no place.
    """
    try:
        zone = ZoneInfo(timezone.strip() or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        raise ToolError(f"unknown time zone {timezone!r}; use an IANA name like Europe/Paris") from None
    return describe_time(datetime.now(zone))


ALL_TOOLS = [get_current_time]
