"""`conversation`: one session of many turns, the prefix cache at work."""

from __future__ import annotations

from bench.reference.harness import PHASES, bench_request, one_session
from inference.engine import AssistantText
from inference.engine.reference import ReferenceEngine


async def run_conversation(engine: ReferenceEngine, turns: int, args) -> None:
    """One session, `turns` turns: each adds a new user clip and the reply's transcript, so
    the conversation grows; the prefix cache keeps each turn's prefill to what is new."""
    print(f"\n== conversation: {turns} turns on one session "
          f"({args.input_seconds} s of new audio per turn)", flush=True)
    context: list = []
    results = []
    for turn in range(1, turns + 1):
        request = bench_request(5000 + turn, args, context=list(context), session_id="conversation")
        result = await one_session(engine, 5000 + turn, args, request=request)
        results.append(result)
        context = request.context + [AssistantText(result["text"])]
        print(f"turn {turn:>3}: first audio {result['first_audio_s']:.3f} s  prompt "
              f"{result['reused_tokens'] + result['prefill_tokens']:.0f} tokens, "
              f"{result['reused_tokens']:.0f} from the cache, {result['prefill_tokens']:.0f} "
              f"prefilled  gap {result['stall_s']:.2f} s", flush=True)
    if turns >= 2:
        ratio = results[-1]["first_audio_s"] / results[1]["first_audio_s"]
        print(f"turn {turns} / turn 2 first audio: {ratio:.2f}", flush=True)
        # where a longer conversation's first audio goes: each phase at turn 2 and at the last
        print(f"first audio, phase by phase, turn 2 → turn {turns} (ms): " + "  ".join(
            f"{name[:-2]} {results[1][name] * 1000:.1f} → {results[-1][name] * 1000:.1f}"
            for name in PHASES), flush=True)
