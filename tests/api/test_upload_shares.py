"""A key's share of uploads holds across the workers of ``strata serve --workers 2``.

Before, shares were each worker's own: a key with a share of 4 held 7 slots on two workers. Here the key has a
share of 2 uploads (``STRATA_API__MAX_UPLOADS_PER_KEY=2``). Two uploads are held open: each sends its headers
with ``Expect: 100-continue`` and waits for the server's ``100 Continue``, which the server sends only once the
upload holds its slot and reads its body; the test sends no body until it is done. A third upload of the same
key is then refused with 429 and ``Retry-After``, on fresh connections until both workers have refused one
(the kernel picks the worker; each worker's counter file in the metrics directory says which refused), while
another key's upload goes through.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from tests.api.shared_service import TENANT_A_WRITE, TENANT_B_WRITE, SharedService, auth, shared_service
from tests.api.test_metrics_workers import metrics_dir, per_worker
from tests.support.processes import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHARE = 2
BOUNDARY = "strata-share-test"


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, milvus_server_uri: str, module_pg_url: str
) -> Iterator[SharedService]:
    with shared_service(
        tmp_path_factory.mktemp("upload-shares"),
        milvus_server_uri,
        module_pg_url,
        workers=2,
        STRATA_API__MAX_UPLOADS_PER_KEY=str(SHARE),
        STRATA_API__BODY_TIMEOUT_S="300",
    ) as running:
        yield running


def multipart(name: str, text: str) -> bytes:
    return (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="files"; filename="{name}"\r\n'
        f"Content-Type: text/markdown\r\n\r\n{text}\r\n--{BOUNDARY}--\r\n"
    ).encode()


class HeldUpload:
    """An upload whose headers are sent and whose body is held back until ``finish``."""

    def __init__(self, service: SharedService, kb: str, key: str, body: bytes) -> None:
        self.body = body
        self.sock = socket.create_connection(("127.0.0.1", service.port), timeout=120)
        head = (
            f"POST /kbs/{kb}/documents HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {len(body)}\r\n"
            "Expect: 100-continue\r\n\r\n"
        )
        self.sock.sendall(head.encode())

    def wait_for_continue(self) -> str:
        """The server's first line: ``HTTP/1.1 100 Continue`` once the upload holds its slot."""
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = self.sock.recv(4096)
            if not chunk:
                break
            received += chunk
        return received.split(b"\r\n", 1)[0].decode()

    def finish(self) -> str:
        """Sends the body and returns the status line of the answer."""
        self.sock.sendall(self.body)
        received = b""
        while b"\r\n" not in received:
            chunk = self.sock.recv(4096)
            if not chunk:
                break
            received += chunk
        self.sock.close()
        return received.split(b"\r\n", 1)[0].decode()


def upload(service: SharedService, kb: str, key: str, n: int) -> httpx.Response:
    files = {"files": (f"note-{n}.md", f"# Note {n}\n\nThe ferry leaves at noon on day {n}.\n", "text/markdown")}
    return httpx.post(f"{service.url}/kbs/{kb}/documents", files=files, headers=auth(key), timeout=120)


def test_a_third_upload_of_a_key_is_refused_by_every_worker(service: SharedService) -> None:
    directory = metrics_dir(service)
    held = [
        HeldUpload(service, "alpha", TENANT_A_WRITE, multipart(f"held-{n}.md", f"# Held {n}\n\nA held upload {n}.\n"))
        for n in range(SHARE)
    ]
    try:
        assert [h.wait_for_continue() for h in held] == ["HTTP/1.1 100 Continue"] * SHARE
        statuses = []
        for n in range(40):  # the kernel picks the worker: go on until both have refused one
            refused = upload(service, "alpha", TENANT_A_WRITE, n)
            statuses.append(refused.status_code)
            assert refused.status_code == 429, refused.text
            assert int(refused.headers["retry-after"]) >= 1
            assert "STRATA_API__MAX_UPLOADS_PER_KEY" in refused.json()["detail"]
            counted = per_worker(directory, "strata_http_requests_rejected_total", reason="key_uploads")
            if sum(1 for value in counted.values() if value > 0) >= 2:
                break
        counted = per_worker(directory, "strata_http_requests_rejected_total", reason="key_uploads")
        assert sum(1 for value in counted.values() if value > 0) == 2, (statuses, counted)
        other = upload(service, "beta", TENANT_B_WRITE, 0)  # another key's share is its own
        assert other.status_code == 200, other.text
    finally:
        answers = [h.finish() for h in held]
    assert all(" 200 " in answer for answer in answers), answers
    # the held uploads ended: their slots come back (released as each answer is sent)
    assert wait_for(lambda: upload(service, "alpha", TENANT_A_WRITE, 99).status_code == 200, within_s=60)
