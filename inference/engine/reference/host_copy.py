"""Host values onto the device without waiting for it.

The engine loop puts a few small host values on the device every step (tokens, positions, KV
rows, masks, noise rows). How it does so costs: `torch.tensor(values)` dispatches three ops
where a numpy array's copy dispatches one (bench/loop_ops.py), and a blocking copy
(`.to(device)`, `torch.tensor(..., device=)`) synchronises the current stream after it, so the
loop stops there until every step it has queued is done.
"""

from __future__ import annotations

import numpy as np
import torch

NUMPY_DTYPES = {torch.int64: np.int64, torch.int32: np.int32, torch.bool: np.bool_}


def copy_from_host(target: torch.Tensor, values) -> None:
    """`values` (a list or array with target's elements, in order) into `target` as one copy.
    Made as a numpy array, it costs the step one dispatched op, where torch.tensor costs three;
    a loop step copies several such inputs (bench/loop_ops.py)."""
    array = np.asarray(values, dtype=NUMPY_DTYPES[target.dtype]).reshape(target.shape)
    target.copy_(torch.from_numpy(array), non_blocking=True)


def to_device(values, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Host values (a list, an array or a CPU tensor) as a new tensor on `device`, without the
    wait a blocking copy makes: `.to(device)` and `torch.tensor(..., device=)` synchronise the
    current stream after the copy, so the loop would stop there until every step it has
    queued is done (a profile of a busy GPU engine found the talkers' starts waiting so)."""
    if not isinstance(values, torch.Tensor):
        values = torch.from_numpy(np.asarray(values, dtype=NUMPY_DTYPES[dtype]))
    return values.to(device, non_blocking=True)
