"""hubshift: partition-aware PySpark consumers for Azure Event Hubs, driven by a Kubernetes operator."""

from importlib.metadata import PackageNotFoundError, version

# One version for the wheel, the image and the chart: pyproject.toml's, read from the installed package's
# metadata (.github/workflows/release.yml packages the chart and tags the image with it).
try:
    __version__ = version("hubshift")
except PackageNotFoundError:  # a source tree that was never installed (`pip install -e .` makes it known)
    __version__ = "0.0.0+unknown"
