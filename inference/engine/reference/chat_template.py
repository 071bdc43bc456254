"""The chat template the engine installs where a checkpoint's own has no tools: an omni
model's multimodal message format plus hermes-style tool calling (the style the Qwen text
models the thinkers grow from were trained on).

- the first system message gets a `# Tools` section listing the tools as JSON;
- an assistant turn with `tool_calls` ends with `<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>`;
- `tool` messages become a user turn of `<tool_response>…</tool_response>` blocks;
- an audio, image or video part renders as the family's media markers (`MediaMarkers`), which
  the prompt then expands to one token per encoder output frame.

Real checkpoints keep their own template unless it lacks tool support.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MediaMarkers:
    """How a family's template writes one audio, image or video part."""
    audio: str
    image: str
    video: str


def chat_template(markers: MediaMarkers) -> str:
    """The template with `markers` for media parts."""
    return (_TEMPLATE.replace("@AUDIO@", markers.audio).replace("@IMAGE@", markers.image)
            .replace("@VIDEO@", markers.video))


_TEMPLATE = (
    "{%- macro render_content(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part.type == 'audio' or 'audio' in part or 'audio_url' in part -%}"
    "{{- '@AUDIO@' -}}"
    "{%- elif part.type == 'image' or 'image' in part or 'image_url' in part -%}"
    "{{- '@IMAGE@' -}}"
    "{%- elif part.type == 'video' or 'video' in part -%}"
    "{{- '@VIDEO@' -}}"
    "{%- elif 'text' in part -%}{{- part.text -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    # ---- system turn (always first), with the tool list when tools are offered
    "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set system_text = render_content(messages[0].content) -%}"
    "{%- set first = 1 -%}"
    "{%- else -%}"
    "{%- set system_text = 'You are a helpful assistant.' -%}"
    "{%- set first = 0 -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system_text -}}"
    "{%- if tools -%}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'"
    " + 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and '"
    " + 'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'"
    " + '{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    # ---- the rest of the conversation
    "{%- set rest = messages[first:] -%}"
    "{%- for message in rest -%}"
    "{%- if message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant' -}}"
    "{%- if message.content -%}{{- '\\n' + render_content(message.content) -}}{%- endif -%}"
    "{%- for call in (message.tool_calls or []) -%}"
    "{%- if call.function is defined -%}{%- set call = call.function -%}{%- endif -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' -}}"
    "{%- if call.arguments is string -%}{{- call.arguments -}}"
    "{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or rest[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + render_content(message.content) + '\\n</tool_response>' -}}"
    "{%- if loop.last or rest[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + render_content(message.content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
