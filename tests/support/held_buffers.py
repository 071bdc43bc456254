"""The large buffers a process holds, counted one by one; and `python -m tests.support.held_buffers
serve …`, the real worker (the CLI, the reference engine) that also answers GET /test/held-buffers.

RSS says how much memory a process has, to within what the allocator keeps of freed blocks
(megabytes that come and go with each turn): a leak of a few hundred kilobytes a turn hides in
it for many turns. Counting the buffers themselves does not: a reply's audio kept by mistake
is one more array, string or tensor after every turn, whatever the allocator does.
"""

from __future__ import annotations

import gc
import sys
from collections import Counter

import numpy as np

# small enough for the audio deltas of a reply (base64 PCM16, a few KB each), large enough to
# leave out the many small objects every process has
MIN_BYTES = 1024


def held_buffers(min_bytes: int = MIN_BYTES) -> dict[str, dict[str, int]]:
    """Every buffer of at least `min_bytes` reachable from the objects the garbage collector
    tracks (and from the untracked tuples and dicts those hold): numpy arrays that own their
    data (a view counts its base), bytes, bytearrays, strings (base64 audio), and torch
    storages (once each, however many tensors view them). Returns {kind: {"count": n,
    "bytes": total}}, after a full collection."""
    gc.collect()
    torch = sys.modules.get("torch")
    tensor_type = torch.Tensor if torch is not None else ()
    counted: set[int] = set()  # ids of the buffers counted (only large objects get here)
    storages: set[int] = set()
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()

    def note(obj: object, kind: str, nbytes: int) -> None:
        if nbytes >= min_bytes and id(obj) not in counted:
            counted.add(id(obj))
            counts[kind] += 1
            sizes[kind] += nbytes

    def buffer(obj: object) -> None:
        while isinstance(obj, np.ndarray) and not obj.flags.owndata and obj.base is not None:
            obj = obj.base  # a view keeps its base alive
        if isinstance(obj, np.ndarray):
            note(obj, "ndarray", obj.nbytes)
        elif isinstance(obj, (bytes, bytearray, str)):
            note(obj, type(obj).__name__, len(obj))

    def tensor(obj) -> None:
        try:
            storage = obj.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):  # meta and other storage-less tensors
            return
        if nbytes >= min_bytes and ptr not in storages:
            storages.add(ptr)
            counts[f"tensor:{obj.device.type}"] += 1
            sizes[f"tensor:{obj.device.type}"] += nbytes

    untracked_seen: set[int] = set()
    atoms = (np.ndarray, bytes, bytearray, str)
    for obj in gc.get_objects():  # every container; tensors are among them
        if isinstance(obj, tensor_type):
            tensor(obj)
        stack = [r for r in gc.get_referents(obj) if not gc.is_tracked(r)]
        while stack:
            ref = stack.pop()
            if isinstance(ref, atoms):
                buffer(ref)
            elif isinstance(ref, (tuple, dict)) and id(ref) not in untracked_seen:
                untracked_seen.add(id(ref))  # a tuple or dict of atoms: the collector drops it
                stack.extend(r for r in gc.get_referents(ref) if not gc.is_tracked(r))
    return {kind: {"count": counts[kind], "bytes": sizes[kind]} for kind in sorted(counts)}


def main() -> int:
    from aiohttp import web

    from inference import cli, server

    class CountingWorker(server.Worker):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.app.router.add_get("/test/held-buffers", self._held_buffers)

        async def _held_buffers(self, request: web.Request) -> web.Response:
            return web.json_response(held_buffers())

    server.Worker = CountingWorker  # serve() builds its Worker when it runs
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
