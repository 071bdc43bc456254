"""`omni-worker serve …` (also `python -m inference serve …`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from typing import Any

from .config import Limits, WorkerSettings
from .engine import ENGINES


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omni-worker", description="Realtime omni model worker")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the OpenAI Realtime protocol over an omni engine",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    defaults = WorkerSettings()  # env OMNI_* already applied, so --help shows the effective values
    serve.add_argument("--engine", choices=ENGINES, default=defaults.engine)
    serve.add_argument("--model", default=defaults.model,
                       help="local path, Hugging Face id, or 'tiny-random' (small random model, no download)")
    serve.add_argument("--host", default=defaults.host)
    serve.add_argument("--port", type=int, default=defaults.port)
    serve.add_argument("--insecure-no-auth", action="store_true", default=defaults.insecure_no_auth,
                       help="serve without OMNI_API_KEY (anyone who reaches the port can use the GPU)")
    serve.add_argument("--allowed-origin", action="append", dest="allowed_origins", metavar="ORIGIN",
                       default=None, help="without a key, a browser Origin that may open sessions, e.g. "
                       "http://localhost:8080 (repeatable; env OMNI_ALLOWED_ORIGINS as a JSON list); "
                       f"default: {defaults.allowed_origins or 'none'}")
    serve.add_argument("--max-sessions", type=int, default=defaults.limits.max_sessions,
                       help="concurrent sessions before new ones are refused with 503; default (None): "
                            "the measured capacity of the GPU found (inference/capacity.py)")
    serve.add_argument("--device", default=defaults.device, help="reference engine: cuda, cpu or auto")
    serve.add_argument("--dtype", default=defaults.dtype, help="reference engine: bfloat16, float32 or auto")
    serve.add_argument("--preset", choices=("exact", "fast"), default=defaults.preset,
                       help="reference engine: exact (the model's own computation) or fast (the measured "
                            "trade-offs that carry more calls; env OMNI_PRESET); --engine-option wins over it")
    serve.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                       help="engine-specific option, repeatable (values are JSON when they parse as JSON), "
                            "e.g. --engine-option ode_steps=5 --engine-option max_concurrency=4")
    serve.add_argument("--log-level", default="INFO")
    serve.add_argument("--log-format", choices=("text", "json"), default=os.environ.get("OMNI_LOG_FORMAT", "text"),
                       help="json: one JSON object per line (time, level, logger, message; env OMNI_LOG_FORMAT)")
    return parser


def _log_handler(log_format: str) -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s",
                                           rename_fields={"asctime": "time", "levelname": "level", "name": "logger"}))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    return handler


def _engine_options(pairs: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"omni-worker: --engine-option wants KEY=VALUE, got {pair!r}")
        try:
            options[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            options[key.replace("-", "_")] = value
    return options


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), handlers=[_log_handler(args.log_format)])
    origins = {} if args.allowed_origins is None else {"allowed_origins": args.allowed_origins}  # else env's
    settings = WorkerSettings(
        engine=args.engine, model=args.model, host=args.host, port=args.port,
        insecure_no_auth=args.insecure_no_auth, device=args.device, dtype=args.dtype,
        preset=args.preset, **origins,
        limits=Limits(max_sessions=args.max_sessions),
        engine_extra=_engine_options(args.engine_option),
    )
    if settings.api_key is None and not settings.insecure_no_auth:
        print("omni-worker: OMNI_API_KEY is not set. Set it (clients send 'Authorization: Bearer <key>'), "
              "or pass --insecure-no-auth to serve without a key.", file=sys.stderr)
        return 2
    if settings.api_key is not None and settings.insecure_no_auth:
        logging.getLogger(__name__).warning("--insecure-no-auth given but OMNI_API_KEY is set: the key is enforced")
    from .server import serve
    return asyncio.run(serve(settings))


if __name__ == "__main__":
    raise SystemExit(main())
