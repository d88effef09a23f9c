"""How strata's processes log: one handler on the root logger, text or JSON lines, each with the request id.

Entry points call ``configure`` (the CLI at start, ``strata serve`` again in
every worker process through uvicorn's ``Config.configure_logging``); library
code only logs. Every record reaches the one handler: strata's, uvicorn's
(its loggers propagate, ``log_config`` is None) and Python's warnings.

``STRATA_LOG__FORMAT=json`` writes one JSON object per line (python-json-logger):
``time``, ``level``, ``logger``, ``message``, ``process``, ``request_id`` when
the record belongs to a request, ``exception`` with a traceback, and the
record's own fields (an access record's ``method``, ``path``, ``route``,
``status``, ``ms``, ``client``). The request id is the ``REQUEST_ID`` context
variable the service's middleware sets. A record may carry the user's query
text as its ``query`` attribute; the handler drops it unless
``STRATA_LOG__QUERY_TEXT`` is true.

pymilvus logs every failed call with its traceback (a Milvus outage under load made 190,000 lines in three
minutes): its records reach the one handler too, cut to their first line, and ``OncePerInterval`` lets one of
each kind through per ``FAILURE_INTERVAL_S``, counting the ones it held back. Milvus Lite's gRPC server and
gRPC's own loggers say nothing strata does not translate and report: they log only what is critical.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import IO, Any, Literal

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

REQUEST_ID: ContextVar[str | None] = ContextVar("strata_request_id", default=None)
"""The id of the request being served (set by ``strata.api.middleware.RequestContext``)."""

QUERY = "query"  # the record attribute that holds a user's query text (``extra={QUERY: text}``)
ACCESS = "access"  # an access record's fields (``extra={ACCESS: {...}}``), top-level members of its JSON line
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(request_tag)s: %(message)s"
# Libraries whose own logging says less than strata does: Milvus Lite's gRPC server logs the RPCs it does not
# implement; strata translates and reports the errors that matter.
QUIET = ("milvus_lite", "grpc")
RATE_LIMITED = "pymilvus"  # logs every failed call with a traceback: one line of each kind per interval
FAILURE_INTERVAL_S = 60.0
_HANDLER_MARK = "_strata_handler"
FORMAT_VARIABLE = "STRATA_LOG__FORMAT"  # read by ``fatal`` when the settings could not be read
_configured: list[LogSetup] = []  # the setup ``configure`` last applied, for ``fatal``


@dataclass(frozen=True)
class LogSetup:
    """What ``configure`` needs (small and picklable: uvicorn sends its config to each worker process)."""

    format: Literal["text", "json"] = "text"
    level: str = "INFO"  # strata's loggers; libraries log at WARNING
    query_text: bool = False

    @classmethod
    def of(cls, settings: Any, *, verbose: bool = False) -> LogSetup:
        """The setup ``settings`` (a ``strata.config.Settings``) ask for; ``verbose`` logs strata at DEBUG."""
        level = "DEBUG" if verbose else settings.log_level
        return cls(format=settings.log.format, level=level, query_text=settings.log.query_text)


def configure(setup: LogSetup, *, stream: IO[str] | None = None) -> logging.Handler | None:
    """Sends every record to one handler on ``stream`` (stderr) in ``setup``'s format, and sets the levels.

    Calling it again replaces the handler it installed before. Like ``logging.basicConfig``, it adds none to a
    root logger that has handlers of someone else (a test runner, a program embedding strata) unless given a
    ``stream``; returns the handler it added, or None.
    """
    _configured[:] = [setup]
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    handler = None
    if stream is not None or not root.handlers:
        handler = logging.StreamHandler(stream or sys.stderr)
        setattr(handler, _HANDLER_MARK, True)
        handler.setFormatter(JsonLineFormatter() if setup.format == "json" else TextFormatter())
        handler.addFilter(RequestIdFilter())
        handler.addFilter(QueryTextFilter(setup.query_text))
        handler.addFilter(OncePerInterval(RATE_LIMITED, FAILURE_INTERVAL_S))
        root.addHandler(handler)
        root.setLevel(logging.WARNING)
        logging.captureWarnings(True)  # warnings.warn writes through the handler, not around it
    logging.getLogger("strata").setLevel(setup.level)
    logging.getLogger("uvicorn.error").setLevel(logging.INFO)  # its start and stop lines
    _quiet_libraries(routed=handler is not None)
    return handler


def fatal(message: str) -> None:
    """The line that ends a command (a configuration error, a schema to migrate) on stderr: as it is, or, in the
    json format, one JSON object like every other line (logger ``strata``, level CRITICAL). The format is the
    one ``configure`` applied, else ``STRATA_LOG__FORMAT``'s: a configuration error comes before any setup."""
    chosen = _configured[0].format if _configured else os.environ.get(FORMAT_VARIABLE, "text").strip().lower()
    if chosen != "json":
        print(message, file=sys.stderr, flush=True)
        return
    record = logging.LogRecord("strata", logging.CRITICAL, __file__, 0, message, None, None)
    print(JsonLineFormatter().format(record), file=sys.stderr, flush=True)


