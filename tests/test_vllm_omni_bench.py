"""bench/vllm_omni_side_by_side.py on tiny-random (CPU): its weight-less model folder, and its
reference half driving the reference engine the way the GPU run does.

vllm-omni reads config, processor and speakers from it and makes up the weights; on the H200
(2026-12-01) its thinker died at the first request because the folder's thinker config had no
`vision_end_token_id`. This keeps every id it reads there."""

from __future__ import annotations

import sys

import torch
from transformers import AutoConfig, AutoProcessor

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import vllm_omni_side_by_side as bench  # noqa: E402


def test_model_folder_holds_what_vllm_omni_reads(tmp_path):
    from inference.engine.reference.loading import load_model

    loaded = load_model("tiny-random", torch.device("cpu"), torch.float32)
    bench.write_model_folder(loaded, tmp_path)

    config = AutoConfig.from_pretrained(tmp_path)
    assert config.model_type == "qwen2_5_omni" and config.architectures == ["Qwen2_5OmniForConditionalGeneration"]
    tokenizer = AutoProcessor.from_pretrained(tmp_path).tokenizer
    for key, token in bench.THINKER_TOKEN_IDS.items():
        assert getattr(config.thinker_config, key) == tokenizer.convert_tokens_to_ids(token), key
    speakers = torch.load(tmp_path / "spk_dict.pt")
    assert set(speakers) == {"Chelsie", "Ethan"}
    assert all({"cond", "ref_mel"} <= set(voice) for voice in speakers.values())


async def test_reference_half_measures_every_level_on_tiny_random():
    import types

    from inference.engine.reference.loading import load_model

    args = types.SimpleNamespace(levels=[1, 2], repeats=1, input_seconds=0.5, max_tokens=4, audio_seconds=0.5)
    engine = bench.reference_engine("tiny-random", "cpu", "float32", args)
    await engine.start_with_model(load_model("tiny-random", torch.device("cpu"), torch.float32))
    try:
        levels = await bench.run_levels(engine, "reference", args)
    finally:
        await engine.close()
    assert sorted(levels) == [1, 2] and [levels[n]["replies"] for n in (1, 2)] == [1, 2]
    assert all(row["audio_s"] > 0 and row["ttfa_p50_s"] > 0 for row in levels.values())
