"""Fetch the pinned jars of image/spark-jars.txt from Maven Central into a folder, each checked against its
SHA-256 (a jar already there and intact is kept). Standard library only: it runs in the Dockerfile's build
stage as well as on a developer's machine (tools/spark-jars).

    python image/fetch_jars.py image/spark-jars.txt DEST
"""

from __future__ import annotations

import hashlib
import sys
import urllib.request
from pathlib import Path

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"


def pins(path: Path) -> list[tuple[str, str, str, str]]:
    found = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        coordinates, digest = line.split()
        group, artifact, version = coordinates.split(":")
        found.append((group, artifact, version, digest))
    return found


def fetch(group: str, artifact: str, version: str, digest: str, dest: Path) -> Path:
    target = dest / f"{artifact}-{version}.jar"
    if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == digest:
        return target
    url = f"{MAVEN_CENTRAL}/{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}.jar"
    with urllib.request.urlopen(url, timeout=120) as answer:
        data = answer.read()
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise SystemExit(f"fetch_jars: {url}: SHA-256 {actual}, pinned {digest}")
    partial = target.with_suffix(".jar.part")
    partial.write_bytes(data)
    partial.replace(target)
    return target


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 64
    dest = Path(argv[2])
    dest.mkdir(parents=True, exist_ok=True)
    for pin in pins(Path(argv[1])):
        print(fetch(*pin, dest))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
