# One image for the hubshift operator and its consumer pods: Python 3.11, a JRE 17 from Debian, PySpark
# from pip with the jars of Delta Lake, hadoop-azure and the PostgreSQL JDBC driver, a non-root user. The
# operator runs `hubshift operator`, a consumer pod `hubshift consume
# -f /etc/hubshift/manifest.yaml --id $(POD_NAME)` (both set by their pod specs).
#
#   docker build -t hubshift:0.1.0 .
#
# BASE_IMAGE: any Debian bookworm image with python3.11 (`python`, venv) and apt; tools/image builds
# with a stand-in made from Debian's packages where no image registry is reachable.

ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS deps
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/hubshift
WORKDIR /src
# Dependencies first (with every extra: `all` is PySpark, Delta and pandas for the Spark engine, psycopg for a
# PostgreSQL projection), from pyproject.toml alone (an empty README.md and package stand in), so neither a
# code nor a README change reinstalls PySpark. The placeholder and its build output (build/, *.egg-info)
# go again: setuptools would otherwise reuse build/lib/hubshift/__init__.py (newer than the sources
# copied next) in the install below, and `hubshift --version` would fail.
COPY pyproject.toml ./
RUN mkdir hubshift && touch README.md hubshift/__init__.py \
 && /opt/hubshift/bin/pip install '.[all]' \
 && /opt/hubshift/bin/pip uninstall -y hubshift \
 && rm -rf README.md hubshift build hubshift.egg-info

# The JVM jars beside PySpark's own (Delta Lake, hadoop-azure, the PostgreSQL JDBC driver), pinned with
# their SHA-256 in image/spark-jars.txt: in PySpark's jars/, so a consumer pod downloads nothing.
FROM ${BASE_IMAGE} AS jars
COPY image/ /image/
RUN python /image/fetch_jars.py /image/spark-jars.txt /jars

FROM deps AS build
COPY README.md ./
COPY hubshift ./hubshift
# The package alone under /app, its files at their final paths: the image adds it as a small layer on
# top of the dependencies' instead of copying the whole environment again for every code change.
RUN /opt/hubshift/bin/pip install --no-deps --root /app . \
 && cp -a /app/. / \
 && /opt/hubshift/bin/hubshift --version

FROM ${BASE_IMAGE}
# procps: Spark's launch scripts call `ps`. The JRE's path differs per architecture; one stable name.
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s "/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)" /usr/lib/jvm/java-17 \
 && groupadd --gid 10001 hubshift \
 && useradd --uid 10001 --gid 10001 --home-dir /var/lib/hubshift --create-home --shell /usr/sbin/nologin hubshift
COPY --from=deps /opt/hubshift /opt/hubshift
COPY --from=jars /jars/ /opt/hubshift/lib/python3.11/site-packages/pyspark/jars/
COPY --from=build /app/ /
ENV PATH=/opt/hubshift/bin:$PATH \
    JAVA_HOME=/usr/lib/jvm/java-17 \
    PYSPARK_PYTHON=python3 \
    PYSPARK_DRIVER_PYTHON=python3 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/var/lib/hubshift
WORKDIR /var/lib/hubshift
# Numeric, so Kubernetes can verify runAsNonRoot.
USER 10001:10001
CMD ["hubshift", "--help"]
