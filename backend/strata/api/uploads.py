"""Uploaded files: safe relative names, written under a temporary folder.

An upload is one root, as a folder argument of ``strata index`` is: its
documents record the root the client names (``strata index DIR --server``
sends DIR), so ``delete_missing`` deletes what vanished from that folder and
nothing else, as the local command does.

Every name is checked before anything is written: a name the file system
cannot hold (a part over 255 bytes, a path too long) or two names where one
is a folder of the other (``conf`` and ``conf/x.md``) are a 422 naming the file.

The temporary ``strata-upload-*`` folder is made, filled, indexed and removed
in one worker thread (``index_in_temporary_folder``): a request cancelled at
shutdown cannot remove it under a run still reading it, and the run, stopped
then, removes it on its way out.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import unicodedata
from collections.abc import Callable, Collection, Coroutine, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from fastapi import Request, Response, UploadFile
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from strata.api.problems import Problem
from strata.stores.lease import process_gone

_CHUNK = 1024 * 1024
MAX_NAME_CHARS = 1024
NAME_SHOWN = 80  # an answer quotes this much of a name over MAX_NAME_CHARS: enough to find the file
MAX_PART_BYTES = 255  # NAME_MAX of Linux and macOS file systems, in UTF-8 bytes
MAX_PATH_BYTES = 3072  # below PATH_MAX (4096) with room for the temporary folder
MAX_KEPT = 10_000
MAX_FILES = 1000  # files in one request (Starlette's form parser's default): more are sent in several requests
MAX_PRESENT = 1_000_000  # names of the ``present`` part (the request body's size bounds it before this)
ROOT_PREFIX = "upload:"  # a client's folder name never passes for a folder of the server's
ID_PREFIX = "id:"  # a root the client names by ``--root-id`` rather than its host and path
ROOT_HELP = (
    "the folder the files came from, as the client names it; its documents record it, and delete_missing deletes "
    "only documents of this root whose files were not sent"
)
KEEP_HELP = "files of the folder that could not be read where they are (delete_missing keeps their documents)"
MAX_DELETE_HELP = (
    "most documents delete_missing may delete (default STRATA_INDEXING__MAX_DELETE); over it, or over half of the "
    "root's documents, the upload is refused (409 delete-refused) and nothing is written"
)
PRESENT_HELP = (
    "a JSON array of the root's other file names: those sent in earlier requests of the same upload (a folder of "
    f"more than {MAX_FILES} files is sent in several); with delete_missing their documents are kept, like keep's"
)
FORCE_HELP = "delete_missing may delete over max_delete or half of the root's documents (never all of an empty root's)"
FOLDER_PREFIX = "strata-upload-"

T = TypeVar("T")


def root_name(root: str, recorded: Callable[[], Collection[str]] = frozenset) -> str:
    """The root an upload's documents record for the folder the client named: ``upload:`` and its name, so no
    client's name passes for a folder of the server's. But a ``--root-id`` naming a local root ``recorded`` in the
    kb (a folder indexed by a local ``strata index``, the absolute path its documents record) is that root
    itself: the kb is continued through the service, its documents updated and deleted as a local run would.
    ``recorded()`` gives the roots of the kb written to (by a key that may write it) and no other, so no key can
    claim another kb's folder."""
    local = root.removeprefix(ID_PREFIX) if root.startswith(ID_PREFIX) else ""
    if os.path.isabs(local) and local in recorded():
        return local
    return ROOT_PREFIX + root


def too_many_files() -> Problem:
    """The answer to a request of more than ``MAX_FILES`` files."""
    return Problem(
        413,
        f"an upload request holds at most {MAX_FILES} files: send more in several requests, the last one with "
        "delete_missing and the names sent before in its 'present' part (strata index --server does)",
        title="Too Many Files",
        slug="too-many-files",
    )


def present_names(part: UploadFile | None) -> list[str]:
    """The names of the ``present`` part (a JSON array of relative names), each checked as a file name is; a
    422 naming what is wrong (blocking I/O: run it in a worker thread)."""
    if part is None:
        return []
    part.file.seek(0)
    try:
        names = json.load(part.file)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Problem(
            422, f"the 'present' part is not a JSON array of file names: {exc}", title="Invalid Input"
        ) from exc
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise Problem(422, "the 'present' part must be a JSON array of file names", title="Invalid Input")
    if len(names) > MAX_PRESENT:
        raise Problem(422, f"the 'present' part names {len(names)} files: at most {MAX_PRESENT}", title="Invalid Input")
    return [str(relative_name(name)) for name in names]


