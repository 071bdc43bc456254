"""The user's audio between the framework and the worker's conversation."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class TrimInput:
    """Outbox marker: keep only the last `keep_bytes` of the worker's input buffer. Done by the
    sender, because only there is it known what the buffer holds."""

    keep_bytes: int


class InputTurns:
    """Input audio the worker has not yet turned into a conversation item, stage by stage.

    - `pushed_samples`: 16 kHz samples given since the last commit or clear (the worker refuses
      commits under 100 ms, so the session checks before committing);
    - `speech_heard`: the VAD heard the user speak since the last commit or clear (the turn's
      first speech trims the silence before it; later speech must keep the turn whole);
    - `on_socket`: audio appended on this socket and not committed: what the worker's input
      buffer holds;
    - `committing`: commits sent and not acknowledged, with their audio;
    - `committed`: acknowledged commits, by item id, until their `conversation.item.added`
      (when the audio goes into the mirror: the worker echoes no audio back). A connection
      lost in between replays them as items of their own (`reset_for_replay`), so the turn
      is in neither the mirror nor `committing` but is not lost.
    """

    def __init__(self) -> None:
        self.pushed_samples = 0
        self.speech_heard = False
        self.on_socket = bytearray()
        self.committing: deque[tuple[str, bytes]] = deque()
        self.committed: dict[str, bytes] = {}

    def new_turn(self) -> None:
        """A commit or clear was given: what comes next is the next turn's."""
        self.pushed_samples = 0
        self.speech_heard = False

    def appended(self, pcm: bytes) -> None:
        self.on_socket += pcm

    def commit_sent(self, event_id: str) -> None:
        self.committing.append((event_id, bytes(self.on_socket)))
        self.on_socket.clear()

    def clear_sent(self) -> None:
        self.on_socket.clear()

    def trim_sent(self, keep_bytes: int) -> bytes | None:
        """The audio to append again after a clear, to keep only the last `keep_bytes` of the
        worker's input buffer; None when it holds no more than that."""
        if len(self.on_socket) <= keep_bytes:
            return None
        return bytes(self.on_socket[len(self.on_socket) - keep_bytes:])

    def acknowledged(self, item_id: str) -> bytes:
        """The worker committed the oldest commit in flight as `item_id`; returns its audio."""
        pcm = self.committing.popleft()[1] if self.committing else b""
        self.committed[item_id] = pcm
        return pcm

    def refused(self, event_id: str) -> bool:
        for commit in self.committing:
            if commit[0] == event_id:
                self.committing.remove(commit)
                return True
        return False

    def take_audio(self, item_id: str) -> bytes | None:
        return self.committed.pop(item_id, None)

    def reset_for_replay(self) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]], bytes]:
        """A new socket. Returns, oldest first, the acknowledged commits whose item never came
        back (item id and audio), the commits the lost worker never acknowledged (event id and
        audio), and the open turn's audio. Resets the last two (they are sent again on the new
        socket and counted anew); the first stay in `committed`, since their items are created
        again under the same ids and take their audio when the new worker echoes them. Commits
        whose item came back are in the mirror's replay already."""
        committing, self.committing = list(self.committing), deque()
        turn, self.on_socket = bytes(self.on_socket), bytearray()
        return list(self.committed.items()), committing, turn
