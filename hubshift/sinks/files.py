"""The `parquet` and `json` sinks: Spark's file formats in a folder (partitioned by `partitionBy`), where a
reader of the folder never sees a row twice.

Spark's file writer names its files at random, so a batch run again would add its rows a second time. Here
each batch is published in three steps, under a hidden `_hubshift/` folder that readers of the folder skip
(Spark, pyarrow and DuckDB ignore `_` folders):

1. Spark writes the batch's rows into `_hubshift/staging/<batch>/`;
2. a manifest, `_hubshift/pending/<batch>.json`, names each staged file and the name it takes in the folder
   (`part-<batch>-<n>`), each partition's last sequence number and the progress it builds on;
3. the batch claims each of its partitions' next stretch, in partition order: a file
   `_hubshift/claims/<partition>/<progress it builds on>` created only if there is none (the file system's
   exclusive create), holding the batch's name. Once it holds every claim, the batch is committed;
4. the files are renamed into place, each partition's progress is recorded
   (`_hubshift/progress/<partition>/<last sequence number>`), and the manifest is removed.

Two writers of one partition at once (an old owner still finishing its batch after its lease was broken,
and the new owner) build on the same progress, so they want the same claim and only one gets it: the other
takes its own claims back and fails its batch, which is read again and then leaves out what the first wrote.
One so late that the stretch was published and its claim pruned meanwhile finds the partition's progress
moved past what it builds on, and loses the same way.
A consumer, before each batch, finishes any manifest left pending (a writer killed between 2 and 4): it takes
the claims the manifest still lacks on its behalf, and publishes it when it then holds them all (renames are
idempotent, so two consumers finishing one are harmless), or abandons it when another batch holds one. Then
it leaves out the events at or below each partition's recorded progress: a replay writes nothing twice,
whatever its batch boundaries. A batch killed before its manifest leaves only staged files, which nobody
reads. The folder is on a volume the pods mount, or Azure storage over ABFS, whose rename is atomic and
whose create can refuse an existing file (Data Lake Storage Gen2, or a Blob account through its endpoint).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from hubshift.sinks.base import (
    SinkContext,
    SinkKind,
    StreamBatch,
    Transform,
    WriterBatch,
    partition_order,
)
from hubshift.sinks.commits import WrittenFile
from hubshift.sinks.spark_writer import (
    PathSink,
    SparkPathSpec,
    configured_writer,
    not_yet_written,
    path_connections,
    rows_to_write,
    to_write,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

HIDDEN = "_hubshift"
STAGING, PENDING, PROGRESS = f"{HIDDEN}/staging", f"{HIDDEN}/pending", f"{HIDDEN}/progress"
CLAIMS = f"{HIDDEN}/claims"
# A streaming job's batches: `streams/<query id>/<batch id>` once published; their claims are keyed
# `stream-<query id>` and build on the query's previous batch.
STREAMS = f"{HIDDEN}/streams"
STREAM_KEY = "stream-"


class AnotherWriter(RuntimeError):
    """Another batch claimed a partition's next stretch first: this one is not committed, and is read
    again."""


_DATA_FILE = re.compile(r"^part-[^/]*?(?P<ext>(\.[a-z0-9]+)+)$")


class FilesSinkSpec(SparkPathSpec):
    """A folder of Spark's files (Parquet or JSON lines), a reader of which never sees a row twice."""


