"""A block chosen by its type, as `spec.consumer.pipeline` and `spec.consumer.sink` are: the kinds a manifest
may name, each declared once in its own module (`Kind`: its name, its block, the connections it makes), the
list of them (`Kinds`), and the model built from that list (`Chosen`: `type`, one block per kind, refused
when the chosen kind needs its block and it is missing). The pipelines and the sinks are two such lists."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal, TypeVar

from pydantic import Field, create_model, model_validator

from hubshift.spec.base import CelRule, Model, cel
from hubshift.spec.connections import NamedConnection

Block = TypeVar("Block")
# Where a block is in the manifest, as in `NamedConnection.location`.
Location = tuple[str | int, ...]


def no_connections(block: Any, location: Location) -> list[NamedConnection]:
    return []


@dataclass(frozen=True, kw_only=True)
class Kind(Generic[Block]):
    """One type a manifest may name. `annotation` and `field`: its block, `<location>.<name>` (a model, or
    text); `required`: what the block is, for the refusal when the type is set without it (None: it has a
    default); `connections(block, location)`: the connections it makes (`location`: where the block is);
    `attribute`: the block's Python name where its manifest name is taken (`json` of pydantic)."""

    name: str
    annotation: Any
    field: Any  # pydantic's Field(...): its FieldInfo, typed as its default by pydantic
    required: str | None = None
    connections: Callable[[Block, Location], list[NamedConnection]] = no_connections
    attribute: str = ""

    @property
    def field_name(self) -> str:
        return self.attribute or self.name

    @property
    def missing(self) -> str:
        """The refusal of the type without its block (`required` is set)."""
        return f"{self.required} is required when type is {self.name}"


K = TypeVar("K", bound=Kind[Any])
M = TypeVar("M", bound="Chosen")


class Kinds(Generic[K]):
    """The kinds of one choice in the order the schema lists them, the first the default, and where the
    choice is in the manifest (`location`)."""

    def __init__(self, location: Location, *kinds: K) -> None:
        self.location = location
        self.kinds = kinds
        self.by_name: Mapping[str, K] = {kind.name: kind for kind in kinds}
        self.default = kinds[0].name

    def __iter__(self) -> Iterator[K]:
        return iter(self.kinds)

    def __len__(self) -> int:
        return len(self.kinds)

    def __getitem__(self, name: str) -> K:
        return self.by_name[name]

    def names(self, where: Callable[[K], bool]) -> list[str]:
        return [kind.name for kind in self.kinds if where(kind)]

    def required_rules(self) -> tuple[CelRule, ...]:
        """For the API server: a type set without the block it needs is refused."""
        return tuple(
            cel(
                f"!has(self.type) || self.type != '{kind.name}' || has(self.{kind.name})",
                kind.missing,
                f".{kind.name}",
            )
            for kind in self.kinds
            if kind.required is not None
        )

    def model(self, name: str, base: type[M], doc: str, type_description: str) -> type[M]:
        """`base` with `type` (one of the kinds' names, the first by default; `type_description`: what the
        schema says of it) and one optional block per kind: the model the manifest and the CRD read."""
        choices: Any = Literal.__getitem__(tuple(self.by_name))
        chosen = (choices, Field(self.default, description=type_description))
        blocks: dict[str, Any] = {kind.field_name: (kind.annotation, kind.field) for kind in self.kinds}
        return create_model(name, __base__=base, __doc__=doc, type=chosen, **blocks)


class Chosen(Model):
    """What a block chosen by its type shares: `type`, the chosen kind's block (`block`), the connections it
    makes, and the refusal when the kind needs its block and it is missing. A subclass names its kinds
    (`KINDS`); `Kinds.model` adds `type`'s choices and the blocks."""

    KINDS: ClassVar[Kinds[Any]]

    type: str

    @property
    def block(self) -> Any:
        """The block of the chosen kind (`<location>.<type>`)."""
        return getattr(self, self.KINDS[self.type].field_name)

    def connections(self, location: Location | None = None) -> list[NamedConnection]:
        """The connections the chosen kind makes (a block of another type, left over, makes none);
        `location`: where the choice is (default: where the manifest has it)."""
        where = self.KINDS.location if location is None else location
        return list(self.KINDS[self.type].connections(self.block, (*where, self.type)))

    @model_validator(mode="after")
    def _block_given(self) -> Chosen:
        kind = self.KINDS[self.type]
        if kind.required is not None and self.block is None:
            raise ValueError(kind.missing)
        return self
