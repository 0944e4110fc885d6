"""Microsoft Entra ID token credentials: the one place hubshift builds them, with azure-identity (the Azure
SDKs' own library), and the one place that imports it.

A manifest (or a command line) names a credential by its type and, optionally, a client id
(`hubshift.spec.TokenCredentialSpec`); each process builds it once (`token_credential`) and hands the same
object to every SDK client that needs it, so one token cache serves them all. azure-identity gets and
refreshes the tokens; hubshift never reads, logs or stores one. The asynchronous SDK clients (the
operator's probe) take the same credential through `AsyncCredential`.

- `workloadIdentity`: Azure Workload Identity on AKS (`WorkloadIdentityCredential`): the federated
  ServiceAccount token the webhook projects into pods labelled `azure.workload.identity/use: "true"`,
  exchanged for an Entra ID token (`AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, `AZURE_FEDERATED_TOKEN_FILE`);
- `managedIdentity`: the machine's managed identity (`ManagedIdentityCredential`: IMDS on a VM or an AKS
  node, or the endpoint in `IDENTITY_ENDPOINT` / `IDENTITY_HEADER`);
- `default`: `DefaultAzureCredential`, the chain of all of them (environment, workload identity, managed
  identity, the Azure CLI, ...).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, get_args

from pydantic import ValidationError

from hubshift.errors import UserError, one_line
from hubshift.spec.connections import CredentialType, TokenCredentialSpec

if TYPE_CHECKING:
    from azure.core.credentials import AccessToken, TokenCredential

CREDENTIAL_TYPES: tuple[str, ...] = get_args(CredentialType)

# What each type needs from its place, for the one line a failure becomes.
_HINTS = {
    "workloadIdentity": "on AKS: the pod needs the label azure.workload.identity/use=true and a "
    "ServiceAccount federated with the identity (AZURE_TENANT_ID, AZURE_CLIENT_ID and "
    "AZURE_FEDERATED_TOKEN_FILE set)",
    "managedIdentity": "the machine needs a managed identity (IMDS, or IDENTITY_ENDPOINT and "
    "IDENTITY_HEADER)",
    "default": "DefaultAzureCredential found no identity here (environment, workload identity, managed "
    "identity or an Azure CLI login)",
}


def parse_identity(credential_type: str, client_id: str | None = None) -> TokenCredentialSpec:
    """The credential a command line names (`--credential`, `--client-id`); `UserError` for a bad one."""
    try:
        return TokenCredentialSpec.model_validate({"type": credential_type, "clientId": client_id or None})
    except ValidationError:
        raise UserError(
            f"--credential {credential_type!r}: choose one of {', '.join(CREDENTIAL_TYPES)}"
        ) from None


_CREDENTIALS: dict[TokenCredentialSpec, TokenCredential] = {}
_LOCK = threading.Lock()


def token_credential(identity: TokenCredentialSpec) -> TokenCredential:
    """This process's credential for `identity` (built on first use, then shared: one token cache).
    `UserError` when this place cannot have one at all (a workload identity without its environment)."""
    with _LOCK:
        credential = _CREDENTIALS.get(identity)
        if credential is None:
            credential = _CREDENTIALS[identity] = _build(identity)
        return credential


def _build(identity: TokenCredentialSpec) -> TokenCredential:
    from azure.identity import DefaultAzureCredential, ManagedIdentityCredential, WorkloadIdentityCredential

    client_id = identity.client_id
    try:
        if identity.type == "workloadIdentity":
            return (
                WorkloadIdentityCredential(client_id=client_id) if client_id else WorkloadIdentityCredential()
            )
        if identity.type == "managedIdentity":
            return (
                ManagedIdentityCredential(client_id=client_id) if client_id else ManagedIdentityCredential()
            )
        if client_id:
            return DefaultAzureCredential(
                managed_identity_client_id=client_id, workload_identity_client_id=client_id
            )
        return DefaultAzureCredential()
    except ValueError as exc:
        raise UserError(f"credential {identity.describe()}: {one_line(exc)} ({hint(identity)})") from None


@dataclass(frozen=True)
class IdentityCredential:
    """The token credential of `identity`, as configuration (`hubshift.azure_storage.TokenSource`): it
    pickles to Spark's workers, and each process builds the credential once (`token_credential`)."""

    identity: TokenCredentialSpec

    def credential(self) -> TokenCredential:
        return token_credential(self.identity)

    def describe(self) -> str:
        return self.identity.describe()

    def explain(self, error: BaseException) -> str | None:
        return describe_credential_error(error, self.identity)


def describe_credential_error(error: BaseException, identity: TokenCredentialSpec) -> str | None:
    """One line for an error azure-identity raised getting a token (it never holds one); None for any
    other error."""
    from azure.core.exceptions import ClientAuthenticationError

    if not isinstance(error, ClientAuthenticationError):
        return None
    return f"no token from credential {identity.describe()}: {one_line(error)} ({hint(identity)})"


def hint(identity: TokenCredentialSpec, environ: Mapping[str, str] | None = None) -> str:
    """What to check when no token came: where this place's identity is missing, or, when its environment
    is there, the client id (a wrong one is the usual cause)."""
    environ = os.environ if environ is None else environ
    client_id = identity.client_id
    if identity.type == "managedIdentity" and (
        environ.get("IDENTITY_ENDPOINT") or environ.get("MSI_ENDPOINT")
    ):
        if client_id:
            return (
                f"the managed identity endpoint is set (IDENTITY_ENDPOINT): check that client id {client_id} "
                "is a user-assigned identity of this machine (on AKS: of the node pool)"
            )
        return (
            "the managed identity endpoint is set: this machine may have no system-assigned identity; "
            "name a user-assigned one with its client id"
        )
    federated = all(environ.get(name) for name in ("AZURE_TENANT_ID", "AZURE_FEDERATED_TOKEN_FILE"))
    if identity.type == "workloadIdentity" and federated:
        subject = client_id or environ.get("AZURE_CLIENT_ID") or "AZURE_CLIENT_ID"
        return (
            f"the workload identity environment is set: check that client id {subject} is the identity "
            "federated with this pod's ServiceAccount (the federated credential's issuer and subject)"
        )
    if client_id and identity.type == "default":
        return f"{_HINTS['default']}; check that client id {client_id} is an identity this place can use"
    return _HINTS[identity.type]


class AsyncCredential:
    """A credential for the asynchronous SDK clients over this process's synchronous one: the same token
    cache; azure-identity's requests run on a worker thread."""

    def __init__(self, identity: TokenCredentialSpec) -> None:
        self.identity = identity
        self._credential = token_credential(identity)

    async def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return await asyncio.to_thread(self._credential.get_token, *scopes, **kwargs)

    async def close(self) -> None:
        """Nothing to release: the synchronous credential is the process's, shared."""

    async def __aenter__(self) -> AsyncCredential:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self.close()
