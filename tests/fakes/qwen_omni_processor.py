"""Stand-ins for the HF processors of Qwen2.5-Omni and Qwen3-Omni (no weights download here).

What the vllm-omni engine uses of a real processor: `chat_template`, `apply_chat_template`
(rendered with transformers' own Jinja renderer), `audio_token`, `image_token`,
`image_processor` (its patch and merge sizes and pixel bounds),
`tokenizer.convert_tokens_to_ids`, `get_added_vocab` and `tokenizer(texts, split_special_tokens=…)`
(to tokenize a prompt with client text as text). The templates are short ones of our own that lay turns
out like the real ones: `<|im_start|>role ... <|im_end|>` turns, the model's audio
placeholder where the user spoke, its vision markers around one image placeholder where the
user showed a picture, and for Qwen3-Omni tools, `<tool_call>` and `<tool_response>` blocks.
Qwen2.5-Omni's real template has no tool support; neither does ours. The image processors
hold the families' patch sizes (14 and 16 px, merged 2×2) and pixel bounds of our choosing.
"""

from __future__ import annotations

import re

from transformers.utils.chat_template_utils import render_jinja_template

NL = "{{ '\\n' }}"  # an explicit newline: Jinja's block trimming cannot eat it

_TURNS = (
    "{% for message in messages %}"
    "<|im_start|>{{ message.role }}" + NL +
    "{% if message.content is string %}{{ message.content }}"
    "{% else %}{% for part in message.content %}"
    "{% if part.type == 'audio' %}AUDIO_PLACEHOLDER{% elif part.type == 'image' %}IMAGE_PLACEHOLDER"
    "{% elif part.type == 'text' %}{{ part.text }}{% endif %}"
    "{% endfor %}{% endif %}"
    "TOOL_CALLS"
    "<|im_end|>" + NL +
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant" + NL + "{% endif %}"
)

QWEN2_5_OMNI_TEMPLATE = _TURNS.replace("AUDIO_PLACEHOLDER", "<|audio_bos|><|AUDIO|><|audio_eos|>").replace(
    "IMAGE_PLACEHOLDER", "<|vision_bos|><|IMAGE|><|vision_eos|>").replace("TOOL_CALLS", "")

QWEN3_OMNI_TEMPLATE = (
    "{% if tools %}<|im_start|>system" + NL
    + "{% if messages[0].role == 'system' %}{{ messages[0].content }}" + NL + NL + "{% endif %}"
    "<tools>" + NL + "{% for tool in tools %}{{ tool | tojson }}" + NL + "{% endfor %}</tools><|im_end|>" + NL +
    "{% if messages[0].role == 'system' %}{% set messages = messages[1:] %}{% endif %}{% endif %}"
    + _TURNS.replace("AUDIO_PLACEHOLDER", "<|audio_start|><|audio_pad|><|audio_end|>")
    .replace("IMAGE_PLACEHOLDER", "<|vision_start|><|image_pad|><|vision_end|>")
    .replace("<|im_start|>{{ message.role }}" + NL,
             "{% if message.role == 'tool' %}<|im_start|>user" + NL + "<tool_response>" + NL
             + "{{ message.content }}" + NL + "</tool_response><|im_end|>" + NL + "{% continue %}{% endif %}"
             "<|im_start|>{{ message.role }}" + NL)
    .replace("TOOL_CALLS",
             "{% for call in message.tool_calls or [] %}" + NL + "<tool_call>" + NL +
             '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments }}}'
             + NL + "</tool_call>{% endfor %}")
)


class _Tokenizer:
    """Special tokens (`<|...|>`) are one token each, as in the real tokenizer; words and
    punctuation one token each (a real BPE gives a few more, which no test depends on)."""

    _TOKENS = re.compile(r"<\|[^|]+\|>|\w+|[^\w\s]")

    def __init__(self, special_ids: dict[str, int]) -> None:
        self._special_ids = special_ids

    def convert_tokens_to_ids(self, token: str) -> int:
        return self._special_ids[token]

    def get_added_vocab(self) -> dict[str, int]:
        return dict(self._special_ids)

    def __call__(self, text: str | list[str], add_special_tokens: bool = True,
                 split_special_tokens: bool = False) -> dict[str, list]:
        """As a real tokenizer: `split_special_tokens` reads special tokens as their characters."""
        if isinstance(text, list):
            return {"input_ids": [self(t, add_special_tokens, split_special_tokens)["input_ids"] for t in text]}
        ids = []
        for token in self._TOKENS.findall(text):
            if token in self._special_ids and split_special_tokens:
                ids.extend(1000 + len(piece) for piece in re.findall(r"\w+|[^\w\s]", token))
            else:
                ids.append(self._special_ids.get(token, 1000 + len(token)))
        return {"input_ids": ids}


class _ImageProcessor:
    """A Qwen-VL image processor's sizes, as a transformers 5 one holds them."""

    def __init__(self, patch_size: int, merge_size: int = 2, shortest_edge: int = 3136,
                 longest_edge: int = 12_845_056) -> None:
        self.patch_size, self.merge_size = patch_size, merge_size
        self.size = {"shortest_edge": shortest_edge, "longest_edge": longest_edge}


class _Processor:
    chat_template: str
    audio_token: str
    audio_token_id: int
    image_token: str
    image_token_id: int
    patch_size: int

    def __init__(self) -> None:
        self.tokenizer = _Tokenizer({self.audio_token: self.audio_token_id, self.image_token: self.image_token_id})
        self.image_processor = _ImageProcessor(self.patch_size)

    def apply_chat_template(self, conversation, chat_template=None, tools=None, add_generation_prompt=False,
                            tokenize=False, **kwargs) -> str:
        assert not tokenize, "the engine renders text; vLLM tokenizes"
        rendered, _ = render_jinja_template(
            conversations=[conversation], tools=tools, chat_template=chat_template or self.chat_template,
            add_generation_prompt=add_generation_prompt, **kwargs)
        return rendered[0]


class Qwen2_5OmniProcessor(_Processor):
    chat_template = QWEN2_5_OMNI_TEMPLATE
    audio_token = "<|AUDIO|>"
    audio_token_id = 151646
    image_token = "<|IMAGE|>"
    image_token_id = 151655
    patch_size = 14


class Qwen3OmniMoeProcessor(_Processor):
    chat_template = QWEN3_OMNI_TEMPLATE
    audio_token = "<|audio_pad|>"
    audio_token_id = 151675
    image_token = "<|image_pad|>"
    image_token_id = 151655
    patch_size = 16
