"""The `foreachBatch` sink without Spark: your function imported and its signature checked when the sink is
built (one line naming what to fix), and the batch id that makes a write keyed by it idempotent."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hubshift.errors import UserError
from hubshift.sinks import SinkSpec, build_sink
from hubshift.sinks.foreach_batch import ForeachBatchSink, batch_id_of

HANDLERS = """
def write(frame, batch):
    pass

def write_with_defaults(frame, batch, table="orders", *, retries=3):
    pass

def write_any(*args, **kwargs):
    pass

def one_argument(frame):
    pass

def three_arguments(frame, batch, table):
    pass

def keyword_only(frame, batch, *, table):
    pass

class Writer:
    def __call__(self, frame, batch):
        pass

writer = Writer()
NOT_CALLABLE = "write"

async def write_async(frame, batch):
    pass

def write_lazily(frame, batch):
    yield frame

async def write_stream(frame, batch):
    yield frame

class AsyncWriter:
    async def __call__(self, frame, batch):
        pass

async_writer = AsyncWriter()
"""
MODULES = ("handlers_for_test", "handlers_broken")


@pytest.fixture
def handlers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "handlers_for_test.py").write_text(HANDLERS)
    (tmp_path / "handlers_broken.py").write_text("import handlers_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "handlers_for_test"
    for name in MODULES:
        sys.modules.pop(name, None)


def built(function: str) -> ForeachBatchSink:
    spec = SinkSpec.model_validate({"type": "foreachBatch", "foreachBatch": {"function": function}})
    sink = build_sink(spec, {}, scope="ns/orders/$default")
    assert isinstance(sink, ForeachBatchSink)
    return sink


@pytest.mark.parametrize("name", ["write", "write_with_defaults", "write_any", "writer"])
def test_a_function_of_a_dataframe_and_a_batch_is_taken(handlers: str, name: str) -> None:
    sink = built(f"{handlers}:{name}")
    assert sink.describe() == f"foreachBatch {handlers}:{name}"
    assert sink.spark_conf() == {} and sink.scope == "ns/orders/$default"
    assert sink.dead_letters == "foreach-batch-dead-letters/_dead_letters"


@pytest.mark.parametrize("name", ["one_argument", "three_arguments", "keyword_only"])
def test_a_function_of_other_arguments_is_refused_in_one_line(handlers: str, name: str) -> None:
    with pytest.raises(UserError) as refused:
        built(f"{handlers}:{name}")
    assert str(refused.value) == (
        f"foreachBatch {handlers}:{name}: the function must take two arguments (DataFrame, batch)"
    )


@pytest.mark.parametrize(
    ("function", "expected"),
    [
        (
            "handlers_nowhere:write",
            "sink foreachBatch 'handlers_nowhere:write': no module named 'handlers_nowhere' (install it in "
            "the consumer's image, put it in spec.consumer.code, or add it to PYTHONPATH)",
        ),
        (
            "handlers_broken:write",
            "sink foreachBatch 'handlers_broken:write': importing handlers_broken failed: no module named "
            "'handlers_missing_dependency'",
        ),
        (
            "handlers_for_test:missing",
            "sink foreachBatch 'handlers_for_test:missing': module handlers_for_test has no attribute "
            "'missing'",
        ),
        (
            "handlers_for_test:NOT_CALLABLE",
            "sink foreachBatch 'handlers_for_test:NOT_CALLABLE': NOT_CALLABLE is a str, not a function",
        ),
    ],
)
def test_a_handler_that_cannot_be_loaded_is_one_line(handlers: str, function: str, expected: str) -> None:
    with pytest.raises(UserError) as refused:
        built(function)
    assert str(refused.value) == expected


@pytest.mark.parametrize("name", ["write_async", "write_lazily", "write_stream", "async_writer"])
def test_a_function_that_would_return_without_writing_is_refused(handlers: str, name: str) -> None:
    # Called as foreachBatch calls it, an async function or a generator returns at once and writes nothing,
    # and the consumer would checkpoint past the batch: every event of it lost.
    with pytest.raises(UserError) as refused:
        built(f"{handlers}:{name}")
    assert str(refused.value) == (
        f"foreachBatch {handlers}:{name}: the function must write when called, as a plain function; an "
        "async function or a generator would return before writing anything"
    )


RANGES = st.dictionaries(
    st.sampled_from([str(p) for p in range(32)]),
    st.tuples(st.integers(0, 2**40), st.integers(0, 10_000)).map(lambda t: (t[0], t[0] + t[1])),
    min_size=1,
    max_size=8,
)


@given(RANGES)
def test_the_same_ranges_have_the_same_id_whatever_their_order(ranges: dict[str, tuple[int, int]]) -> None:
    reordered = dict(reversed(list(ranges.items())))
    assert batch_id_of("ns/hub/cg", ranges) == batch_id_of("ns/hub/cg", reordered)
    assert len(batch_id_of("ns/hub/cg", ranges)) == 32


@given(RANGES, RANGES)
def test_other_ranges_or_another_scope_have_another_id(
    ranges: dict[str, tuple[int, int]], other: dict[str, tuple[int, int]]
) -> None:
    if ranges != other:
        assert batch_id_of("ns/hub/cg", ranges) != batch_id_of("ns/hub/cg", other)
    assert batch_id_of("ns/hub/cg", ranges) != batch_id_of("ns/hub/other", ranges)
