"""hubshift: partition-aware PySpark consumers for Azure Event Hubs, driven by a Kubernetes operator."""

__version__ = "0.1.0"
