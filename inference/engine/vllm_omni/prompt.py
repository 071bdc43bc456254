"""Turn a GenerationRequest into the prompt `AsyncOmni.generate` takes.

The prompt is vLLM's tokens-prompt dict: the whole conversation rendered with the model's own
chat template (the HF processor's `apply_chat_template`, which puts the model's audio
placeholder where the user spoke, and its vision markers around one image placeholder where
the user showed a picture) and tokenized here, with the client's text read as text
(`inference.engine.plain_text`: a control token typed in a message stays characters, which
vLLM's own tokenization of a text prompt would not do), plus the user's audio clips and
pictures, each in order, as `multi_modal_data` ("audio": `(samples, 16000)` pairs, "image":
PIL images). vLLM expands each placeholder to the clip's audio tokens or the picture's image
tokens. The rendered text rides along under "prompt" for logs; vLLM reads `prompt_token_ids`
when both are there.

Pictures come resized by the worker to the engine's `ImageSpec` (`image_spec()`: both sides
multiples of one image token's pixels, within the processor's pixel bounds), so vLLM's image
processor keeps them as they are and reads (H / token_px) × (W / token_px) tokens, the
picture's `tokens`; a picture that is not so is refused here rather than resized unseen.

`length(prompt)` counts the tokens vLLM will see (the ids, each audio placeholder as the
clip's audio tokens, each image placeholder as the picture's image tokens), which is what
the engine's truncation measures.

Tool calls and results go through the chat template when it knows about tools (Qwen3-Omni);
Qwen2.5-Omni's template does not, so for it they are written in the same hermes format Qwen's
text models are trained on: a `<tools>` list in the system message, `<tool_call>` blocks in
assistant turns and `<tool_response>` blocks in user turns.
"""

from __future__ import annotations

import json
from typing import Any

from PIL import Image

from .. import plain_text
from ..base import (
    INPUT_SAMPLE_RATE, AssistantText, GenerationRequest, ImageSpec, SystemText, ToolCall, ToolResult,
    ToolSpec, UserAudio, UserImage, UserText,
)
from ..chat import QWEN2_5_OMNI_SPEECH_SYSTEM_PROMPT, offered_tools
from ..image_spec import family_spec, spec_within
from ..tool_calls import CLOSE_TAG, OPEN_TAG


