"""Credentials never reach a log line: a filter on every handler and on aiohttp's loggers.

aiohttp's own error log quotes what it could not parse, e.g. an over-long `Authorization`
header, so redacting only our own messages is not enough; the filter rewrites each record
(message, arguments and traceback text) before any handler formats it.
"""

from __future__ import annotations

import logging
import re
from typing import Iterable

REDACTED = "[redacted]"
_PATTERNS = (
    # "Authorization: Bearer abc", "'Authorization': 'abc'", authorization=abc
    re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?)(?:(?:bearer|basic|token)\s+)?[^\s'\",}]+"),
    re.compile(r"(?i)(\b(?:bearer|basic)\s+)[^\s'\",}]+"),
    re.compile(r"(?i)((?:api[_-]?key|x-api-key)['\"]?\s*[:=]\s*['\"]?)[^\s'\",}]+"),
)
_AIOHTTP_LOGGERS = ("aiohttp.access", "aiohttp.server", "aiohttp.web", "aiohttp.websocket", "aiohttp.internal")


class RedactCredentials(logging.Filter):
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self._secrets = [s for s in secrets if s]

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        for pattern in _PATTERNS:
            text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: leave it to logging's own error report
            return True
        record.msg, record.args = self.redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


def install(secrets: Iterable[str] = ()) -> RedactCredentials:
    """Redact on the root logger's handlers and on aiohttp's loggers (idempotent)."""
    redactor = RedactCredentials(secrets)
    targets: list[logging.Filterer] = [*logging.getLogger().handlers,
                                       *(logging.getLogger(name) for name in _AIOHTTP_LOGGERS)]
    for target in targets:
        for old in [f for f in target.filters if isinstance(f, RedactCredentials)]:
            target.removeFilter(old)
        target.addFilter(redactor)
    return redactor
