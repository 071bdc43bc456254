"""One session's conversation: ordered items, their audio, truncation, and the engine context.

Items are kept in their wire form (audio payloads stripped, so events that echo items stay
small) next to the decoded user audio (int16, 16 kHz). `to_context()` turns them into the
engine's context items, which is everything the engine ever sees of the history.

Context truncation (the session's `truncation`): when the engine had to leave the oldest items
out of the prompt, `leave_context()` marks them; they are never sent to the engine again. As
in OpenAI's Realtime API they stay in the conversation (listed, retrievable, their transcripts
kept), but their audio is freed at once (nobody reads it again, so a long call's memory stays
flat, and the audio limit counts only what the model reads), and when the item limit is
reached the oldest of them are deleted to make room (`make_room`).

Pictures (`input_image` parts) are kept as the RGB pixels the engine reads, decoded and
resized once when the item is made (inference.images); their bytes are not kept, and items
echo the part without its URL. The model reads at most so many pictures (and image tokens) in
one response: `limit_images` takes the oldest out of the context beyond that (the item stays,
with its words), down to half of each limit at once, so the prompt's start then stays the same
for the turns after (an engine's prefix cache keeps serving them).

A turn committed with camera frames (the session's `input_video`) keeps its video beside its
audio (inference.video): the engine reads the two as one `UserVideo`. Videos are bounded the
same way (`limit_videos`): beyond the video tokens one response reads, the oldest turns' frames
leave the context and their audio stays, read as plain speech.

Memory: each clip is kept once, as the float32 samples the engine reads (its engine item
shares them), and `nbytes` counts what the conversation holds (audio, text, a fixed cost per
item and part), which is what the session's memory budget checks.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from . import engine as eng
from .audio import int16_to_float
from .protocol import FunctionCallItem, FunctionCallOutputItem, MessageItem, new_id
from .video import TurnVideo

Item = MessageItem | FunctionCallItem | FunctionCallOutputItem


class ConversationError(ValueError):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


# What an item and a content part cost beside their text and audio (the pydantic objects, the
# dict entries): so that a flood of empty items or parts is counted too
ITEM_OVERHEAD_BYTES = 1024
PART_OVERHEAD_BYTES = 512


def text_bytes(text: str | None) -> int:
    """Memory a text takes: the string, and the UTF-8 copy CPython caches in a non-ASCII string
    once it has been serialised (every item is echoed to the client)."""
    if not text:
        return 0
    return sys.getsizeof(text) + (0 if text.isascii() else len(text.encode("utf-8", "surrogatepass")))


@dataclass
class Entry:
    item: Item
    # user audio by content index: float32 at 16 kHz, the samples the engine reads (int16 given
    # here is converted once); read-only, as the engine's item keys the clip by its content
    audio: dict[int, np.ndarray] = field(default_factory=dict)
    # assistant audio produced (or, after truncation, heard) in milliseconds
    audio_ms: int = 0
    # read by the model; False once context truncation has left it out (for good)
    in_context: bool = True
    # the engine's items for `audio`, by (content index, item id): made on the first turn that
    # reads them and kept (they share the samples), so each clip is hashed once per call, not
    # again on every turn as the conversation grows
    _user_audio: dict[tuple[int, str | None], eng.UserAudio] = field(default_factory=dict, repr=False)
    # user pictures by content index, as the engine reads them (item_id None: named per use)
    images: dict[int, eng.UserImage] = field(default_factory=dict)
    # the video said over the audio of content part `index` (a turn committed with frames)
    videos: dict[int, TurnVideo] = field(default_factory=dict)
    _user_video: dict[tuple[int, str | None], eng.UserVideo] = field(default_factory=dict, repr=False)
    _nbytes: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for index, samples in self.audio.items():
            if samples.dtype != np.float32:
                samples = int16_to_float(samples)
            samples.flags.writeable = False
            self.audio[index] = samples

    def user_audio(self, index: int, item_id: str | None) -> eng.UserAudio:
        """The engine's item for the audio of content part `index` (the same samples)."""
        made = self._user_audio.get((index, item_id))
        if made is None:
            made = self._user_audio[(index, item_id)] = eng.UserAudio(self.audio[index], item_id=item_id)
        return made

    def user_video(self, index: int, item_id: str | None) -> eng.UserVideo:
        """The engine's item for the video and audio of content part `index` (the same frames
        and samples), made once, so its keys are hashed once."""
        made = self._user_video.get((index, item_id))
        if made is None:
            video = self.videos[index]
            made = self._user_video[(index, item_id)] = eng.UserVideo(
                video.frames, fps=video.fps, audio=self.audio[index], item_id=item_id)
        return made

    def user_image(self, index: int, item_id: str | None) -> eng.UserImage:
        """The engine's item for the picture of content part `index`, named `item_id` (the
        same pixels, and the key already hashed)."""
        image = self.images[index]
        if image.item_id == item_id:
            return image
        named = dataclasses.replace(image, item_id=item_id)
        if "key" in image.__dict__:
            named.__dict__["key"] = image.__dict__["key"]
        return named

    def forget_audio(self) -> None:
        """Free the user audio and pictures (the item has left the model's context for good)."""
        self.audio.clear()
        self._user_audio.clear()
        self.images.clear()
        self.videos.clear()
        self._user_video.clear()
        self._nbytes = None

    def forget_video(self, index: int) -> None:
        """Free one turn's frames: the model reads its audio alone (`Conversation.limit_videos`)."""
        self.videos.pop(index, None)
        self._user_video = {key: made for key, made in self._user_video.items() if key[0] != index}
        self._nbytes = None

    def forget_image(self, index: int) -> None:
        """Free one picture: the model no longer reads it (`Conversation.limit_images`)."""
        self.images.pop(index, None)
        self._nbytes = None

    def changed(self) -> None:
        """The item's text changed (a reply streaming into it, a truncation): count it again."""
        self._nbytes = None

    @property
    def nbytes(self) -> int:
        if self._nbytes is None:
            item = self.item
            size = ITEM_OVERHEAD_BYTES + sum(a.nbytes for a in self.audio.values())
            size += sum(image.pixels.nbytes for image in self.images.values())
            size += sum(video.nbytes for video in self.videos.values())
            size += text_bytes(item.id)
            if isinstance(item, FunctionCallItem):
                size += text_bytes(item.call_id) + text_bytes(item.name) + text_bytes(item.arguments)
            elif isinstance(item, FunctionCallOutputItem):
                size += text_bytes(item.call_id) + text_bytes(item.output)
            else:
                size += sum(PART_OVERHEAD_BYTES + text_bytes(part.text) + text_bytes(part.transcript)
                            for part in item.content)
            self._nbytes = size
        return self._nbytes


