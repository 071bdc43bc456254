"""The engine interface: one conversation in, a stream of deltas out.

The gateway (inference.session) knows nothing about models; an engine knows nothing about
the wire. The request carries the *whole* conversation every time, so a worker restart loses
nothing that a client can replay. An engine may keep per-session state between requests (KV
caches, audio-encoder outputs) under the request's `session_id`, but only as a cache keyed by
exact content: a request whose context differs from what was cached reuses only the part
before the first difference, and a request with no cache at all gives the same reply.

Cancellation: closing the async iterator returned by `generate` (or cancelling the task that
iterates it) must stop engine work within one decode step and release its memory.

Truncation: the engine owns token counts, the gateway owns the conversation. Each context item
names the conversation item it came from (`item_id`); when the prompt does not fit, an engine
leaves out whole conversation items from the oldest, as `request.truncation` allows
(`inference.engine.truncation.fit_context` does the choosing for both engines), and says so
with a `ContextTruncated` delta before any output, so that the gateway moves the point from
which it sends the conversation.
"""

from __future__ import annotations

import abc
import functools
import hashlib
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Literal, Union

import numpy as np

from .exceptions import EngineError


INPUT_SAMPLE_RATE = 16_000
OUTPUT_SAMPLE_RATE = 24_000


# --------------------------------------------------------------------------- context items

# Every context item may name the conversation item it came from (`item_id`): the unit an
# engine may leave out when the prompt does not fit. None: never left out (the input of one
# response, not of the conversation).

@dataclass
class UserAudio:
    """User speech, float32 mono in [-1, 1] at 16 kHz. The samples must not change once the
    item is made: its `key` is computed from them once."""
    audio: np.ndarray
    item_id: str | None = None

    @functools.cached_property
    def key(self) -> int:
        """A 62-bit content hash of the samples: what an engine's caches (prefix, audio
        encoder) know the clip by. Kept on the item, so a conversation whose items live from
        turn to turn hashes each clip once, not on every turn."""
        samples = np.ascontiguousarray(self.audio, dtype=np.float32).reshape(-1)
        digest = hashlib.blake2b(samples.tobytes(), digest_size=8).digest()
        return int.from_bytes(digest, "little") & ((1 << 62) - 1)


@dataclass
class UserImage:
    """A picture the user showed, as the model is to read it.

    `pixels`: RGB, uint8, H×W×3, already resized by the worker to the engine's `ImageSpec`
    (both sides multiples of `token_px`, within the detail's pixel budget), read-only: its
    `key` is computed from it once. `tokens`: the image tokens the model reads for it,
    (H / token_px) × (W / token_px), before the family's own start/end markers. `detail`: what
    the client asked for ("low" or "high"; "auto" arrives as "high"). Several pictures of one
    turn, and the audio or text after them, are consecutive context items of the user.
    """
    pixels: np.ndarray
    tokens: int
    detail: Literal["low", "high"] = "high"
    item_id: str | None = None

    @functools.cached_property
    def key(self) -> int:
        """A 62-bit content hash of the pixels and their shape: what an engine's caches (prefix,
        vision encoder) know the picture by. The same picture sent again has the same key."""
        pixels = np.ascontiguousarray(self.pixels, dtype=np.uint8)
        digest = hashlib.blake2b(pixels.tobytes(), digest_size=8,
                                 person=b"%dx%d" % pixels.shape[:2]).digest()
        return int.from_bytes(digest, "little") & ((1 << 62) - 1)

    @property
    def height(self) -> int:
        return int(self.pixels.shape[0])

    @property
    def width(self) -> int:
        return int(self.pixels.shape[1])


@dataclass
class UserVideo:
    """A camera clip with the speech said over it, read as the models were trained on video
    (transformers' `use_audio_in_video=True`): the frames' tokens and the audio's in time order.

    `frames`: RGB, uint8, T×H×W×3, already at the model's size (both sides multiples of the
    engine's `ImageSpec.token_px`; T a multiple of the family's frames per video token, 2 for
    both families), read-only. `fps`: the frames a second they were taken at. `audio`: the
    speech over them, float32 mono in [-1, 1] at 16 kHz. Neither may change once the item is
    made: `key` and `audio_key` are computed from them once."""
    frames: np.ndarray
    fps: float
    audio: np.ndarray
    item_id: str | None = None

    @functools.cached_property
    def key(self) -> int:
        """A 62-bit content hash of the frames, their shape and rate: what an engine's caches
        (prefix, vision encoder) know the frames by."""
        frames = np.ascontiguousarray(self.frames, dtype=np.uint8)
        digest = hashlib.blake2b(frames.tobytes(), digest_size=8, person=b"video %g" % self.fps,
                                 salt=b"%dx%dx%d" % frames.shape[:3]).digest()
        return int.from_bytes(digest, "little") & ((1 << 62) - 1)

    @functools.cached_property
    def audio_key(self) -> int:
        """Its audio's hash, as `UserAudio.key` would give it (the audio encoder's cache key)."""
        return UserAudio(self.audio).key


