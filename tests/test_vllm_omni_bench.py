"""bench/vllm_omni_side_by_side.py's weight-less model folder, on tiny-random (CPU).

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
