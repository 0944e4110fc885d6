"""The `PartitionedConsumer` resource in the Kubernetes API: its group, version, kind and names, the longest
name it may have, and the annotations the operator reads on it."""

GROUP = "hubshift.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PartitionedConsumer"
PLURAL = "partitionedconsumers"
SHORT_NAME = "pcon"

# KEDA's pause annotations, under our group (`operator/autoscaler.py` parses them).
PAUSED_ANNOTATION = f"autoscaling.{GROUP}/paused"
PAUSED_REPLICAS_ANNOTATION = f"autoscaling.{GROUP}/paused-replicas"
PAUSED_SCALE_IN_ANNOTATION = f"autoscaling.{GROUP}/paused-scale-in"
PAUSED_SCALE_OUT_ANNOTATION = f"autoscaling.{GROUP}/paused-scale-out"
FORCE_ACTIVATION_ANNOTATION = f"autoscaling.{GROUP}/force-activation"
# Pauses a rollout the operator drives (`operator/rollout.py`): no pod is replaced while it says "true".
ROLLOUT_PAUSED_ANNOTATION = f"rollout.{GROUP}/paused"

# The longest PartitionedConsumer name: its StatefulSet's pods carry a `controller-revision-hash` label of
# `<name>-<10 characters>`, and a label value has at most 63.
MAX_NAME_LENGTH = 52
