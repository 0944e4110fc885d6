"""Who owns which partition, where each partition's position is kept, and how ownership moves safely.

Knows nothing of Spark, kopf or Kubernetes.
"""