class FilesSink(PathSink):
    def __init__(self, format_name: str, block: FilesSinkSpec, context: SinkContext) -> None:
        super().__init__(block, context)
        self.name = format_name
        self.path = block.path.rstrip("/")

    def describe(self) -> str:
        return f"{self.name} files in {self.path}"

    def spark_conf(self) -> dict[str, str]:
        return self.hadoop_conf()

    def write_batch(self, events: DataFrame, transform: Transform, batch: WriterBatch) -> list[WrittenFile]:
        folder = HadoopFolder(events.sparkSession, self.path)
        for manifest in folder.names(PENDING):
            if manifest.endswith(".json"):  # not a `.tmp` a writer killed mid-write left
                finish(folder, f"{PENDING}/{manifest}")
        written = {p: last for p in batch.ranges if (last := progress(folder, p)) is not None}
        todo = to_write(batch.ranges, written)
        if not todo:
            return []
        result = transform(not_yet_written(events, written))
        frame, files = rows_to_write(result, self.name, self.dead_letters)
        staging = f"{STAGING}/{batch.stem}"
        moves: list[tuple[str, str]] = []
        rows = 0
        if frame is not None:
            frame = frame.persist()
            try:
                rows = frame.count()
                configured_writer(frame, self.name, self.block).save(folder.absolute(staging))
            finally:
                frame.unpersist()
            staged = sorted(name for name in folder.files_under(staging) if is_data_file(name))
            moves = [(f"{staging}/{name}", final_name(name, batch.stem, n)) for n, name in enumerate(staged)]
        manifest = f"{PENDING}/{batch.stem}.json"
        after = {p: written.get(p, -1) for p in todo}
        document = {"stem": batch.stem, "moves": moves, "progress": todo, "after": after}
        folder.write_text(manifest, json.dumps(document))
        if not claim(folder, document):  # the commit point: every partition's next stretch is this batch's
            abandon(folder, document, manifest)
            raise AnotherWriter(
                f"{self.describe()}: another consumer wrote some of this batch's partitions meanwhile (an "
                "old owner finishing its batch); the batch is read again"
            )
        publish(folder, manifest)  # makes the rows visible
        return [WrittenFile("output", self.name, f"{self.path} ({len(moves)} files)", rows), *files]

    def write_stream_batch(self, frame: DataFrame, batch: StreamBatch) -> list[WrittenFile]:
        """A streaming job's micro-batch (append mode), published as a batch of events is (staging, a
        manifest, a claim, the renames), its claim keyed by the query and building on its previous batch,
        and marked done (`_hubshift/streams/<query id>/<batch id>`): a batch run again finds itself there
        and writes nothing."""
        folder = HadoopFolder(frame.sparkSession, self.path)
        for manifest in folder.names(PENDING):
            if manifest.endswith(".json"):
                finish(folder, f"{PENDING}/{manifest}")
        done = stream_mark(batch.app_id, batch.batch_id)
        if folder.read_text(done) is not None:
            return []
        stem = f"{batch.consumer_id}-{self.run}-{batch.app_id[:8]}-s{batch.batch_id:09d}"
        staging = f"{STAGING}/{stem}"
        rows = frame.count()
        configured_writer(frame, self.name, self.block).save(folder.absolute(staging))
        staged = sorted(name for name in folder.files_under(staging) if is_data_file(name))
        moves = [(f"{staging}/{name}", final_name(name, stem, n)) for n, name in enumerate(staged)]
        manifest = f"{PENDING}/{stem}.json"
        document = {
            "stem": stem,
            "moves": moves,
            "progress": {},
            "after": {f"{STREAM_KEY}{batch.app_id}": batch.batch_id - 1},
            "marks": [done],
        }
        folder.write_text(manifest, json.dumps(document))
        if not claim(folder, document):
            abandon(folder, document, manifest)
            raise AnotherWriter(
                f"{self.describe()}: another consumer wrote batch {batch.batch_id} of this partition's job "
                "meanwhile (an old owner finishing it); it is not written again"
            )
        publish(folder, manifest)
        return [WrittenFile("output", self.name, f"{self.path} ({len(moves)} files)", rows)]


def is_data_file(relative: str) -> bool:
    return _DATA_FILE.match(relative.rsplit("/", 1)[-1]) is not None


def final_name(staged: str, stem: str, number: int) -> str:
    """Where a staged file goes: the same partition folders, a name from the batch (`part-<stem>-<n>`)."""
    folder, _, name = staged.rpartition("/")
    match = _DATA_FILE.match(name)
    extension = match["ext"] if match else ""
    return f"{folder + '/' if folder else ''}part-{stem}-{number:05d}{extension}"


def claim_name(partition: str, after: int, generation: int = 0) -> str:
    """A claim on a partition's stretch after `after`: generations `<after>.<n>`, the newest the one that
    holds (`take`)."""
    return f"{CLAIMS}/{partition}/{after:020d}.{generation}"


def claim_after(name: str) -> int | None:
    """The `after` a claim's file name is for (None: not a claim's name)."""
    try:
        return int(name.split(".", 1)[0])
    except ValueError:
        return None


def generations(folder: HadoopFolder, partition: str, after: int) -> list[int]:
    """The generations of a stretch's claims there are, oldest first."""
    prefix = f"{after:020d}."
    found = (
        name.removeprefix(prefix) for name in folder.names(f"{CLAIMS}/{partition}") if name.startswith(prefix)
    )
    return sorted(int(n) for n in found if n.isdigit())


def stream_mark(app_id: str, batch_id: int) -> str:
    return f"{STREAMS}/{app_id}/{batch_id:020d}"


