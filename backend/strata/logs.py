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
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
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
# Libraries whose own logging says less than strata does: pymilvus logs every failed RPC with a traceback and
# Milvus Lite's gRPC server the RPCs it does not implement; strata translates and reports the errors that matter.
QUIET = ("pymilvus", "milvus_lite", "grpc")
_HANDLER_MARK = "_strata_handler"


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
        root.addHandler(handler)
        root.setLevel(logging.WARNING)
        logging.captureWarnings(True)  # warnings.warn writes through the handler, not around it
    logging.getLogger("strata").setLevel(setup.level)
    logging.getLogger("uvicorn.error").setLevel(logging.INFO)  # its start and stop lines
    _quiet_libraries()
    return handler


def _quiet_libraries() -> None:
    with contextlib.suppress(ImportError):  # pymilvus sets its own levels when imported, so it is imported first
        import pymilvus  # noqa: F401
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.CRITICAL)
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