def load_processor(model: str) -> Any:
    """The model's HF processor: chat template, tokenizer, the names of its audio and image
    tokens, and its image processor."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model)


class PromptBuilder:
    def __init__(self, processor: Any) -> None:
        self._processor = processor
        template = processor.chat_template if isinstance(processor.chat_template, str) else ""
        self._template_knows_tools = "tool_call" in template
        self.is_qwen2_5_omni = type(processor).__name__.startswith("Qwen2_5Omni")
        self.audio_token_id = _token_id(processor, "audio_token")
        self.image_token_id = _token_id(processor, "image_token")
        self._token_px: int | None = None  # set by image_spec()

    def image_spec(self) -> ImageSpec | None:
        """How the model reads pictures, from its image processor: its family's token size
        (Qwen2.5-Omni 28 px: 14 px patches merged 2×2; Qwen3-Omni 32 px: 16 × 2) within the
        processor's least and most pixels. None when the processor reads no pictures."""
        image_processor = getattr(self._processor, "image_processor", None)
        if image_processor is None or self.image_token_id is None:
            return None
        title = "Qwen2.5-Omni" if self.is_qwen2_5_omni else "Qwen3-Omni"
        spec = spec_within(image_processor, family_spec(28 if self.is_qwen2_5_omni else 32), title)
        self._token_px = spec.token_px
        return spec

    def build(self, request: GenerationRequest) -> dict[str, Any]:
        """The prompt dict for `AsyncOmni.generate(prompt=...)`."""
        tools = offered_tools(request)
        messages, audio_clips, pictures = self._messages(request, tools)
        text = self._processor.apply_chat_template(
            messages,
            tools=[_tool_schema(t) for t in tools] if tools and self._template_knows_tools else None,
            tokenize=False,
            add_generation_prompt=True,
        )
        prompt: dict[str, Any] = {"prompt": plain_text.unmarked(text),
                                  "prompt_token_ids": plain_text.tokenize(self._processor.tokenizer, text)}
        media: dict[str, list] = {}
        if audio_clips:
            media["audio"] = [(clip, INPUT_SAMPLE_RATE) for clip in audio_clips]
        if pictures:
            media["image"] = [self._image(picture) for picture in pictures]
        if media:
            prompt["multi_modal_data"] = media
        if "audio" in request.modalities:
            # How vllm-omni's own chat server asks for a voice; Qwen3-Omni honours it per request,
            # stock Qwen2.5-Omni in vllm-omni 0.30 always speaks with its default voice.
            prompt["additional_information"] = {"speaker": [request.voice.lower()]}
        return prompt

    def length(self, prompt: dict[str, Any]) -> int:
        """The prompt's tokens as the thinker sees them: vLLM expands each clip's one
        placeholder token to the clip's audio tokens, and each picture's to its image tokens."""
        media = prompt.get("multi_modal_data") or {}
        return (len(prompt["prompt_token_ids"])
                + sum(self.audio_tokens(len(clip)) - 1 for clip, _ in media.get("audio", []))
                + sum(self.image_tokens(image) - 1 for image in media.get("image", [])))

    def image_tokens(self, image: Image.Image) -> int:
        """Image tokens of a picture of the prompt (its sides multiples of one token's pixels)."""
        return (image.height // self._token_px) * (image.width // self._token_px)

    def _image(self, picture: UserImage) -> Image.Image:
        """The picture as vLLM takes it, once it is known to be read as it is."""
        if self._token_px is None:
            raise ValueError("this model's processor reads no pictures")
        rows, cols = picture.height // self._token_px, picture.width // self._token_px
        if picture.height % self._token_px or picture.width % self._token_px or rows * cols != picture.tokens:
            raise ValueError(f"a {picture.width}×{picture.height} picture of {picture.tokens} tokens is not one the "
                             f"model reads as it is ({self._token_px} px tokens): the worker resizes pictures to "
                             "the engine's image_spec")
        return Image.fromarray(picture.pixels)

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

    def _messages(self, request: GenerationRequest, tools: list[ToolSpec]) -> tuple[list[dict], list, list]:
        system_text = self._system_text(request, tools)
        # With no system text, the template puts in the model's default system turn.
        messages: list[dict[str, Any]] = [{"role": "system", "content": system_text}] if system_text else []
        audio_clips, pictures = [], []
        for item in request.context:
            if isinstance(item, UserAudio):
                audio_clips.append(item.audio)
                _user_part(messages, {"type": "audio", "audio": item.audio})
            elif isinstance(item, UserImage):
                # the template writes the vision markers and one image placeholder; the
                # pixels go to vLLM in multi_modal_data, not through the template
                pictures.append(item)
                _user_part(messages, {"type": "image"})
            elif isinstance(item, UserText):
                _user_part(messages, {"type": "text", "text": plain_text.as_text(item.text)})
            elif isinstance(item, SystemText):
                messages.append({"role": "system", "content": plain_text.as_text(item.text)})
            elif isinstance(item, AssistantText):
                _assistant(messages)["content"] += plain_text.as_text(item.text)
            elif isinstance(item, ToolCall):
                self._add_tool_call(messages, item)
            elif isinstance(item, ToolResult):
                self._add_tool_result(messages, item)
            else:
                raise TypeError(f"unknown conversation item {type(item).__name__}")
        return messages, audio_clips, pictures

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
                "function": {"name": plain_text.as_text(call.name), "arguments": plain_text.as_text(call.arguments)},
            })
        else:
            block = (f'{OPEN_TAG}\n{{"name": {plain_text.as_text(json.dumps(call.name))}, "arguments": '
                     f'{plain_text.as_text(call.arguments or "{}")}}}\n{CLOSE_TAG}')
            assistant["content"] += ("\n" if assistant["content"] else "") + block

    def _add_tool_result(self, messages: list[dict], result: ToolResult) -> None:
        if self._template_knows_tools:
            messages.append({"role": "tool", "tool_call_id": result.call_id,
                             "content": plain_text.as_text(result.output)})
        else:
            _user_part(messages, {"type": "text",
                                  "text": f"<tool_response>\n{plain_text.as_text(result.output)}\n</tool_response>"})


def _user_part(messages: list[dict], part: dict) -> None:
    """Add to the user turn in progress (pictures, audio and text of one turn make one message)."""
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


def _token_id(processor: Any, name: str) -> int | None:
    """Id of the placeholder token (`audio_token`, `image_token`) vLLM repeats once per audio
    or image token in the prompt."""
    token = getattr(processor, name, None)
    tokenizer = getattr(processor, "tokenizer", None)
    if token is None or tokenizer is None:
        return None
    return tokenizer.convert_tokens_to_ids(token)