def moved_on(folder: HadoopFolder, key: str, after: int) -> bool:
    """Whether the stretch after `after` was published already: a partition's progress moved past it, or a
    streaming job's next batch was marked done."""
    if key.startswith(STREAM_KEY):
        return folder.read_text(stream_mark(key.removeprefix(STREAM_KEY), after + 1)) is not None
    return progress(folder, key) != (after if after >= 0 else None)


def claim(folder: HadoopFolder, document: dict[str, Any]) -> bool:
    """Take each partition's next stretch for the manifest's batch, in partition order (two batches never
    wait for each other in a circle); a claim this batch holds already counts. False when another batch
    holds one (those taken here stay, to be taken back by `abandon`)."""
    stem = document["stem"]
    for partition in sorted(document.get("after", {}), key=partition_order):
        if take(folder, partition, int(document["after"][partition]), stem) != stem:
            return False
    return True


def take(folder: HadoopFolder, partition: str, after: int, stem: str) -> str | None:
    """Who holds a partition's claim after this batch tried to take it. The newest generation of the
    stretch's claims holds it; one whose batch has no manifest any more while the partition's progress has
    not moved is an orphan (its batch gave up, and a consumer finishing that batch had claimed on its
    behalf meanwhile), and the next generation is created over it. Every generation is an exclusive create
    and none is deleted to take the stretch, so two batches that find the same orphan never both hold it.

    A claim created here holds only while the partition's progress is still `after`: a stretch published
    already has its claims pruned once a later stretch is published (`publish` records the progress before
    it prunes), so a late batch building on old progress finds no claim to lose to, and the progress is
    what refuses it (None)."""
    for _ in range(3):
        found = generations(folder, partition, after)
        if found:
            holder = folder.read_settled(claim_name(partition, after, found[-1]))
            if holder is None:
                continue  # taken back meanwhile
            orphan = (
                holder != stem
                and folder.read_text(f"{PENDING}/{holder}.json") is None
                and not moved_on(folder, partition, after)
            )
            if not orphan:
                return holder
        if folder.create_text(claim_name(partition, after, found[-1] + 1 if found else 0), stem):
            return None if moved_on(folder, partition, after) else stem
    return None


def abandon(folder: HadoopFolder, document: dict[str, Any], manifest: str) -> None:
    """A batch that lost a claim: its own claims back, its staged files and its manifest gone."""
    stem = document["stem"]
    for partition, after in document.get("after", {}).items():
        for generation in generations(folder, partition, int(after)):
            name = claim_name(partition, int(after), generation)
            if folder.read_text(name) == stem:
                folder.delete(name)
    folder.delete(f"{STAGING}/{stem}", recursive=True)
    folder.delete(manifest)


def finish(folder: HadoopFolder, manifest: str) -> None:
    """A manifest left pending by a writer killed (or still working): published once its batch holds every
    claim (those it lacks are taken on its behalf), abandoned when another batch holds one."""
    text = folder.read_text(manifest)
    if text is None:
        return  # finished meanwhile by someone else
    document = json.loads(text)
    if claim(folder, document):
        publish(folder, manifest)
    else:
        abandon(folder, document, manifest)


def publish(folder: HadoopFolder, manifest: str) -> None:
    """Finish a committed batch: its files into place, its partitions' progress, then the manifest gone.
    Idempotent, so whoever finds a manifest pending may finish it."""
    text = folder.read_text(manifest)
    if text is None:
        return  # finished meanwhile by someone else
    document = json.loads(text)
    for staged, final in document["moves"]:
        folder.move(staged, final)
    for partition, last in document["progress"].items():
        folder.write_text(f"{PROGRESS}/{partition}/{int(last):020d}", document["stem"], replace=True)
        _prune(folder, f"{PROGRESS}/{partition}", int(last))
    for mark in document.get("marks", []):
        folder.create_text(mark, document["stem"])
    for key, after in document.get("after", {}).items():  # partitions' and streams' claims alike
        _prune(folder, f"{CLAIMS}/{key}", int(after))
    folder.delete(f"{STAGING}/{document['stem']}", recursive=True)
    folder.delete(manifest)


def _prune(folder: HadoopFolder, directory: str, below: int) -> None:
    """The progress marks or claims of a directory for stretches before `below`: published, never read."""
    for name in folder.names(directory):
        after = claim_after(name)
        if after is not None and after < below:
            folder.delete(f"{directory}/{name}")


def progress(folder: HadoopFolder, partition: str) -> int | None:
    """The last sequence number of the partition the folder holds; None when it holds none."""
    marks = [int(name) for name in folder.names(f"{PROGRESS}/{partition}") if name.isdigit()]
    return max(marks) if marks else None


