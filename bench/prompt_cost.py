"""The host's prompt work per turn as one conversation grows, counted on a CPU.

    python -m bench.prompt_cost [--turns 30] [--repeats 5] [--fresh-items]

Every request carries the whole conversation (inference/engine/base.py), so before a turn's
prefill the engine renders the chat template, tokenizes and computes rope positions over all
of it (`ReferenceEngine._prepare`, on a worker thread), and that time is part of the turn's
first audio. This times `_prepare` at each turn of a conversation like `python -m bench.reference
conversation`'s (3 s of new user audio and a short reply per turn), on tiny-random: its
tokenizer is a small byte-level BPE and its template is Qwen2.5-Omni's, so the counts of
tokens and clips are the real ones, and none of this work touches the model's weights.

The gateway keeps each user clip's engine item from turn to turn (inference/conversation.py),
so a clip's float samples and content key are made once; `--fresh-items` makes new items on
every turn instead, as the gateway did before, to show what that costs (the time counted
then includes the conversion from int16, which the gateway did before `_prepare`)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np

from inference.audio import int16_to_float
from inference.engine.base import AssistantText, GenerationRequest, UserAudio
from inference.engine.reference.engine import ReferenceEngine

# about as many tokens as a reply of the reference bench's conversation (~22 a turn with the markup)
REPLY = "Sure, the weather stays mild with a little rain on Sunday."


def timed(call, repeats: int) -> tuple[float, object]:
    """The median seconds of `repeats` calls, and the last call's result."""
    seconds, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = call()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), result


async def run(args) -> None:
    engine = ReferenceEngine("tiny-random", device="cpu", kv_slots=2, context_tokens=8192, seed=0,
                             warmup=False)
    await engine.start()
    voice = engine.voices[0]
    rng = np.random.default_rng(0)
    # int16 at 16 kHz, as the gateway stores a caller's audio
    clips = [(rng.normal(0, 0.05 * 32768, int(16_000 * args.input_seconds))).astype(np.int16)
             for _ in range(args.turns)]
    items = [UserAudio(int16_to_float(clip)) for clip in clips]
    family, model = engine.family, engine.loaded.model
    print(f"{'turn':>4} {'tokens':>7} {'prepare ms':>11} {'of which positions ms':>22}")
    rows = []
    for turn in range(1, args.turns + 1):
        def request() -> GenerationRequest:
            context = []
            for index in range(turn):
                # --fresh-items: converted and hashed again, as if never seen
                context.append(UserAudio(int16_to_float(clips[index])) if args.fresh_items else items[index])
                if index < turn - 1:
                    context.append(AssistantText(REPLY))
            return GenerationRequest(request_id=f"turn-{turn}", instructions="Answer briefly.",
                                     context=context, modalities=("audio",))

        prepare_s, (prepared, _) = timed(lambda: engine._prepare(request(), voice), args.repeats)
        positions_s, _ = timed(lambda: family.positions(model, prepared.prompt, voice, True), args.repeats)
        rows.append((turn, prepared.prompt.length, prepare_s, positions_s))
        print(f"{turn:>4} {prepared.prompt.length:>7} {1000 * prepare_s:>11.2f} {1000 * positions_s:>22.2f}",
              flush=True)
    if len(rows) >= 2:
        (_, tokens_2, second, _), (_, tokens_n, last, _) = rows[1], rows[-1]
        print(f"prepare grows by {1000 * (last - second):.2f} ms from turn 2 ({tokens_2} tokens) to turn "
              f"{args.turns} ({tokens_n} tokens): {1e6 * (last - second) / max(tokens_n - tokens_2, 1):.2f} µs "
              "a token of context")
    await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5, help="calls per turn; the median is printed")
    parser.add_argument("--input-seconds", type=float, default=3.0, help="new user audio per turn")
    parser.add_argument("--fresh-items", action="store_true",
                        help="new engine items on every turn (each clip converted and hashed again)")
    args = parser.parse_args()
    print(f"# python -m bench.prompt_cost --turns {args.turns} --repeats {args.repeats}"
          f"{' --fresh-items' if args.fresh_items else ''}  "
          f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
