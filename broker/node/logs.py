"""structlog set-up: JSON lines by default, or a console renderer."""
from __future__ import annotations

import logging
import sys

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(level: str, log_format: str) -> None:
    renderer = (structlog.processors.JSONRenderer() if log_format == "json"
                else structlog.dev.ConsoleRenderer(colors=False))
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        # one write a line, its newline included: a node's processes share stderr, and a
        # line written in two parts (print's way) lets a sibling's line land between them
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
