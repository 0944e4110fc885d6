"""The node and kind tiers count each side's storage requests from Azurite's access log
(`tests.harness.azurite.requests_in`): on a real Azurite, every request of the Blob SDK to a container is
one line, counted for that container and that window only."""

from __future__ import annotations

import time
from pathlib import Path

from azure.storage.blob import ContainerClient

from tests.harness.azurite import requests_in, start_azurite


def test_each_containers_requests_are_counted_in_their_window(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    azurite = start_azurite(tmp_path / "data", access_log=log)
    try:
        ours = ContainerClient.from_connection_string(azurite.connection_string, "ours")
        theirs = ContainerClient.from_connection_string(azurite.connection_string, "theirs")
        before = time.time()
        ours.create_container()
        theirs.create_container()
        time.sleep(1.1)  # the log's times are whole seconds: the window starts in a later one
        began = time.time()
        for i in range(5):
            ours.upload_blob(f"ns/hub/cg/ownership/{i}", b"", metadata={"owner": "a"})  # 5
        list(ours.list_blobs(name_starts_with="ns/hub/cg/", include=["metadata"]))  # 1
        ours.get_blob_client("ns/hub/cg/ownership/0").get_blob_properties()  # 1
        theirs.upload_blob("x", b"")
        ended = time.time()
        time.sleep(0.2)  # the last line reaches the file

        assert requests_in(log, "ours", began, ended) == 7
        assert requests_in(log, "theirs", began, ended) == 1
        assert requests_in(log, "ours", before, ended) == 8  # with the container's creation
        assert requests_in(log, "ours", ended + 2, ended + 10) == 0
    finally:
        azurite.stop()
