"""The blocks of the `PartitionedConsumer` model that every part reads, one module per what they hold:

- `resource`: the resource in the Kubernetes API (group, version, kind, names, the annotations it takes);
- `base`: what every block is made of (`Model`, `cel`, the shapes of names and hosts);
- `connections`: how a block connects (`ConnectionSpec`, `TokenCredentialSpec`, `NamedConnection`,
  `Resolved`: the one way from a connection and an environment to a connection string or a credential);
- `hub`: the Event Hub and how it is reached (`EventHubsSpec`, `HubConnectionSpec`, `ProxySpec`);
- `store`: where ownership and checkpoints live (`CheckpointStoreSpec`, `BlobStoreSpec`);
- `checkpoints`: the start position, the checkpoint policy, the checkpoints of a hub failed over from;
- `spark`, `pods`: each consumer's Spark, and what its pod asks of its node;
- `scaling`, `rebalancing`: how many consumers, and how partitions move between them;
- `kinds`: a block chosen by its type (`Kind`, `Kinds`, `Chosen`), what the pipelines and the sinks are.

The resource itself (`hubshift.manifest`) puts these together with the blocks each pipeline and sink
declares in its own module (`hubshift.pipelines`, `hubshift.sinks`). The same YAML a user `kubectl apply`s
runs on this machine with `hubshift run -f`; the CRD schema in `crds/` is generated from the model
(`hubshift.operator.kubernetes.crd`), with each model's cross-field rules (`CEL`, declared beside its
validator) for the API server. Every name is also importable from `hubshift.spec` itself.
"""

from hubshift.spec.base import (
    DATA_KEY,
    DNS_SUBDOMAIN,
    HOST,
    MAX_HOST_LENGTH,
    MAX_OBJECT_NAME,
    MAX_SETTINGS,
    SQL_NAME,
    SQL_TABLE,
    CelRule,
    Model,
    cel,
)
from hubshift.spec.checkpoints import (
    ENQUEUED_TIME_REQUIRED,
    CheckpointPolicySpec,
    FailoverSpec,
    PartitionStartSpec,
    StartPositionSpec,
)
from hubshift.spec.connections import (
    BOTH_CREDENTIALS,
    ConnectionSpec,
    CredentialType,
    NamedConnection,
    Resolved,
    Role,
    SecretConnectionSpec,
    SecretKeyRefSpec,
    TokenCredentialSpec,
    named,
)
from hubshift.spec.hub import (
    CREDENTIAL_NEEDS_NAMESPACE,
    DEFAULT_EVENTHUBS_ENV,
    DEFAULT_PROXY_ENV,
    EVENTHUBS_NAMESPACE,
    PROXY_NEEDS_WEBSOCKETS,
    PROXY_URL,
    EventHubsSpec,
    HubConnectionSpec,
    ProxySpec,
    Transport,
)
from hubshift.spec.kinds import Chosen, Kind, Kinds
from hubshift.spec.pods import (
    QUANTITY,
    ResourceListSpec,
    ResourcesSpec,
)
from hubshift.spec.rebalancing import (
    EXIT_MARGIN_SECONDS,
    STOP_FOLLOW_SECONDS,
    STOP_MARGIN_SECONDS,
    LoadAwareSpec,
    RebalanceSpec,
    RebalanceStrategy,
    RolloutSpec,
)
from hubshift.spec.resource import (
    API_VERSION,
    FORCE_ACTIVATION_ANNOTATION,
    GROUP,
    KIND,
    MAX_NAME_LENGTH,
    PAUSED_ANNOTATION,
    PAUSED_REPLICAS_ANNOTATION,
    PAUSED_SCALE_IN_ANNOTATION,
    PAUSED_SCALE_OUT_ANNOTATION,
    PLURAL,
    ROLLOUT_PAUSED_ANNOTATION,
    SHORT_NAME,
    VERSION,
)
from hubshift.spec.scaling import (
    MAX_BELOW_MIN,
    ActivationSpec,
    FallbackSpec,
    ScalingBehaviorSpec,
    ScalingGoalSpec,
    ScalingPolicySpec,
    ScalingRulesSpec,
    ScalingSpec,
)
from hubshift.spec.spark import (
    JVM_SIZE,
    OWN_SPARK_CONF,
    SOURCE_OPTION_HINTS,
    SparkSpec,
    SparkUiSpec,
)
from hubshift.spec.store import (
    CREDENTIAL_NEEDS_ACCOUNT_URL,
    DEFAULT_STORAGE_ENV,
    STORAGE_ACCOUNT_URL,
    BlobStoreSpec,
    CheckpointStoreSpec,
    SqliteStoreSpec,
)

__all__ = [
    "API_VERSION",
    "BOTH_CREDENTIALS",
    "CREDENTIAL_NEEDS_ACCOUNT_URL",
    "CREDENTIAL_NEEDS_NAMESPACE",
    "DATA_KEY",
    "DEFAULT_EVENTHUBS_ENV",
    "DEFAULT_PROXY_ENV",
    "DEFAULT_STORAGE_ENV",
    "DNS_SUBDOMAIN",
    "ENQUEUED_TIME_REQUIRED",
    "EVENTHUBS_NAMESPACE",
    "EXIT_MARGIN_SECONDS",
    "FORCE_ACTIVATION_ANNOTATION",
    "GROUP",
    "HOST",
    "JVM_SIZE",
    "KIND",
    "MAX_BELOW_MIN",
    "MAX_HOST_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_OBJECT_NAME",
    "MAX_SETTINGS",
    "OWN_SPARK_CONF",
    "PAUSED_ANNOTATION",
    "PAUSED_REPLICAS_ANNOTATION",
    "PAUSED_SCALE_IN_ANNOTATION",
    "PAUSED_SCALE_OUT_ANNOTATION",
    "PLURAL",
    "PROXY_NEEDS_WEBSOCKETS",
    "PROXY_URL",
    "QUANTITY",
    "ROLLOUT_PAUSED_ANNOTATION",
    "SHORT_NAME",
    "SOURCE_OPTION_HINTS",
    "SQL_NAME",
    "SQL_TABLE",
    "STOP_FOLLOW_SECONDS",
    "STOP_MARGIN_SECONDS",
    "STORAGE_ACCOUNT_URL",
    "VERSION",
    "ActivationSpec",
    "BlobStoreSpec",
    "CelRule",
    "CheckpointPolicySpec",
    "CheckpointStoreSpec",
    "Chosen",
    "ConnectionSpec",
    "CredentialType",
    "EventHubsSpec",
    "FailoverSpec",
    "FallbackSpec",
    "HubConnectionSpec",
    "Kind",
    "Kinds",
    "LoadAwareSpec",
    "Model",
    "NamedConnection",
    "PartitionStartSpec",
    "ProxySpec",
    "RebalanceSpec",
    "RebalanceStrategy",
    "Resolved",
    "ResourceListSpec",
    "ResourcesSpec",
    "Role",
    "RolloutSpec",
    "ScalingBehaviorSpec",
    "ScalingGoalSpec",
    "ScalingPolicySpec",
    "ScalingRulesSpec",
    "ScalingSpec",
    "SecretConnectionSpec",
    "SecretKeyRefSpec",
    "SparkSpec",
    "SparkUiSpec",
    "SqliteStoreSpec",
    "StartPositionSpec",
    "TokenCredentialSpec",
    "Transport",
    "cel",
    "named",
]
