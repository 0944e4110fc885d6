"""Reading a `PartitionedConsumer` manifest: a YAML file (or a parsed document) into the typed model of
`hubshift.spec`, or one line that names the first field at fault."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from hubshift.errors import UserError
from hubshift.spec import KIND, PartitionedConsumer, TokenCredentialSpec

_CONNECTION_STRING_FIELDS = ("connectionStringSecretRef", "connectionStringEnv")


def parse_manifest(document: Mapping[str, Any], source: str = "manifest") -> PartitionedConsumer:
    """Validate a manifest; a bad one raises `UserError` naming the first field at fault."""
    try:
        return PartitionedConsumer.model_validate(document)
    except ValidationError as exc:
        raise UserError(f"{source}: {describe_validation_error(exc)}") from None


def load_manifest(path: str | os.PathLike[str]) -> PartitionedConsumer:
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise UserError(f"cannot read manifest {file}: {exc.strerror}") from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise UserError(f"{file}: not valid YAML{where}") from None
    consumers = [d for d in documents if isinstance(d, dict) and d.get("kind") == KIND]
    if len(consumers) != 1:
        raise UserError(f"{file}: expected exactly one {KIND} document, found {len(consumers)}")
    return parse_manifest(consumers[0], source=str(file))


def describe_validation_error(exc: ValidationError) -> str:
    """One line: the first error's field path in manifest spelling, and what is wrong with it."""
    error = exc.errors()[0]
    path = ".".join(str(part) for part in error["loc"] if not str(part).startswith("function-after"))
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown field"
    elif error["type"] == "missing":
        message = "required field is missing"
    count = exc.error_count()
    more = f" (and {count - 1} more problem{'s' if count > 2 else ''})" if count > 1 else ""
    return f"{path or 'document'}: {message}{more}"


def with_credential(consumer: PartitionedConsumer, credential: TokenCredentialSpec) -> PartitionedConsumer:
    """The manifest with every Azure connection its consumers make (the source, a Blob store, a Blob sink,
    a replicate target) authenticated by `credential` instead of a connection string: what a command
    line's `--credential` means. The manifest must name the namespaces and account URLs (`UserError`)."""
    document = consumer.model_dump(by_alias=True, mode="json", exclude_none=True)
    spec = document["spec"]
    blocks = [spec["eventHubs"], spec["checkpointStore"].get("blob")]
    sink, pipeline = spec.get("consumer", {}).get("sink", {}), spec.get("consumer", {}).get("pipeline", {})
    if sink.get("type") == "blob":
        blocks.append(sink.get("blob"))
    if pipeline.get("type") == "replicate":
        blocks.append(pipeline.get("replicate"))
    chosen = credential.model_dump(by_alias=True, mode="json", exclude_none=True)
    for block in blocks:
        if block is None:
            continue
        for name in _CONNECTION_STRING_FIELDS:
            block.pop(name, None)
        block["credential"] = chosen
    return parse_manifest(document, source=f"--credential {credential.type}")