@dataclass
class UserText:
    text: str
    item_id: str | None = None


@dataclass
class SystemText:
    text: str
    item_id: str | None = None


@dataclass
class AssistantText:
    """An earlier assistant turn as the listener heard it (transcript, possibly truncated)."""
    text: str
    item_id: str | None = None


@dataclass
class ToolCall:
    call_id: str
    name: str
    arguments: str  # JSON text, as the model produced it
    item_id: str | None = None


@dataclass
class ToolResult:
    call_id: str
    output: str
    item_id: str | None = None


ContextItem = Union[UserAudio, UserImage, UserVideo, UserText, SystemText, AssistantText, ToolCall, ToolResult]


@dataclass(frozen=True)
class ImageSpec:
    """How an engine's model reads pictures: what the worker resizes every picture to.

    `token_px`: the side of the square of pixels one image token covers (patch × spatial
    merge): Qwen2.5-Omni 28 (14 px patches, 2×2 merge), Qwen3-Omni 32 (16 px, 2×2).
    `min_pixels`, `max_pixels`: the fewest and most pixels one picture may have for the model
    (a smaller picture is scaled up, a larger one down; the worker's per-detail budgets are
    capped by `max_pixels`). Both sides of a resized picture are multiples of `token_px`, so
    the family's own processor has nothing left to resize.
    """
    token_px: int = 28
    min_pixels: int = 4 * 28 * 28
    max_pixels: int = 1024 * 1024


@dataclass(frozen=True)
class VideoSpec:
    """How an engine's model reads video with its speech (`UserVideo`, when `reads_video`):
    what the worker samples a turn's camera frames to (their size is `ImageSpec`'s).

    `fps`: the frames a second the family's processor reads a video at when not told otherwise
    (Qwen2.5-Omni 2, Qwen3-Omni 1); `frames_per_token`: the frames one video token covers (the
    vision encoder's temporal patch: 2 for both), so a video's T is a multiple of it.
    """
    fps: float = 2.0
    frames_per_token: int = 2


@dataclass
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class Truncation:
    """What an engine may do when the conversation does not fit (the session's `truncation`).

    - "auto": leave out the fewest oldest conversation items that make the prompt fit.
    - "disabled": leave out nothing; a prompt that does not fit is refused
      (`ContextLengthExceeded`).
    - "retention_ratio": once the conversation after the instructions (and tools) passes its
      budget (`post_instructions_tokens`, at most what the context holds with room for the
      reply), leave out oldest items until it is at most `retention_ratio` of that budget,
      then nothing until it passes the budget again: the prompt's start stays the same for
      the turns in between, so a prefix cache keeps serving them.

    Whole items only: a function call leaves with its output, an assistant message is never
    cut inside (it is what the listener heard), and the newest item always stays.
    """
    mode: Literal["auto", "disabled", "retention_ratio"] = "auto"
    retention_ratio: float = 1.0
    post_instructions_tokens: int | None = None


@dataclass
class GenerationRequest:
    request_id: str
    instructions: str
    context: list[ContextItem]
    tools: list[ToolSpec] = field(default_factory=list)
    # "auto" | "none" | "required" | a tool name that must be called
    tool_choice: str = "auto"
    modalities: tuple[str, ...] = ("audio",)
    voice: str = "Chelsie"
    max_output_tokens: int | None = None
    #: the conversation this request belongs to; engines scope their caches by it (None: no cache)
    session_id: str | None = None
    #: "realtime" replies someone is waiting to hear; "background" work (e.g. transcribing a
    #: user turn) runs only in what realtime replies leave over
    priority: Literal["realtime", "background"] = "realtime"
    #: what the engine may leave out of `context` when it does not fit
    truncation: Truncation = field(default_factory=Truncation)
    #: called on the event loop with the cut (`ContextTruncated`) an engine settled for this
    #: request after its generation was cancelled, so the gateway applies it all the same
    #: (`inference.engine.prepare`); None: nobody needs it
    on_late_cut: Callable[[ContextTruncated], None] | None = field(default=None, repr=False, compare=False)


# --------------------------------------------------------------------------- deltas

@dataclass
class TextDelta:
    """Text of the reply (the spoken transcript when audio is produced)."""
    text: str


@dataclass
class AudioDelta:
    """24 kHz float32 mono samples in [-1, 1]."""
    audio: np.ndarray


@dataclass
class ToolCallDelta:
    """A complete function call the model decided to make."""
    call_id: str
    name: str
    arguments: str