class Conversation:
    def __init__(self, max_items: int, max_audio_s: float) -> None:
        self._entries: list[Entry] = []
        self._max_items = max_items
        self._max_audio_samples = int(max_audio_s * eng.INPUT_SAMPLE_RATE)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self):
        return iter(self._entries)

    def get(self, item_id: str) -> Entry:
        for entry in self._entries:
            if entry.item.id == item_id:
                return entry
        raise ConversationError("item_not_found", f"no conversation item with id {item_id!r}", "item_id")

    @property
    def full(self) -> bool:
        return len(self._entries) >= self._max_items

    def audio_samples(self) -> int:
        return sum(a.size for e in self._entries for a in e.audio.values())

    @property
    def nbytes(self) -> int:
        """What the conversation holds in memory (`Entry.nbytes`), for the session's budget."""
        return sum(entry.nbytes for entry in self._entries)

    def images_in_context(self) -> list[tuple[Entry, int]]:
        """The pictures the model reads, oldest first, as (entry, content index)."""
        return [(entry, index) for entry in self._entries if entry.in_context for index in sorted(entry.images)]

    def limit_images(self, max_images: int, max_tokens: int) -> list[str]:
        """When the model would read more than `max_images` pictures or `max_tokens` image
        tokens, the oldest pictures leave its context (their items and words stay) until what
        is left is within half of each (at least the newest picture stays, unless no picture
        fits at all: a response's own input took the room). Returns the ids of the items whose
        pictures left."""
        pictures = self.images_in_context()
        tokens = sum(entry.images[index].tokens for entry, index in pictures)
        if len(pictures) <= max_images and tokens <= max_tokens:
            return []
        keep = 1 if max_images > 0 and max_tokens > 0 else 0
        left: list[str] = []
        while len(pictures) > keep and (len(pictures) > max(keep, max_images // 2) or tokens > max_tokens // 2):
            entry, index = pictures.pop(0)
            tokens -= entry.images[index].tokens
            entry.forget_image(index)
            left.append(entry.item.id)  # type: ignore[arg-type]
        return list(dict.fromkeys(left))

    def limit_videos(self, max_tokens: int) -> list[str]:
        """When the model would read more than `max_tokens` video tokens, the oldest turns'
        frames leave its context (their audio stays) until what is left is within half of it,
        the newest video always kept. Returns the ids of the items whose frames left."""
        videos = [(entry, index) for entry in self._entries if entry.in_context for index in sorted(entry.videos)]
        tokens = sum(entry.videos[index].tokens for entry, index in videos)
        if tokens <= max_tokens:
            return []
        left: list[str] = []
        while len(videos) > 1 and tokens > max_tokens // 2:
            entry, index = videos.pop(0)
            tokens -= entry.videos[index].tokens
            entry.forget_video(index)
            left.append(entry.item.id)  # type: ignore[arg-type]
        return left

    def add(self, entry: Entry, previous_item_id: str | None = None, *,
            from_response: bool = False) -> tuple[str | None, list[str]]:
        """Insert after `previous_item_id` ("root" = at the start; None = at the end).

        Returns the id of the item now before it, and the ids of the items deleted to make
        room for it (`make_room`). Validates everything before changing anything. A
        response's own items are not refused for the item count: a response only starts while
        the conversation has room, and it adds a few items at most.
        """
        previous = self.get(previous_item_id) if previous_item_id not in (None, "root") else None
        if self.full and not from_response and self._outside(keep=previous) is None:
            raise ConversationError(
                "conversation_full", f"the conversation already holds {self._max_items} items; delete some first")
        new_samples = sum(a.size for a in entry.audio.values())
        if new_samples and self.audio_samples() + new_samples > self._max_audio_samples:
            raise ConversationError(
                "conversation_audio_limit",
                f"the conversation would hold more than {self._max_audio_samples // eng.INPUT_SAMPLE_RATE} s "
                "of user audio the model reads; delete earlier items first")
        if entry.item.id is None:
            entry.item.id = new_id("item")
        elif any(e.item.id == entry.item.id for e in self._entries):
            raise ConversationError("item_id_taken", f"an item with id {entry.item.id!r} already exists", "item.id")
        deleted = [] if from_response else self.make_room(keep=previous)
        if previous_item_id is None:
            index = len(self._entries)
        elif previous_item_id == "root":
            index = 0
        else:
            index = self._entries.index(previous) + 1
        self._entries.insert(index, entry)
        return (self._entries[index - 1].item.id if index else None), deleted

    def delete(self, item_id: str) -> None:
        self._entries.remove(self.get(item_id))

    def clear(self) -> None:
        """Drop every item (the session is over): freed now, not when the session's object is."""
        self._entries.clear()

    def leave_context(self, item_ids: Iterable[str]) -> None:
        """These items (the ones a response's cut left out of what the model read) leave the
        context for good, and their audio is freed. Named by id, not as "everything before the
        cut": the client may delete items, or insert some before the cut, while the reply is
        prepared, and an item inserted then was never read, so it stays."""
        leaving = set(item_ids)
        for entry in self._entries:
            if entry.item.id in leaving:
                entry.in_context = False
                entry.forget_audio()

    def make_room(self, keep: Entry | None = None) -> list[str]:
        """At the item limit, delete the oldest items the model no longer reads (other than
        `keep`) until one more fits; returns their ids, oldest first. Items it reads stay."""
        deleted = []
        while self.full and (outside := self._outside(keep)) is not None:
            self._entries.remove(outside)
            deleted.append(outside.item.id)
        return deleted

    def _outside(self, keep: Entry | None) -> Entry | None:
        """The oldest item truncation took out of the model's context, other than `keep`."""
        return next((e for e in self._entries if not e.in_context and e is not keep), None)

    def truncate(self, item_id: str, content_index: int, audio_end_ms: int,
                 heard_transcript: str | None = None) -> None:
        """Cut an assistant audio item to what the listener heard."""
        entry = self.get(item_id)
        item = entry.item
        if not (isinstance(item, MessageItem) and item.role == "assistant"):
            raise ConversationError("invalid_item_type", "only assistant messages can be truncated", "item_id")
        if not (0 <= content_index < len(item.content)) or item.content[content_index].type != "output_audio":
            raise ConversationError(
                "invalid_content_index", f"content {content_index} of {item_id!r} is not audio", "content_index")
        if audio_end_ms > entry.audio_ms:
            raise ConversationError(
                "invalid_audio_end_ms",
                f"audio_end_ms {audio_end_ms} is past the end of the item's audio ({entry.audio_ms} ms)",
                "audio_end_ms")
        part = item.content[content_index]
        full = part.transcript or ""
        if heard_transcript is not None:
            part.transcript = heard_transcript
        else:
            part.transcript = cut_transcript(full, audio_end_ms / entry.audio_ms if entry.audio_ms else 0.0)
        entry.audio_ms = audio_end_ms
        item.status = "incomplete" if part.transcript != full else item.status
        entry.changed()

    def to_context(self) -> list[eng.ContextItem]:
        """The items the model still reads, as engine context items named by their item ids."""
        context: list[eng.ContextItem] = []
        for entry in self._entries:
            if entry.in_context:
                context.extend(entry_context(entry))
        return context


def cut_transcript(text: str, fraction: float) -> str:
    """Keep the words that were spoken in the first `fraction` of the audio.

    Text and audio are produced together but not aligned word by word, so this assumes an
    even speaking rate and rounds down to a whole word.
    """
    if fraction >= 1.0:
        return text
    keep = int(len(text) * max(fraction, 0.0))
    if keep < len(text) and keep > 0 and not text[keep].isspace():
        keep = text.rfind(" ", 0, keep) + 1
    return text[:keep].rstrip()


def entry_context(entry: Entry, *, in_conversation: bool = True) -> list[eng.ContextItem]:
    """What the engine sees of one item. Items of the conversation carry their id, so that
    truncation can leave them out; a response's own input items (`in_conversation=False`)
    carry none and always stay."""
    item = entry.item
    item_id = item.id if in_conversation else None
    if isinstance(item, FunctionCallItem):
        return [eng.ToolCall(call_id=item.call_id, name=item.name, arguments=item.arguments, item_id=item_id)]
    if isinstance(item, FunctionCallOutputItem):
        return [eng.ToolResult(call_id=item.call_id, output=item.output, item_id=item_id)]
    out: list[eng.ContextItem] = []
    for index, part in enumerate(item.content):
        if item.role == "assistant":
            text = part.text if part.type in ("output_text", "text") else part.transcript
            if text:
                out.append(eng.AssistantText(text, item_id=item_id))
        elif index in entry.videos and index in entry.audio:
            out.append(entry.user_video(index, item_id))
        elif index in entry.audio:
            out.append(entry.user_audio(index, item_id))
        elif index in entry.images:
            out.append(entry.user_image(index, item_id))
        elif part.type in ("input_audio", "audio") and part.transcript:
            out.append(eng.UserText(part.transcript, item_id=item_id))
        elif part.text:
            out.append(eng.SystemText(part.text, item_id=item_id) if item.role == "system"
                       else eng.UserText(part.text, item_id=item_id))
    return out
