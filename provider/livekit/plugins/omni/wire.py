"""The JSON the plugin sends to the worker, and LiveKit chat items ⇄ wire conversation items.

The worker speaks the OpenAI Realtime (GA) subset described in docs/architecture.md. This module is the
only place in the plugin that knows the shape of those events; it depends on nothing but
LiveKit's own types, never on the worker's code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from livekit import rtc
from livekit.agents import llm, utils
from livekit.agents.llm.chat_context import Instructions

from . import audio, video
from .log import logger

Event = dict[str, Any]


def event_id(kind: str) -> str:
    return utils.shortuuid(f"{kind}_")


# --------------------------------------------------------------------------- client events


def session_update(session: dict[str, Any], *, kind: str = "session_update") -> Event:
    return {"type": "session.update", "event_id": event_id(kind), "session": {"type": "realtime", **session}}


def full_session(
    *,
    voice: str,
    modalities: list[Literal["text", "audio"]],
    max_output_tokens: int | Literal["inf"],
    instructions: str | None,
    tools: list[dict[str, Any]],
    tool_choice: llm.ToolChoice | None,
    input_transcription: bool,
    truncation: str | Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything the session needs, as sent on (re)connection."""
    session: dict[str, Any] = {
        "output_modalities": ["audio"] if "audio" in modalities else ["text"],
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": audio.INPUT_SAMPLE_RATE},
                "turn_detection": None,  # the agent decides turns
                # the worker transcribes with the omni model itself: the model name is its own
                "transcription": {"model": "omni"} if input_transcription else None,
            },
            "output": {"format": {"type": "audio/pcm", "rate": audio.OUTPUT_SAMPLE_RATE}, "voice": voice},
        },
        "max_output_tokens": max_output_tokens,
        "tools": tools,
        "tool_choice": tool_choice_to_wire(tool_choice),
    }
    if instructions is not None:
        session["instructions"] = instructions
    if truncation is not None:
        session["truncation"] = truncation
    return session


def append_audio(pcm16: bytes) -> Event:
    return {"type": "input_audio_buffer.append", "audio": audio.b64(pcm16)}


def append_frame(data_url: str, audio_ms: int) -> Event:
    """A camera frame of the turn, `audio_ms` into its input audio (session `input_video`)."""
    return {"type": "input_video_buffer.append", "event_id": event_id("frame"), "image_url": data_url,
            "audio_ms": audio_ms}


def commit_audio() -> Event:
    return {"type": "input_audio_buffer.commit", "event_id": event_id("commit")}


def clear_audio() -> Event:
    return {"type": "input_audio_buffer.clear", "event_id": event_id("clear")}


def create_item(item: dict[str, Any], previous_item_id: str | None) -> Event:
    event: Event = {"type": "conversation.item.create", "event_id": event_id("item_create"), "item": item}
    if previous_item_id is not None:
        event["previous_item_id"] = previous_item_id
    return event


def delete_item(item_id: str) -> Event:
    return {"type": "conversation.item.delete", "event_id": event_id("item_delete"), "item_id": item_id}


def truncate_item(item_id: str, audio_end_ms: int, transcript: str | None) -> Event:
    event: Event = {
        "type": "conversation.item.truncate",
        "event_id": event_id("item_truncate"),
        "item_id": item_id,
        "content_index": 0,
        "audio_end_ms": audio_end_ms,
    }
    if transcript is not None:
        # our worker's extension: the exact text the listener heard
        event["audio_transcript"] = transcript
    return event


def create_response(
    create_event_id: str,
    *,
    instructions: str | None,
    tool_choice: llm.ToolChoice | None,
    tools: list[dict[str, Any]] | None,
) -> Event:
    response: dict[str, Any] = {"metadata": {"client_event_id": create_event_id}}
    if instructions is not None:
        response["instructions"] = instructions
    if tool_choice is not None:
        response["tool_choice"] = tool_choice_to_wire(tool_choice)
    if tools is not None:
        response["tools"] = tools
    return {"type": "response.create", "event_id": create_event_id, "response": response}


def cancel_response(response_id: str | None) -> Event:
    event: Event = {"type": "response.cancel", "event_id": event_id("cancel")}
    if response_id is not None:
        event["response_id"] = response_id
    return event


def instructions_text(instructions: str | Instructions) -> str:
    """LiveKit instructions as the text a voice model gets (with their audio addition)."""
    if isinstance(instructions, Instructions):
        return instructions.render(modality="audio")
    return instructions


