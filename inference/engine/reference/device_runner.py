"""`DeviceRunner`: what every family's runner shares with the engine loop (streams, graph
memory, the wait for the device and the one read a step makes)."""

from __future__ import annotations

import contextlib

import torch

from .cuda_graphs import own_stream


class DeviceRunner:
    """What every family's runner shares with the loop: its streams and graph memory, the wait
    for the device, and the one read a step makes. Subclasses call `_init_device` first.

    The loop's work (prompt chunks, the decode steps, the talkers' starts) goes on a stream of
    its own at a high priority (token2wav's is lower). With `talker_stream` the talker's
    decode step goes first in a loop step (`talker_beside_thinker`) and, on CUDA, on a second
    stream, beside the thinker's. Each step reads its weights once and neither reaches the
    GPU's bandwidth (latency-bound: one small kernel after another), so side by side they
    take less than one after the other (measured: bench/results/JOURNAL.md). The talker's
    step then reads only what earlier steps made (a reply-stream element is a step old when
    its talker reads it), so the two are independent within a step; the talker runs a step
    behind the thinker, so its first code comes one thinker step later."""

    def _init_device(self, device: torch.device, cuda_graphs: bool, talker_stream: bool) -> None:
        self.device = device
        cuda = device.type == "cuda"
        # every stream is the runner's own (cuda_graphs.own_stream says why)
        self.stream = own_stream(device, priority=-1) if cuda else None
        self.talker_beside_thinker = talker_stream
        self.talker_stream = own_stream(device, priority=-1) if cuda and talker_stream else None
        graphs = cuda_graphs and cuda
        self.graph_pool = torch.cuda.graph_pool_handle() if graphs else None
        # the loop's graphs (prompt chunks, the thinker's decode step, the audio encoder) are
        # captured here; they replay one at a time, on `stream`
        self.capture_stream = own_stream(device) if graphs else None
        # the talker's decode graphs may replay at the same time as the loop's: a memory pool
        # and a capture stream of their own (cuda_graphs.py)
        self.talker_graph_pool = torch.cuda.graph_pool_handle() if graphs else None
        self.talker_capture_stream = own_stream(device) if graphs else None
        self._pinned: torch.Tensor | None = None  # host buffer of `read`

    def loop_stream(self):
        """A context in which the engine loop's work goes on the runner's stream."""
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def talker_side(self):
        """A context in which the talker's decode step goes on its own stream (where there is
        one), after the loop's earlier work (the talker starts and thinker states it reads);
        the step's `read` waits for it."""
        if self.talker_stream is None:
            return contextlib.nullcontext()
        self.talker_stream.wait_stream(torch.cuda.current_stream())
        return torch.cuda.stream(self.talker_stream)

    def synchronize(self) -> None:
        """Wait for everything queued on the device (by any thread) to be done."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def read(self, *ids: torch.Tensor) -> list[list[int]]:
        """Integer tensors (1-D, on the device) as lists on the host, in one copy: the one
        point of a decode step where the host waits for the device."""
        if not ids:
            return []
        if self.talker_stream is not None:
            torch.cuda.current_stream().wait_stream(self.talker_stream)
        joined = torch.cat([tensor.to(torch.long) for tensor in ids])
        if joined.is_cuda:
            host = self._read_buffer(joined.numel())
            host.copy_(joined, non_blocking=True)
            torch.cuda.current_stream().synchronize()
            values = host.tolist()
        else:
            values = joined.tolist()
        out, start = [], 0
        for tensor in ids:
            out.append(values[start:start + tensor.numel()])
            start += tensor.numel()
        return out

    def describe(self) -> dict:
        """What the runner is and runs, for the start-up log, /health's details and the
        benchmarks (which read this, not the runner's attributes). A family's runner has
        `slots`, `buckets`, `codes_per_frame`, `thinker_decode` and its `audio_decoder`
        (whose `graphed` says what of it was captured)."""
        decoder = self.audio_decoder
        streams = {"loop": self.stream, "talker": self.talker_stream, "loop capture": self.capture_stream,
                   "talker capture": self.talker_capture_stream, "audio": decoder.stream,
                   "audio capture": decoder.capture_stream}
        handles = {name: stream.cuda_stream for name, stream in streams.items() if stream is not None}
        return {"runner": type(self).__name__, "slots": self.slots, "batch_buckets": list(self.buckets),
                "codes_per_frame": self.codes_per_frame,
                "talker_beside_thinker": self.talker_beside_thinker,
                "cuda_graphs": bool(self.thinker_decode.graphs), "streams": handles,
                "streams_distinct": len(set(handles.values())) == len(handles),
                "audio_decoder": type(decoder).__name__, "audio_graphs": decoder.graphed}

    def _read_buffer(self, size: int) -> torch.Tensor:
        if self._pinned is None or self._pinned.numel() < size:
            self._pinned = torch.empty(max(size, 256), dtype=torch.long, pin_memory=True)
        return self._pinned[:size]
