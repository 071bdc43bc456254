"""What reaches the worker's log: never a credential, and no traceback for a client's bad request.

aiohttp's own error log quotes what it could not parse, e.g. an over-long `Authorization`
header, so redacting only our own messages is not enough: `RedactCredentials` rewrites each
record (message, arguments and traceback text) on every handler and on aiohttp's loggers.
`QuietClientErrors` turns aiohttp's "Error handling request" tracebacks for requests that
could not be parsed (a 4xx the client caused) into one DEBUG line.
"""

from __future__ import annotations

import logging
import re
from typing import Iterable

from aiohttp.http_exceptions import HttpProcessingError

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


class QuietClientErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 400) < 500:
            detail = " ".join(str(exc).split())
            record.msg, record.args = "%s: %s", (record.getMessage(), detail)
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            record.exc_info, record.exc_text = None, None
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def install(secrets: Iterable[str] = ()) -> None:
    """Put the filters on the root logger's handlers and aiohttp's loggers (idempotent)."""
    redactor = RedactCredentials(secrets)
    quiet = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, QuietClientErrors) for f in quiet.filters):
        quiet.addFilter(QuietClientErrors())  # before redaction, which then sees the one line
    targets: list[logging.Filterer] = [*logging.getLogger().handlers,
                                       *(logging.getLogger(name) for name in _AIOHTTP_LOGGERS)]
    for target in targets:
        for old in [f for f in target.filters if isinstance(f, RedactCredentials)]:
            target.removeFilter(old)
        target.addFilter(redactor)
