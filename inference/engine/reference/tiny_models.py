"""What the tiny random models of every family are built from: where they are cached, a build
that never leaves half a model behind, a small tokenizer trained offline, seeded weights.
Each family's `tiny.py` builds its own model from these."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

logger = logging.getLogger(__name__)

CORPUS = """
Hello! How are you today? I am fine, thank you. What can I do for you?
The weather is sunny and warm, with a light breeze from the west.
Could you tell me the time? It is half past nine in the morning.
Please book a table for two people at seven o'clock tonight.
Sure, let me check that for you. One moment please.
I would like to order a pizza with cheese, tomatoes and mushrooms.
Your order has been placed and will arrive in thirty minutes.
The quick brown fox jumps over the lazy dog near the river bank.
Turn on the lights in the kitchen and set the temperature to twenty degrees.
Sorry, I did not catch that. Could you say it again, a little slower?
You are a helpful assistant. Answer briefly and speak naturally.
The meeting starts at 10:30 on Monday, 12 May 2025, in room 4B.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 3.14 -7 1e3 true false null
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
{"location": "Berlin", "days": 3, "verbose": false, "tags": ["a", "b"]}
<tool_call> </tool_call> <tool_response> </tool_response>
"""



def cache_root() -> Path:
    return Path(os.environ.get("OMNI_CACHE_DIR", Path.home() / ".cache" / "omni-voice-agent"))


def build_once(target: Path, build, name: str) -> Path:
    """`target`, made by `build(folder)` first if it holds no config.json yet: built into a
    temporary folder renamed into place, so concurrent starts never see half a model."""
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("building %s in %s …", name, target)
    started = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        build(staging)
        try:
            staging.rename(target)
        except OSError:  # another process won the race; its copy is identical
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("built %s in %.1f s", name, time.monotonic() - started)
    return target


def build_tokenizer(special_tokens: list[str], plain_tokens: list[str], named_tokens: dict[str, str],
                    extra_special: list[str]):
    """The tiny byte-level BPE trained on `CORPUS`, wrapped as `Qwen2Tokenizer` (the omni
    families' tokenizer class) with the family's tokens: `special_tokens`, then
    `plain_tokens` (added, not special), then `extra_special`; `named_tokens` are the
    attributes the family's processor reads from its tokenizer."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers import AddedToken, Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    # Same pre-tokenization as Qwen2 so the trained merges fit the wrapper below.
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(
        vocab_size=1024, min_frequency=1, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread: merges in a fixed order
    try:
        bpe.train_from_iterator(CORPUS.strip().splitlines() * 4, trainer=trainer)
    finally:
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous
    model_json = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model_json["merges"]]

    tokenizer = Qwen2Tokenizer(
        vocab=model_json["vocab"], merges=merges,
        unk_token=None, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        model_specific_special_tokens=named_tokens,
    )
    tokenizer.add_tokens([AddedToken(t, special=True) for t in special_tokens], special_tokens=True)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain_tokens])
    tokenizer.add_tokens([AddedToken(t, special=True) for t in extra_special], special_tokens=True)
    tokenizer.model_max_length = 32768
    return tokenizer


class seeded:
    """Seed torch's global generator for the block and restore its state afterwards."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __enter__(self):
        import torch

        self._state = torch.random.get_rng_state()
        torch.manual_seed(self.seed)

    def __exit__(self, *exc):
        import torch

        torch.random.set_rng_state(self._state)


def round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple
