"""How a block connects to an Azure service: the one type of connection every block takes (`ConnectionSpec`:
a connection string from a Secret or the environment, or a Microsoft Entra ID token credential), and the
one way from a connection and an environment to what opens it (`NamedConnection.resolve` → `Resolved`).

Every Azure connection (the Event Hubs source, the Blob checkpoint store, a Blob sink, a target hub)
authenticates one of two ways:

- a connection string with a shared key. It never appears in the manifest: in a cluster the operator maps
  the `connectionStringSecretRef` into the pod's environment under the variable `connectionStringEnv`
  names (or the block's default); outside a cluster the process reads that environment variable directly;
- a Microsoft Entra ID token `credential` (workload identity, managed identity or azure-identity's
  `DefaultAzureCredential`) with the block's address (the namespace, the storage account URL): no secret
  anywhere.

`NamedConnection` is one connection of a resource with the path of its block.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from hubshift.errors import UserError
from hubshift.spec.base import DATA_KEY, DNS_SUBDOMAIN, MAX_OBJECT_NAME, CelRule, Model, cel


class SecretKeyRefSpec(Model):
    """A key of a Kubernetes Secret in the PartitionedConsumer's namespace."""

    name: str = Field(
        min_length=1,
        max_length=MAX_OBJECT_NAME,
        pattern=DNS_SUBDOMAIN,
        description="Secret name (a DNS subdomain: lower-case letters, digits, '-' and '.'), in the "
        "resource's namespace.",
    )
    key: str = Field(
        min_length=1, max_length=MAX_OBJECT_NAME, pattern=DATA_KEY, description="Key inside the Secret."
    )


CredentialType = Literal["workloadIdentity", "managedIdentity", "default"]


class TokenCredentialSpec(Model):
    """A Microsoft Entra ID token credential from azure-identity, instead of a connection string: no key
    and no Secret. The identity needs a data role on what it reads or writes (Azure Event Hubs Data
    Receiver or Sender, Storage Blob Data Contributor)."""

    type: CredentialType = Field(
        description="workloadIdentity: Azure Workload Identity on AKS (the pods get the label "
        "azure.workload.identity/use and a ServiceAccount, spec.consumer.serviceAccountName, federated with "
        "the identity); managedIdentity: the node's or machine's managed identity; default: azure-identity's "
        "DefaultAzureCredential chain."
    )
    client_id: str | None = Field(
        default=None,
        min_length=1,
        description="Client id of the user-assigned managed identity or app registration (default: "
        "AZURE_CLIENT_ID, or the system-assigned identity).",
    )

    def describe(self) -> str:
        """`workloadIdentity`, or `workloadIdentity (client id ...)`: a client id is no secret."""
        return self.type if self.client_id is None else f"{self.type} (client id {self.client_id})"


# A connection string and a credential together: the validator's and the CEL rule's message.
BOTH_CREDENTIALS = (
    "set a connection string (connectionStringSecretRef, connectionStringEnv) or a credential, not both"
)


def _describe_connection(schema: dict[str, Any], model: type[Any]) -> None:
    """The connection fields' descriptions name the block's service and default variable (the fields are
    declared once, in `SecretConnectionSpec`)."""
    properties = schema.get("properties", {})
    service, default = model.SERVICE, model.DEFAULT_VARIABLE
    if "connectionStringSecretRef" in properties:
        properties["connectionStringSecretRef"]["description"] = (
            f"Secret holding the {service} connection string (in a cluster)."
        )
    if "connectionStringEnv" in properties:
        properties["connectionStringEnv"]["description"] = (
            f"Environment variable the consumer reads the {service} connection string from (default "
            f"{default})."
        )


class SecretConnectionSpec(Model):
    """A connection with a connection string: from the Secret `connectionStringSecretRef` names (in a
    cluster the operator puts it into the pods' environment), or from the environment variable
    `connectionStringEnv` names (or the block's default) outside a cluster."""

    model_config = ConfigDict(json_schema_extra=_describe_connection)

    SERVICE: ClassVar[str] = "the"
    DEFAULT_VARIABLE: ClassVar[str] = ""
    TAKES_CREDENTIAL: ClassVar[bool] = False

    connection_string_secret_ref: SecretKeyRefSpec | None = Field(default=None)
    connection_string_env: str | None = Field(default=None, min_length=1)

    @property
    def connection_string_variable(self) -> str:
        """The environment variable the connection string is read from."""
        return self.connection_string_env or self.DEFAULT_VARIABLE

    @property
    def token_credential(self) -> TokenCredentialSpec | None:
        return None

    def resolve(
        self, environ: Mapping[str, str], path: str, *, identity: TokenCredentialSpec | None = None
    ) -> Resolved:
        """The connection string from the environment (`UserError` naming the variable and the fields to set
        when it is not there); `path`: the block's place in the resource, for the message."""
        variable = self.connection_string_variable
        connection_string = environ.get(variable, "").strip()
        if not connection_string:
            credential_hint = (
                f"; or use a token credential, {path}.credential" if self.TAKES_CREDENTIAL else ""
            )
            raise UserError(
                f"environment variable {variable} is not set: it must hold the {self.SERVICE} connection "
                f"string of {path} (in a cluster, set {path}.connectionStringSecretRef{credential_hint})"
            )
        return Resolved(connection_string, None, variable)


class ConnectionSpec(SecretConnectionSpec):
    """A connection string, or a Microsoft Entra ID token `credential` with the block's address (`ADDRESS`:
    the field naming the namespace or the storage account URL)."""

    ADDRESS: ClassVar[str] = ""  # the address field's Python name
    ADDRESS_MESSAGE: ClassVar[str] = ""
    TAKES_CREDENTIAL: ClassVar[bool] = True

    credential: TokenCredentialSpec | None = Field(
        default=None, description="A Microsoft Entra ID token credential instead of a connection string."
    )

    @property
    def address(self) -> str | None:
        value: str | None = getattr(self, self.ADDRESS)
        return value

    @property
    def token_credential(self) -> TokenCredentialSpec | None:
        return self.credential

    @classmethod
    def cel_rules(cls) -> list[CelRule]:
        address = to_camel(cls.ADDRESS)
        rules = [
            cel(
                "!has(self.credential) || "
                "(!has(self.connectionStringSecretRef) && !has(self.connectionStringEnv))",
                BOTH_CREDENTIALS,
                ".credential",
            )
        ]
        # A required address (a Spark sink's path) is the schema's to demand: the API server runs no rule
        # while a required field is missing, so a rule asking for it would never fire.
        if not cls.model_fields[cls.ADDRESS].is_required():
            rules.append(
                cel(f"!has(self.credential) || has(self.{address})", cls.ADDRESS_MESSAGE, f".{address}")
            )
        return [*rules, *super().cel_rules()]

    @model_validator(mode="after")
    def _one_way_in(self) -> ConnectionSpec:
        """One connection, one way to authenticate: a connection string or a token credential with the
        address it is for."""
        if self.credential is None:
            return self
        if self.connection_string_secret_ref is not None or self.connection_string_env is not None:
            raise ValueError(BOTH_CREDENTIALS)
        if self.address is None:
            raise ValueError(self.ADDRESS_MESSAGE)
        return self

    def resolve(
        self, environ: Mapping[str, str], path: str, *, identity: TokenCredentialSpec | None = None
    ) -> Resolved:
        """The block's token credential (`identity` in its place when given), or its connection string."""
        if self.credential is not None:
            return Resolved(None, identity or self.credential, None)
        return super().resolve(environ, path)


@dataclass(frozen=True)
class Resolved:
    """A connection, ready to open: its connection string (never printed) or its token credential;
    `variable`: where the connection string came from, for messages."""

    connection_string: str | None = field(repr=False)
    identity: TokenCredentialSpec | None
    variable: str | None


Role = Literal["source", "store", "sink", "pipeline", "failover"]


@dataclass(frozen=True)
class NamedConnection:
    """One connection of a resource: its block and where the block is (`location`: the document's keys,
    `spec`, `eventHubs`; list indexes as ints); `role`: what the consumers use it for."""

    location: tuple[str | int, ...]
    connection: SecretConnectionSpec
    role: Role

    @property
    def path(self) -> str:
        """`spec.consumer.pipeline.route.targets[1]`: the block as a person finds it in the manifest."""
        out = ""
        for key in self.location:
            out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
        return out

    def resolve(self, environ: Mapping[str, str], *, identity: TokenCredentialSpec | None = None) -> Resolved:
        return self.connection.resolve(environ, self.path, identity=identity)

    def at(self, *keys: str | int) -> NamedConnection:
        """The same connection under a deeper place (a block's nested connection)."""
        return NamedConnection((*self.location, *keys), self.connection, self.role)


def named(
    location: tuple[str | int, ...], connection: SecretConnectionSpec | None, role: Role
) -> list[NamedConnection]:
    """`[NamedConnection]`, or `[]` when the block is absent."""
    return [] if connection is None else [NamedConnection(location, connection, role)]