def _quiet_libraries(*, routed: bool) -> None:
    """``routed``: pymilvus's records reach strata's handler, which holds them to ``OncePerInterval``; without it
    (someone else's handlers) they are as quiet as ``QUIET``'s."""
    with contextlib.suppress(ImportError):  # pymilvus sets its own levels when imported, so it is imported first
        import pymilvus  # noqa: F401
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    if not routed:
        logging.getLogger(RATE_LIMITED).setLevel(logging.CRITICAL)
        return
    for name in [RATE_LIMITED, *logging.Logger.manager.loggerDict]:
        if name == RATE_LIMITED or name.startswith(RATE_LIMITED + "."):  # its own plain-text handlers bypass ours
            library = logging.getLogger(name)
            library.handlers.clear()
            library.propagate = True
            library.setLevel(logging.NOTSET)
    logging.getLogger(RATE_LIMITED).setLevel(logging.WARNING)
    try:
        import jieba

        jieba.setLogLevel(logging.WARNING)
        jieba.default_logger.handlers.clear()  # its own stderr handler would write around ours
        jieba.default_logger.propagate = True
    except ImportError:
        pass


class RequestIdFilter(logging.Filter):
    """Gives each record the ``request_id`` of the request it was logged for (None outside one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = REQUEST_ID.get()
        return True


class QueryTextFilter(logging.Filter):
    """Removes a record's query text unless the setting asks for it."""

    def __init__(self, keep: bool) -> None:
        super().__init__()
        self.keep = keep

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.keep and QUERY in record.__dict__:
            del record.__dict__[QUERY]
        return True


class OncePerInterval(logging.Filter):
    """Lets one record of each kind from the ``library`` logger's tree through per ``interval_s``, as its first
    line (no traceback), saying how many of its kind were held back since the last one. A record's kind is its
    logger and first line with the numbers taken out (a call's elapsed time, a port, a count)."""

    def __init__(self, library: str, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._library = library
        self._interval_s = interval_s
        self._clock = clock
        self._next: dict[tuple[str, str], float] = {}
        self._held: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != self._library and not record.name.startswith(self._library + "."):
            return True
        line = record.getMessage().split("\n", 1)[0]
        kind = (record.name, _NUMBER.sub("#", _ELAPSED.sub("", line))[:200])
        now = self._clock()
        with self._lock:
            if now < self._next.get(kind, 0.0):
                self._held[kind] = self._held.get(kind, 0) + 1
                return False
            self._next[kind] = now + self._interval_s
            held = self._held.pop(kind, 0)
        if held:
            line += f" ({held} more like it in the last {self._interval_s:g} s)"
        record.msg, record.args, record.exc_info, record.exc_text = line, None, None, None
        return True


_ELAPSED = re.compile(r",? *<elapsed:[^>]*>")
_NUMBER = re.compile(r"\d+")


class TextFormatter(logging.Formatter):
    """``time LEVEL logger [request id]: message``, then ``query="…"`` when the record keeps one."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None)
        record.request_tag = f" [{request_id}]" if request_id else ""
        line = super().format(record)
        query = record.__dict__.get(QUERY)
        return f"{line} query={json.dumps(query, ensure_ascii=False)}" if query is not None else line


class JsonLineFormatter(JsonFormatter):
    """One JSON object per record (see the module docstring for its members)."""

    def __init__(self) -> None:
        super().__init__(
            ["levelname", "name", "message", "process"],
            rename_fields={"levelname": "level", "name": "logger", "exc_info": "exception", "stack_info": "stack"},
            reserved_attrs=[*RESERVED_ATTRS, "taskName", "color_message", "request_tag"],
            timestamp="time",
            json_ensure_ascii=False,
        )

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        super().add_fields(log_data, record, message_dict)
        if log_data.get("request_id") is None:
            log_data.pop("request_id", None)
        access = log_data.pop(ACCESS, None)
        if isinstance(access, dict):  # its text message is these fields as JSON: here they are members
            log_data.update(access)
            log_data["message"] = f"{access.get('method')} {access.get('path')} {access.get('status')}"
        ordered = {"time": log_data.pop("time", None), **log_data}  # time first, as in a text line
        log_data.clear()
        log_data.update(ordered)