@dataclass
class ContextTruncated:
    """The conversation did not fit: the model reads it from `first_item_id` on.

    The first delta of a generation, before any output, and only when items were left out:
    `dropped_items` conversation items, `dropped_tokens` prompt tokens."""
    first_item_id: str
    dropped_items: int
    dropped_tokens: int


@dataclass
class PromptRead:
    """The prompt the model reads (after any truncation), known before any of the reply: what
    the gateway reports as a response's usage when it is cancelled or fails before `Finished`.
    Engines send it after `ContextTruncated` (if any) and before any output."""
    input_tokens: int
    input_audio_tokens: int = 0
    input_image_tokens: int = 0
    input_video_tokens: int = 0    # of input_image_tokens, the videos' frames'


@dataclass
class Finished:
    """Always the last delta of a generation that was not cancelled."""
    reason: Literal["stop", "length", "tool_calls"] = "stop"
    input_tokens: int = 0          # the prompt the model read (after any truncation)
    input_audio_tokens: int = 0
    cached_tokens: int = 0         # of input_tokens, those taken from a cache (not computed)
    cached_audio_tokens: int = 0   # of cached_tokens, the audio ones
    input_image_tokens: int = 0    # of input_tokens, the pictures' and videos' frames' (markers not counted)
    cached_image_tokens: int = 0   # of cached_tokens, the pictures' and videos' frames' ones
    input_video_tokens: int = 0    # of input_image_tokens, the videos' frames'
    cached_video_tokens: int = 0   # of cached_image_tokens, the videos' frames'
    output_text_tokens: int = 0
    output_audio_tokens: int = 0
    # seconds from the request to the first audio / text sample, and in total
    timings: dict[str, float] = field(default_factory=dict)


Delta = Union[ContextTruncated, PromptRead, TextDelta, AudioDelta, ToolCallDelta, Finished]


@dataclass
class EngineLoad:
    """How busy the engine is, for `/health` and the agent's load report."""
    running: int      # replies being generated
    waiting: int      # replies admitted but waiting for memory
    capacity: int     # replies the engine's memory holds at once
    # seconds since the engine's loop last came round (0 while it does): a loop blocked this
    # long (a hung device) serves nobody, and /health says so (server.py, STALLED_AFTER_S)
    stalled_s: float = 0.0


class OmniEngine(abc.ABC):
    """What the gateway needs from a model backend."""

    name: str = "engine"
    #: voices the engine can speak with; the first one is the default
    voices: tuple[str, ...] = ("Chelsie",)
    #: thinker tokens one prompt and its reply share (known once started); None: not known
    context_tokens: int | None = None
    #: the named set of defaults it runs ("exact": the model's own computation); None: no presets
    preset: str | None = None
    #: whether the model reads pictures (`UserImage`); the gateway refuses an input_image part
    #: at conversation.item.create when False, and `refuse_unread_media` refuses a request holding one
    reads_images: bool = False
    #: how the model reads pictures (when `reads_images`): the worker resizes to it
    image_spec: ImageSpec = ImageSpec()
    #: whether the model reads video with its speech (`UserVideo`); `refuse_unread_media` refuses a
    #: request holding one when False, and the gateway refuses the session's `input_video`
    reads_video: bool = False
    #: how the model reads video (when `reads_video`): the worker samples a turn's frames to it
    video_spec: VideoSpec = VideoSpec()
    #: pictures one prompt may hold (vLLM's `limit_mm_per_prompt` image); None: the worker's limit
    max_images_per_prompt: int | None = None

    def __init__(self, model: str) -> None:
        self.model = model

    @abc.abstractmethod
    async def start(self) -> None:
        """Load weights and warm up; log progress. The worker is not healthy until this returns."""

    @abc.abstractmethod
    def generate(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        """Stream the reply. Ends with `Finished` unless cancelled or failed (EngineError)."""

    def refuse_unread_media(self, request: GenerationRequest) -> None:
        """Every engine calls this before any work: a request holding a picture (a video) the
        engine does not read is refused, never read as if it were not there."""
        if not self.reads_images and any(isinstance(item, UserImage) for item in request.context):
            raise EngineError(f"this engine ({self.name}, model {self.model}) does not read pictures")
        if not self.reads_video and any(isinstance(item, UserVideo) for item in request.context):
            raise EngineError(f"this engine ({self.name}, model {self.model}) does not read video")

    def load(self) -> EngineLoad | None:
        """Current load, or None when the engine does not know its capacity."""
        return None

    def end_session(self, session_id: str) -> None:
        """The session is gone: drop whatever the engine cached for it. Default: nothing."""

    async def close(self) -> None:
        """Release the model. Default: nothing to do."""
