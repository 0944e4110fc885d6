"""Logging: hubshift's lines at the level asked, the libraries' per-request lines never (the operator runs
under kopf's INFO root logger, where the Azure SDK would log every storage request with its headers)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from hubshift.log import CHATTY, QUIET
from hubshift.operator.cli import configure_operator_logging


@pytest.fixture
def restored_logging() -> Iterator[None]:
    names = ["", *QUIET, *CHATTY]
    levels = {name: logging.getLogger(name).level for name in names}
    handlers = list(logging.getLogger().handlers)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        logging.getLogger().handlers[:] = handlers


def effective(name: str) -> int:
    return logging.getLogger(name).getEffectiveLevel()


@pytest.mark.usefixtures("restored_logging")
def test_the_operator_logs_its_own_lines_but_no_request_lines() -> None:
    configure_operator_logging("plain", verbose=False)
    assert effective("hubshift.operator.loop") == logging.INFO
    assert effective("kopf.objects") == logging.INFO
    assert effective("azure.core.pipeline.policies.http_logging_policy") == logging.ERROR
    assert effective("httpx2") == logging.WARNING
    assert effective("aiohttp.access") == logging.WARNING


@pytest.mark.usefixtures("restored_logging")
def test_verbose_keeps_the_api_calls_but_not_the_storage_requests() -> None:
    configure_operator_logging("plain", verbose=True)
    assert effective("kopf.objects") == logging.DEBUG
    assert effective("httpx2") == logging.DEBUG
    assert effective("azure.core.pipeline.policies.http_logging_policy") == logging.ERROR
