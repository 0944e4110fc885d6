"""The agent's warning policy for failures that repeat (`consumer/failures.py`): one warning with the whole
reason per run of failures, repeats at debug with at most one summary a minute, one line on recovery."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hubshift.consumer.failures import SUMMARY_SECONDS, FailureLog, LogLine

REFUSED = "Blob storage at https://acct.blob.core.windows.net refused the credentials (AuthenticationFailed)"


def test_a_refused_token_for_a_minute_is_one_warning_a_summary_and_one_recovery() -> None:
    """The case that logged 70 warnings in 45 s: a renewal every second and every checkpoint refused."""
    failures = FailureLog()
    lines: list[LogLine] = []
    for second in range(75):
        lines.append(failures.failed("membership renewal", REFUSED, float(second)))
        lines.append(failures.failed("checkpoint", REFUSED, second + 0.5, where=f"partition {second % 4}"))
    recovered = failures.succeeded("membership renewal", 75.0)
    warnings = [line for line in lines if line.level == "warning"]
    assert warnings == [LogLine("warning", f"membership renewal failed (retrying): {REFUSED}")]
    assert lines[1] == LogLine(
        "info", "checkpoint failed (partition 0) too, for the same reason as membership renewal (retrying)"
    )
    summaries = [line.message for line in lines[2:] if line.level == "info"]
    assert summaries == [
        "membership renewal still failing: 61 times in 60s",
        "checkpoint still failing: 61 times in 60s",
    ]
    assert all(line.level == "debug" for line in lines if line.level != "info" and line not in warnings)
    assert recovered == LogLine("info", "membership renewal works again (it failed 75 times in 75s)")
    # The checkpoint's run goes on, the renewal's ended: only the checkpoint has a run left to end.
    assert failures.succeeded("membership renewal", 76.0) is None
    assert failures.succeeded("checkpoint", 76.0) == LogLine(
        "info", "checkpoint works again (it failed 75 times in 76s)"
    )


def test_success_without_failures_says_nothing() -> None:
    failures = FailureLog()
    assert failures.succeeded("listing", 0.0) is None
    failures.failed("listing", "timeout", 1.0)
    assert failures.succeeded("listing", 2.0) == LogLine("info", "listing works again (it failed once in 1s)")
    assert failures.succeeded("listing", 3.0) is None


def test_a_new_run_warns_again_and_a_changed_reason_shows_in_the_summary() -> None:
    failures = FailureLog(summary_seconds=10.0)
    assert failures.failed("listing", "timeout", 0.0).level == "warning"
    again = failures.failed("listing", "refused", 5.0)
    assert again == LogLine("debug", "listing failed again (2 times): refused")
    assert failures.failed("listing", "refused", 10.0) == LogLine(
        "info", "listing still failing: 3 times in 10s; latest: refused"
    )
    failures.succeeded("listing", 11.0)
    assert failures.failed("listing", "timeout", 12.0).level == "warning"  # a new run


EVENTS = st.lists(
    st.tuples(
        st.floats(0.0, 30.0),  # seconds since the previous event
        st.sampled_from(["renewal", "listing", "checkpoint"]),
        st.one_of(st.none(), st.sampled_from(["refused", "timeout"])),  # None: it worked
    ),
    max_size=200,
)


@given(EVENTS)
def test_warnings_only_start_runs_summaries_are_spaced_and_each_run_ends_in_one_line(
    events: list[tuple[float, str, str | None]],
) -> None:
    failures = FailureLog()
    now = 0.0
    running: dict[str, float] = {}  # kind -> when its last warning, info or summary was logged
    for gap, kind, reason in events:
        now += gap
        if reason is None:
            line = failures.succeeded(kind, now)
            assert (line is not None) == (kind in running)
            running.pop(kind, None)
            continue
        line = failures.failed(kind, reason, now)
        if kind not in running:
            warned = line.level == "warning" and reason in line.message
            assert warned or (line.level == "info" and "same reason" in line.message)
            running[kind] = now
        elif line.level == "info":
            assert now - running[kind] >= SUMMARY_SECONDS
            running[kind] = now
        else:
            assert line.level == "debug" and now - running[kind] < SUMMARY_SECONDS
