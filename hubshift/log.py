"""Logging for every hubshift process: one format, hubshift's own level, the SDKs kept quiet."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from hubshift.errors import UserError

LEVELS = ("debug", "info", "warning", "error", "critical")
# The SDKs log every retry and reconnect at WARNING; their outcome reaches us as exceptions.
QUIET = ("azure", "py4j", "uamqp")
# HTTP clients and servers that log every request at INFO: lightkube's httpx2 (every API call), aiohttp's
# access log (every probe). (The Azure SDK's request log, with headers, is under "azure" above.)
CHATTY = ("httpx", "httpx2", "aiohttp.access")


def configure_logging(level: str, stream: TextIO | None = None) -> None:
    """`level` for hubshift's loggers (one of `LEVELS`, any case), WARNING for everything else."""
    if level.lower() not in LEVELS:
        raise UserError(f"--log-level {level!r}: choose one of {', '.join(LEVELS)}")
    logging.basicConfig(
        level=logging.WARNING,
        stream=stream or sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    logging.getLogger("hubshift").setLevel(level.upper())
    quiet_libraries()


def quiet_libraries(requests: bool = True) -> None:
    """The SDKs at ERROR whatever the root logger's level (kopf sets INFO, DEBUG when verbose); with
    `requests`, the per-request lines of `CHATTY` at WARNING too (their failures still show)."""
    for noisy in QUIET:
        logging.getLogger(noisy).setLevel(logging.ERROR)
    if requests:
        for chatty in CHATTY:
            logging.getLogger(chatty).setLevel(logging.WARNING)