# --------------------------------------------------------------------------- tools


def tool_choice_to_wire(choice: llm.ToolChoice | None) -> str | dict[str, str]:
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        return choice
    return {"type": "function", "name": choice["function"]["name"]}


def tools_to_wire(tools: list[llm.Tool]) -> list[dict[str, Any]]:
    """Function tools as the worker's `tools` list; other kinds are left out with a warning."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        if isinstance(tool, llm.FunctionTool):
            out.append(llm.utils.build_legacy_openai_schema(tool, internally_tagged=True))
        elif isinstance(tool, llm.RawFunctionTool):
            schema = dict(tool.info.raw_schema)
            schema.pop("meta", None)
            out.append({
                "type": "function",
                "name": schema["name"],
                "description": schema.get("description", ""),
                "parameters": schema.get("parameters", {"type": "object", "properties": {}}),
            })
        else:
            logger.warning("the omni worker only runs function tools; leaving out %r", tool)
    return out


# --------------------------------------------------------------------------- conversation items


def chat_item_to_wire(item: llm.ChatItem) -> dict[str, Any] | None:
    """A LiveKit chat item as a wire item, or None when it holds nothing the worker can use."""
    if item.type == "function_call":
        return {"type": "function_call", "id": item.id, "call_id": item.call_id, "name": item.name,
                "arguments": item.arguments}
    if item.type == "function_call_output":
        return {"type": "function_call_output", "id": item.id, "call_id": item.call_id, "output": item.output}
    if item.type != "message":
        return None  # handoffs and config updates live only on the agent side

    content: list[dict[str, Any]] = []
    for part in item.content:
        if isinstance(part, (str, Instructions)):
            text = instructions_text(part)
            if text:
                content.append({"type": "output_text" if item.role == "assistant" else "input_text", "text": text})
        elif isinstance(part, llm.AudioContent) and item.role == "user":
            pcm16 = audio.to_input_pcm16(part.frame)
            if pcm16:
                content.append({"type": "input_audio", "audio": audio.b64(pcm16), "transcript": part.transcript})
        elif isinstance(part, llm.ImageContent) and item.role == "user":
            content.append(image_part(part))
        else:
            logger.warning("the omni worker takes text, user audio and user pictures only; leaving out a %s part "
                           "of %s", type(part).__name__, item.id)
    if not content:
        return None
    role = "system" if item.role == "developer" else item.role
    return {"type": "message", "id": item.id, "role": role, "content": content}


def image_part(part: llm.ImageContent) -> dict[str, Any]:
    """A picture as an `input_image` part: a data URL (a video frame is resized and
    JPEG-encoded first), or the URL given (the worker takes remote ones only from hosts it
    allows)."""
    detail = part.inference_detail
    if isinstance(part.image, rtc.VideoFrame):
        url = video.encode_frame(part.image, "high" if detail == "high" else "low").data_url
    else:
        url = part.image
    return {"type": "input_image", "image_url": url, "detail": detail}


def picture_content(picture: video.Picture, detail: str) -> llm.ImageContent:
    return llm.ImageContent(image=picture.data_url, inference_detail=detail, mime_type="image/jpeg",  # type: ignore[arg-type]
                            inference_width=picture.width, inference_height=picture.height)


def picture_item(pictures: list[video.Picture], detail: str) -> llm.ChatMessage:
    """The caller's frames for a turn, as the user message sent right before its commit."""
    return llm.ChatMessage(id=utils.shortuuid("item_frames_"), role="user", content=[
        llm.ImageContent(image=p.data_url, inference_detail=detail, mime_type="image/jpeg",  # type: ignore[arg-type]
                         inference_width=p.width, inference_height=p.height) for p in pictures])


def wire_item_to_chat_item(item: dict[str, Any]) -> llm.ChatItem:
    """A wire item as the worker echoes it (user audio is not echoed: the caller attaches it)."""
    if item["type"] == "function_call":
        return llm.FunctionCall(id=item["id"], call_id=item["call_id"], name=item["name"],
                                arguments=item.get("arguments") or "")
    if item["type"] == "function_call_output":
        return llm.FunctionCallOutput(id=item["id"], call_id=item["call_id"], output=item["output"],
                                      is_error=False)
    content: list[llm.ChatContent] = []
    for part in item.get("content") or []:
        text = part.get("text") or part.get("transcript")
        if text:
            content.append(text)
    return llm.ChatMessage(id=item["id"], role=item["role"], content=content)
