"""What every block of the model is made of: `Model` (camelCase in YAML, unknown fields refused, CEL rules
beside the validators), `cel`, and the shapes of names, hosts and settings the blocks share."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

# Settings maps (Spark conf, writer options): bounded, so the API server can bound its CEL rules' cost.
MAX_SETTINGS = 64

# A Kubernetes object name (DNS subdomain, at most 253 characters), e.g. a Secret's, a ConfigMap's, a
# ServiceAccount's: never a path (the API client joins a name into the request's URL as it is).
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
MAX_OBJECT_NAME = 253
# A key of a Secret's or ConfigMap's data, as Kubernetes allows it.
DATA_KEY = r"^[-._a-zA-Z0-9]+$"
# A host as the SDKs dial it: DNS labels of lower-case letters, digits and '-', or an IPv4 address, with an
# optional port; nothing an SDK's URL parser would read as the end of the host (`#`, `/`, `?`, `\`, `@`).
HOST = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*(:[0-9]{1,5})?"
# The longest HOST.
MAX_HOST_LENGTH = 253 + len(":65535")

# A SQL identifier as PostgreSQL keeps it (at most 63 characters), and a table name with an optional schema.
SQL_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"
SQL_TABLE = r"^([A-Za-z_][A-Za-z0-9_]{0,62}\.)?[A-Za-z_][A-Za-z0-9_]{0,62}$"

# A CEL rule of a model, for the API server: `rule`, `message` (the model's own), optionally `fieldPath`.
CelRule = dict[str, str]


def cel(rule: str, message: str, field_path: str | None = None) -> CelRule:
    """One CEL rule. A rule guards every optional field it reads with has(): the API server also checks rules
    against defaults such as `{}`."""
    return {"rule": rule, "message": message, **({"fieldPath": field_path} if field_path else {})}


class Model(BaseModel):
    """camelCase in YAML, snake_case in Python; unknown fields are refused (a typo is an error).

    `CEL`: the model's cross-field validators restated for the API server, declared beside them (a unit
    test requires them for every `@model_validator`); `cel_rules()` adds those a model inherits."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    CEL: ClassVar[tuple[CelRule, ...]] = ()

    @classmethod
    def cel_rules(cls) -> list[CelRule]:
        rules: list[CelRule] = []
        for klass in reversed(cls.__mro__):
            rules.extend(klass.__dict__.get("CEL", ()))
        return rules
