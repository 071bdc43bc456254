"""`python -m bench.reference SUBCOMMAND ...`: the command line (the package doc is the manual)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys

from bench.reference import __doc__ as MANUAL
from bench.reference.harness import (
    add_engine_arguments, add_reply_arguments, each_variant, fit_to_tiny, is_tiny, levels_of,
)
from bench.steady_mix import CallPattern, Seconds


async def burst(args) -> int:
    from bench.reference.burst import run_burst

    levels = levels_of(args.sessions)
    others = levels_of(args.variant_sessions) if args.variant_sessions is not None else levels[:1]

    async def body(engine, first: bool) -> None:
        await run_burst(engine, levels if first else others, args, engine.device)

    await each_variant(args, body, kv_slots=max(levels + others, default=2))
    return 0


async def steady(args) -> int:
    from bench.reference.steady import run_steady

    def for_others(pattern: CallPattern) -> CallPattern | None:
        if args.variant_levels is None:
            return dataclasses.replace(pattern, levels=pattern.levels[:1])
        levels = tuple(levels_of(args.variant_levels))
        return dataclasses.replace(pattern, levels=levels) if levels else None

    others = [p for p in map(for_others, args.patterns) if p is not None]

    async def body(engine, first: bool) -> None:
        for pattern in args.patterns if first else others:
            await run_steady(engine, pattern, args)

    levels = [calls for pattern in args.patterns + others for calls in pattern.levels]
    await each_variant(args, body, kv_slots=max(levels),
                       longest_reply_s=max(pattern.reply.high for pattern in args.patterns))
    return 0


async def conversation(args) -> int:
    from bench.reference.conversation import run_conversation

    async def body(engine, first: bool) -> None:
        await run_conversation(engine, args.turns, args)

    # one call: its slot and its turn's transcription
    await each_variant(args, body, kv_slots=2)
    return 0


async def check(args) -> int:
    from bench.reference.check import run_check

    return 0 if await run_check(args) else 1


async def profile(args) -> int:
    from bench.reference.step_profile import profile_steps

    async def body(engine, first: bool) -> None:
        profile_steps(engine, args)

    await each_variant(args, body, kv_slots=args.slots)
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m bench.reference", description=MANUAL.split("\n")[0],
                                  epilog="python -m bench.reference SUBCOMMAND --help: its options; "
                                         "the manual: bench/reference/__init__.py",
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = top.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")

    def command(name: str, run, summary: str, replies: bool = True) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=summary, description=summary)
        add_engine_arguments(sub)
        if replies:
            add_reply_arguments(sub)
        sub.set_defaults(run=run)
        return sub

    sub = command("burst", burst, "N sessions start together, per level: first audio, gaps, RTF, "
                  "aggregate speed, queue wait, GPU memory")
    sub.add_argument("--sessions", default=None,
                     help="concurrency levels (default 1,4,8,16,32,64; a tiny model 1,4)")
    sub.add_argument("--repeats", type=int, default=2, help="rounds per level")
    sub.add_argument("--variant-sessions", default=None,
                     help="levels for the variants after the first (default: the first level; "
                          "none: no levels)")

    sub = command("steady", steady, "calls as they really arrive, level after level: the calls "
                  "a GPU carries gap-free")
    sub.add_argument("--levels", default="", help="calls at once, e.g. 4,8,16,24,32 (or @LEVELS in --pattern)")
    sub.add_argument("--seconds", type=float, default=50.0, help="seconds per level")
    sub.add_argument("--stagger", type=float, default=6.0, help="calls start over this many s")
    sub.add_argument("--input", type=Seconds.parse, default=None, metavar="S or LOW-HIGH",
                     help="seconds a caller speaks per turn, fixed or drawn from a range, e.g. 1-6 "
                          "(default: --input-seconds)")
    sub.add_argument("--reply", type=Seconds.parse, default=None, metavar="S or LOW-HIGH",
                     help="seconds of speech per reply, fixed or drawn from a range, e.g. 1-10 "
                          "(default: --audio-seconds)")
    sub.add_argument("--pattern", action="append", default=[], metavar="IN/REPLY[@LEVELS]",
                     help="a call pattern, repeatable, run one after another on one engine, e.g. "
                          "3/4@24,32 --pattern 1-6/1-10@24,28 (levels default to --levels); "
                          "replaces --input/--reply")
    sub.add_argument("--seed", type=int, default=0, help="seed of the call mix's draws")
    sub.add_argument("--variant-levels", default=None,
                     help="levels for the variants after the first (default: each pattern's "
                          "lowest; none: no levels)")
    sub.add_argument("--py-spy-level", type=int, default=0,
                     help="sample the process with py-spy for 10 s at this level")
    sub.add_argument("--py-spy-out", default="py-spy.txt", help="py-spy's collapsed stacks")

    sub = command("conversation", conversation, "one session of many turns: first audio per "
                  "turn as the conversation grows (the prefix cache at work)")
    sub.add_argument("--turns", type=int, default=None, help="turns (default 40; a tiny model 10)")

    command("check", check, "each variant's replies against its eager path's on the family's "
            "tiny random model (float32, greedy talker); exits 1 if one differs", replies=False)

    sub = command("profile", profile, "every step the runner names (captured graphs, eager parts "
                  "before the first audio), median ms: the schedule simulation's cost model")
    sub.add_argument("--slots", type=int, default=None,
                     help="KV slots, and so the batch buckets captured (default 64; a tiny model 4)")
    sub.add_argument("--costs-out", default=None, help="write the tables as JSON")
    return top


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    top = parser()
    args = top.parse_args(argv)
    tiny = is_tiny(args)
    if args.command != "check":
        fit_to_tiny(args)
    if args.command == "burst" and args.sessions is None:
        args.sessions = "1,4" if tiny else "1,4,8,16,32,64"
    if args.command == "conversation" and args.turns is None:
        args.turns = 10 if tiny else 40
    if args.command == "profile" and args.slots is None:
        args.slots = 4 if tiny else 64
    if args.command == "steady":
        levels = tuple(sorted(set(levels_of(args.levels))))
        try:
            args.patterns = [CallPattern.parse(text, levels) for text in args.pattern]
        except ValueError as error:
            top.error(str(error))
        if not args.patterns:
            if not levels:
                top.error("steady: give --levels, or --pattern IN/REPLY@LEVELS")
            args.patterns = [CallPattern(
                args.input or Seconds(args.input_seconds, args.input_seconds),
                args.reply or Seconds(args.audio_seconds, args.audio_seconds), levels)]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return asyncio.run(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