class HadoopFolder:
    """A folder through Hadoop's file system API (a local folder, or Azure storage over ABFS), for the few
    small files and renames the protocol needs."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        jvm: Any = spark._jvm
        self.jvm = jvm
        self.root = root.rstrip("/")
        self.fs = jvm.org.apache.hadoop.fs.Path(self.root).getFileSystem(spark._jsc.hadoopConfiguration())

    def absolute(self, relative: str) -> str:
        return f"{self.root}/{relative}"

    def _path(self, relative: str) -> Any:
        return self.jvm.org.apache.hadoop.fs.Path(self.absolute(relative))

    def names(self, relative: str) -> list[str]:
        """The names in a folder ([] when it does not exist)."""
        path = self._path(relative)
        if not self.fs.exists(path):
            return []
        return sorted(str(status.getPath().getName()) for status in self.fs.listStatus(path))

    def files_under(self, relative: str) -> Iterator[str]:
        """Every file under a folder, as a path relative to it."""
        base = str(self._path(relative).toUri().getPath()).rstrip("/")
        found = self.fs.listFiles(self._path(relative), True)
        while found.hasNext():
            full = str(found.next().getPath().toUri().getPath())
            yield full[len(base) :].lstrip("/")

    def read_text(self, relative: str) -> str | None:
        path = self._path(relative)
        if not self.fs.exists(path):
            return None
        stream = self.fs.open(path)
        try:
            return str(self.jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def write_text(self, relative: str, text: str, *, replace: bool = False) -> None:
        """Write a small file whole: under a temporary name, then renamed (a reader sees all or nothing)."""
        final = self._path(relative)
        if replace and self.fs.exists(final):
            return  # progress files are named by their content: one already there says the same
        temporary = self._path(f"{relative}.tmp")
        out = self.fs.create(temporary, True)
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()
        if not self.fs.rename(temporary, final) and not self.fs.exists(final):
            raise OSError(f"could not write {self.absolute(relative)}")

    def create_text(self, relative: str, text: str) -> bool:
        """Create a small file only if there is none, atomically: a local folder's `O_EXCL`, or Azure
        storage's conditional create (hadoop-azure's create without overwrite); False when one is there
        already. Its text may be read empty for a moment (`read_settled` waits that out)."""
        local = self._local(relative)
        if local is not None:
            local.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(local, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
            return True
        path = self._path(relative)
        try:
            out = self.fs.create(path, False)
        except Exception as error:
            if "FileAlreadyExists" in str(error) or self.fs.exists(path):
                return False
            raise
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()
        return True

    def read_settled(self, relative: str, wait: float = 2.0) -> str | None:
        """A file `create_text` made, once its text is there (None: it is gone)."""
        deadline = time.monotonic() + wait
        while True:
            text = self.read_text(relative)
            if text or text is None or time.monotonic() > deadline:
                return text
            time.sleep(0.05)

    def _local(self, relative: str) -> Path | None:
        """The path on this machine, for a folder that is one (no scheme, or file:)."""
        root = self.root.removeprefix("file:")
        if "://" in root or ":" in root.split("/", 1)[0]:
            return None
        return Path(root) / relative

    def move(self, source: str, destination: str) -> None:
        """Rename a file into place; done already (by this consumer or another) is fine."""
        target = self._path(destination)
        if self.fs.exists(target):
            return
        self.fs.mkdirs(target.getParent())
        if not self.fs.rename(self._path(source), target) and not self.fs.exists(target):
            raise OSError(f"could not move {self.absolute(source)} to {self.absolute(destination)}")

    def delete(self, relative: str, *, recursive: bool = False) -> None:
        self.fs.delete(self._path(relative), recursive)


def _parquet(block: FilesSinkSpec, context: SinkContext) -> FilesSink:
    return FilesSink("parquet", block, context)


def _json(block: FilesSinkSpec, context: SinkContext) -> FilesSink:
    return FilesSink("json", block, context)


PARQUET_SINK = SinkKind[FilesSinkSpec](
    name="parquet",
    annotation=FilesSinkSpec | None,
    field=Field(default=None, description="Parquet files in a folder (type parquet); no row twice."),
    required="parquet (the folder's path)",
    connections=path_connections,
    build=_parquet,
)
JSON_SINK = SinkKind[FilesSinkSpec](
    name="json",
    annotation=FilesSinkSpec | None,
    field=Field(default=None, alias="json", description="JSON lines in a folder (type json); no row twice."),
    required="json (the folder's path)",
    attribute="json_",
    connections=path_connections,
    build=_json,
)