class UploadRoute(APIRoute):
    """Answers Starlette's refusal of a multipart body past the route's ``max_files`` (a 400 in its own words,
    ``Too many files``) as ``too_many_files``: the request is refused naming strata's limit and the remedy."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def handler(request: Request) -> Response:
            try:
                return await handle(request)
            except StarletteHTTPException as exc:
                if exc.status_code == 400 and str(exc.detail).startswith("Too many files"):
                    raise too_many_files() from exc
                raise

        return handler


def shown(name: str) -> str:
    """``name`` as an answer quotes it: escaped (``repr``) and cut to ``NAME_SHOWN`` characters."""
    return repr(name[:NAME_SHOWN] + "…") if len(name) > NAME_SHOWN else repr(name)


# the names check_name lets through, for the OpenAPI document (a path parameter's ``pattern``): no control
# character (category Cc: U+0000-U+001F, U+007F-U+009F); a surrogate (Cs) cannot reach a path, decoded as UTF-8
NAME_PATTERN = r"^[^\x00-\x1F\x7F-\x9F]*$"


def check_name(name: str, what: str = "file name") -> None:
    """A 422 naming ``name`` when it is over ``MAX_NAME_CHARS`` (cut, never a megabyte of it back) or holds a
    control character (escaped). Answers about a name that passed quote it whole: at most 1,024 characters."""
    if len(name) > MAX_NAME_CHARS:
        raise Problem(
            422, f"the {what} {shown(name)} has {len(name)} characters: at most {MAX_NAME_CHARS}", title="Invalid Input"
        )
    control = next((ch for ch in name if unicodedata.category(ch) in ("Cc", "Cs")), None)
    if control is not None:
        raise Problem(
            422, f"the {what} {name!r} holds the control character U+{ord(control):04X}", title="Invalid Input"
        )


def relative_name(filename: str | None) -> PurePosixPath:
    """The upload's name as a relative path inside the upload folder (no ``..``, no absolute paths)."""
    check_name(filename or "")
    parts = [p for p in PurePosixPath((filename or "").replace("\\", "/")).parts if p not in ("/", ".")]
    if not parts or ".." in parts:
        raise Problem(422, f"unusable file name {filename!r}: give a relative path without '..'", title="Invalid Input")
    name = PurePosixPath(*parts)
    if any(len(part.encode()) > MAX_PART_BYTES for part in parts) or len(str(name).encode()) > MAX_PATH_BYTES:
        raise Problem(
            422,
            f"the file name {str(name)!r} is too long: at most {MAX_PART_BYTES} bytes (UTF-8) per folder or "
            f"file name and {MAX_PATH_BYTES} in all",
            title="Invalid Input",
        )
    return name


def checked_names(files: Sequence[UploadFile]) -> list[PurePosixPath]:
    """Each upload's relative name; a name sent twice, or one that is a folder of another, is a 422."""
    names: dict[PurePosixPath, None] = {}  # ordered, with set lookups
    folders: dict[PurePosixPath, PurePosixPath] = {}  # folder -> the first file inside it
    for upload in files:
        name = relative_name(upload.filename)
        if name in names:
            raise Problem(422, f"the file {str(name)!r} was sent twice", title="Invalid Input")
        if name in folders:
            raise _folder_clash(name, folders[name])
        clash = next((parent for parent in name.parents if parent in names), None)
        if clash is not None:
            raise _folder_clash(clash, name)
        names[name] = None
        folders.update((parent, name) for parent in name.parents if parent not in folders)
    return list(names)


def _folder_clash(file: PurePosixPath, inside: PurePosixPath) -> Problem:
    return Problem(
        422,
        f"the file {str(file)!r} is also the folder of the file {str(inside)!r}: one name cannot be both",
        title="Invalid Input",
    )


def index_in_temporary_folder(files: Sequence[UploadFile], index: Callable[[Path], T]) -> T:
    """``index(folder)`` of a new temporary folder holding the uploads; the folder is removed whatever happens
    (blocking I/O: run it in one worker thread). Its name holds this process's pid, so that the folders of a
    worker killed mid-upload are found and removed (``remove_orphaned_folders``)."""
    remove_orphaned_folders()
    with tempfile.TemporaryDirectory(prefix=f"{FOLDER_PREFIX}{os.getpid()}-") as folder:
        save_all(files, Path(folder))
        return index(Path(folder))


def remove_orphaned_folders(parent: Path | None = None) -> list[Path]:
    """Removes the upload folders of processes that no longer run (a worker killed mid-upload, by uvicorn's
    supervisor or the OOM killer), under ``parent`` (the temporary directory); returns them. A folder of
    another user, or whose name carries no pid, is left alone."""
    parent = parent or Path(tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        pid = entry.name[len(FOLDER_PREFIX) :].split("-", 1)[0]
        if not entry.name.startswith(FOLDER_PREFIX) or not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            mine = entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_uid == os.getuid()
        except OSError:
            continue
        if mine and process_gone(int(pid)):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


def save_all(files: Sequence[UploadFile], folder: Path) -> None:
    """Writes every upload under ``folder`` by its relative name, all names checked first (blocking I/O)."""
    for upload, name in zip(files, checked_names(files)):
        target = folder.joinpath(*name.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        upload.file.seek(0)
        with target.open("wb") as out:
            shutil.copyfileobj(upload.file, out, _CHUNK)
