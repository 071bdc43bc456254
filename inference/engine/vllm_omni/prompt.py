"""Turn a GenerationRequest into the prompt `AsyncOmni.generate` takes.

The prompt is vLLM's text-prompt dict: the whole conversation rendered with the model's own
chat template (the HF processor's `apply_chat_template`, which puts the model's audio
placeholders where the user spoke), plus the user's audio clips, in order, as
`multi_modal_data`. vLLM expands each placeholder to the clip's audio tokens.

`length(prompt)` counts the tokens vLLM will see (the text's tokens, each audio placeholder as
the clip's audio tokens), which is what the engine's truncation measures.

Tool calls and results go through the chat template when it knows about tools (Qwen3-Omni);
Qwen2.5-Omni's template does not, so for it they are written in the same hermes format Qwen's
text models are trained on: a `<tools>` list in the system message, `<tool_call>` blocks in
assistant turns and `<tool_response>` blocks in user turns.
"""

from __future__ import annotations

import json
from typing import Any

from ..base import (
    INPUT_SAMPLE_RATE, AssistantText, GenerationRequest, SystemText, ToolCall, ToolResult,
    ToolSpec, UserAudio, UserText,
)
from ..chat import QWEN2_5_OMNI_SPEECH_SYSTEM_PROMPT, offered_tools
from ..tool_calls import CLOSE_TAG, OPEN_TAG


