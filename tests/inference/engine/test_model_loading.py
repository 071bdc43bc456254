"""Where the model comes from: a missing directory is a clear error, real weights on a CPU warn."""

from __future__ import annotations

import logging

import pytest
import torch

from inference.engine.reference.models.qwen2_5_omni.loading import load_model
from inference.engine.reference.models.qwen2_5_omni.tiny import ensure_tiny_model

CPU = torch.device("cpu")


@pytest.mark.parametrize("model", ["/models/Qwen2.5-Omni-7B", "./no-such-checkpoint", "models/qwen/omni-7b"])
def test_a_model_directory_that_does_not_exist_is_named_in_the_error(model) -> None:
    with pytest.raises(FileNotFoundError, match=f"model directory {model} does not exist"):
        load_model(model, CPU, torch.float32)


def test_weights_from_a_directory_on_the_cpu_warn(caplog) -> None:
    # the tiny checkpoint, loaded by its path, stands for real weights here
    with caplog.at_level(logging.WARNING, logger="inference.engine.reference.models.qwen2_5_omni.loading"):
        loaded = load_model(str(ensure_tiny_model()), CPU, torch.float32)
    assert loaded.device == CPU
    assert any("on the CPU" in r.getMessage() for r in caplog.records)


def test_tiny_random_on_the_cpu_does_not_warn(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="inference.engine.reference.models.qwen2_5_omni.loading"):
        load_model("tiny-random", CPU, torch.float32)
    assert not any("on the CPU" in r.getMessage() for r in caplog.records)
