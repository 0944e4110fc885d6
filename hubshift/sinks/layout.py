"""Where a sink puts things: names only, no I/O. The same layout in a folder and in a Blob container.

    <root>/<output>/[<directory>/]<stem>-<task>.jsonl   one file per output, batch and Spark task
    <root>/_batches/<stem>.json                         the batch's commit record, written last
    <dead-letter root>/date=<yyyy-mm-dd>/<stem>-<task>.jsonl

`stem` is `<consumer>-<run>-<batch id>`: the consumer's identity (so concurrent consumers never collide),
the run (a fresh token each time a consumer process builds its sink, because Spark's batch ids start again
at 0 when its scratch checkpoint is gone) and the batch id (a batch Spark replays in the same run writes
the same names again, overwriting instead of duplicating). A file not named by a commit record is not part
of the output (a batch that failed half-way, or an older attempt of a replayed batch).
"""

from __future__ import annotations

import re
import secrets
from datetime import datetime

COMMITS = "_batches"
VIEWS = "views"
# Where a folder or blob sink's dead letters go unless `deadLetterPath` says: beside its outputs.
DEAD_LETTERS = "dead-letter"
DATA_SUFFIX = ".jsonl"
COMMIT_SUFFIX = ".json"
# In-progress uploads (folder sink) start with this and are never listed.
TEMPORARY_PREFIX = "."

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(text: str) -> str:
    """A consumer id as a file-name part: letters, digits, `.`, `_`, `-` only."""
    cleaned = _UNSAFE.sub("_", text).strip("._")
    return cleaned or "consumer"


def new_run() -> str:
    return secrets.token_hex(4)


def batch_stem(consumer_id: str, run: str, batch_id: int) -> str:
    return f"{safe_name(consumer_id)}-{run}-{batch_id:09d}"


def data_file(output: str, directory: str | None, stem: str, task: int) -> str:
    folder = f"{output}/{directory}" if directory else output
    return f"{folder}/{stem}-{task:03d}{DATA_SUFFIX}"


def dead_letter_file(day: datetime, stem: str, task: int) -> str:
    return f"date={day:%Y-%m-%d}/{stem}-{task:03d}{DATA_SUFFIX}"


def commit_file(stem: str) -> str:
    return f"{COMMITS}/{stem}{COMMIT_SUFFIX}"


def join(prefix: str, name: str) -> str:
    prefix = prefix.strip("/")
    return f"{prefix}/{name}" if prefix else name