def load_processor(model: str) -> Any:
    """The model's HF processor: chat template, tokenizer and the name of its audio token."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model)


class PromptBuilder:
    def __init__(self, processor: Any) -> None:
        self._processor = processor
        template = processor.chat_template if isinstance(processor.chat_template, str) else ""
        self._template_knows_tools = "tool_call" in template
        self.is_qwen2_5_omni = type(processor).__name__.startswith("Qwen2_5Omni")
        self.audio_token_id = _audio_token_id(processor)

    def build(self, request: GenerationRequest) -> dict[str, Any]:
        """The prompt dict for `AsyncOmni.generate(prompt=...)`."""
        tools = offered_tools(request)
        messages, audio_clips = self._messages(request, tools)
        text = self._processor.apply_chat_template(
            messages,
            tools=[_tool_schema(t) for t in tools] if tools and self._template_knows_tools else None,
            tokenize=False,
            add_generation_prompt=True,
        )
        prompt: dict[str, Any] = {"prompt": text}
        if audio_clips:
            prompt["multi_modal_data"] = {"audio": [(clip, INPUT_SAMPLE_RATE) for clip in audio_clips]}
        if "audio" in request.modalities:
            # How vllm-omni's own chat server asks for a voice; Qwen3-Omni honours it per request,
            # stock Qwen2.5-Omni in vllm-omni 0.30 always speaks with its default voice.
            prompt["additional_information"] = {"speaker": [request.voice.lower()]}
        return prompt

    def length(self, prompt: dict[str, Any]) -> int:
        """The prompt's tokens as the thinker sees them: vLLM expands each clip's one
        placeholder token to the clip's audio tokens."""
        clips = (prompt.get("multi_modal_data") or {}).get("audio", [])
        text_tokens = len(self._processor.tokenizer(prompt["prompt"])["input_ids"])
        return text_tokens + sum(self.audio_tokens(len(clip)) - 1 for clip, _ in clips)

    def audio_tokens(self, samples: int) -> int:
        """Audio tokens of a clip of `samples` at 16 kHz: the model's feature extractor frames
        (10 ms hops, at most its window) through its audio encoder's downsampling."""
        extractor = getattr(self._processor, "feature_extractor", None)
        hop = getattr(extractor, "hop_length", 160)
        frames = -(-samples // hop)
        window = getattr(extractor, "n_samples", None)
        if window:
            frames = min(frames, window // hop)
        if self.is_qwen2_5_omni:
            return ((frames - 1) // 2 + 1 - 2) // 2 + 1
        # Qwen3-Omni: 13 tokens per 100 frames, the rest downsampled four times
        rest = (frames % 100 - 1) // 2 + 1
        return ((rest - 1) // 2 + 1 - 1) // 2 + 1 + (frames // 100) * 13

    def _messages(self, request: GenerationRequest, tools: list[ToolSpec]) -> tuple[list[dict], list]:
        system_text = self._system_text(request, tools)
        # With no system text, the template puts in the model's default system turn.
        messages: list[dict[str, Any]] = [{"role": "system", "content": system_text}] if system_text else []
        audio_clips = []
        for item in request.context:
            if isinstance(item, UserAudio):
                audio_clips.append(item.audio)
                _user_part(messages, {"type": "audio", "audio": item.audio})
            elif isinstance(item, UserText):
                _user_part(messages, {"type": "text", "text": item.text})
            elif isinstance(item, SystemText):
                messages.append({"role": "system", "content": item.text})
            elif isinstance(item, AssistantText):
                _assistant(messages)["content"] += item.text
            elif isinstance(item, ToolCall):
                self._add_tool_call(messages, item)
            elif isinstance(item, ToolResult):
                self._add_tool_result(messages, item)
            else:
                raise TypeError(f"unknown conversation item {type(item).__name__}")
        return messages, audio_clips

    def _system_text(self, request: GenerationRequest, tools: list[ToolSpec]) -> str:
        parts = []
        if self.is_qwen2_5_omni and "audio" in request.modalities:
            parts.append(QWEN2_5_OMNI_SPEECH_SYSTEM_PROMPT)
        if request.instructions:
            parts.append(request.instructions)
        if tools and not self._template_knows_tools:
            parts.append(_hermes_tools_block(tools))
        if tools and request.tool_choice == "required":
            parts.append("In this reply you must call one of the tools.")
        elif tools and request.tool_choice != "auto":
            parts.append(f"In this reply you must call the tool `{request.tool_choice}`.")
        return "\n\n".join(parts)

    def _add_tool_call(self, messages: list[dict], call: ToolCall) -> None:
        assistant = _assistant(messages)
        if self._template_knows_tools:
            assistant.setdefault("tool_calls", []).append({
                "type": "function", "id": call.call_id,
                "function": {"name": call.name, "arguments": call.arguments},
            })
        else:
            block = f'{OPEN_TAG}\n{{"name": {json.dumps(call.name)}, "arguments": {call.arguments or "{}"}}}\n{CLOSE_TAG}'
            assistant["content"] += ("\n" if assistant["content"] else "") + block

    def _add_tool_result(self, messages: list[dict], result: ToolResult) -> None:
        if self._template_knows_tools:
            messages.append({"role": "tool", "tool_call_id": result.call_id, "content": result.output})
        else:
            _user_part(messages, {"type": "text", "text": f"<tool_response>\n{result.output}\n</tool_response>"})


def _user_part(messages: list[dict], part: dict) -> None:
    """Add to the user turn in progress (audio then text of one turn make one message)."""
    if not messages or messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": []})
    messages[-1]["content"].append(part)


def _assistant(messages: list[dict]) -> dict:
    """The assistant turn in progress (its text and tool calls make one message)."""
    if not messages or messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": ""})
    return messages[-1]


def _tool_schema(tool: ToolSpec) -> dict:
    return {"type": "function",
            "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters}}


def _hermes_tools_block(tools: list[ToolSpec]) -> str:
    listing = "\n".join(json.dumps(_tool_schema(t), ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\n"
        "You can call functions to help with the user's request. Their signatures are listed "
        f"inside <tools></tools>:\n<tools>\n{listing}\n</tools>\n\n"
        "To call one, write a JSON object with its name and arguments inside "
        f"{OPEN_TAG}{CLOSE_TAG} tags:\n"
        f'{OPEN_TAG}\n{{"name": <function-name>, "arguments": <arguments-json-object>}}\n{CLOSE_TAG}'
    )


def _audio_token_id(processor: Any) -> int | None:
    """Id of the placeholder token vLLM repeats once per audio token in the prompt."""
    token = getattr(processor, "audio_token", None)
    tokenizer = getattr(processor, "tokenizer", None)
    if token is None or tokenizer is None:
        return None
    return tokenizer.convert_tokens_to_ids(token)
