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

import os
import shutil
import tempfile
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import TypeVar

from fastapi import UploadFile

from strata.api.problems import Problem
from strata.stores.lease import process_gone

_CHUNK = 1024 * 1024
MAX_NAME_CHARS = 1024
NAME_SHOWN = 80  # an answer quotes this much of a name over MAX_NAME_CHARS: enough to find the file
MAX_PART_BYTES = 255  # NAME_MAX of Linux and macOS file systems, in UTF-8 bytes
MAX_PATH_BYTES = 3072  # below PATH_MAX (4096) with room for the temporary folder
MAX_KEPT = 10_000
ROOT_PREFIX = "upload:"  # a client's folder name never passes for a folder of the server's
ROOT_HELP = (
    "the folder the files came from, as the client names it; its documents record it, and delete_missing deletes "
    "only documents of this root whose files were not sent"
)
KEEP_HELP = "files of the folder that could not be read where they are (delete_missing keeps their documents)"
MAX_DELETE_HELP = (
    "most documents delete_missing may delete (default STRATA_INDEXING__MAX_DELETE); over it, or over half of the "
    "root's documents, the upload is refused (409 delete-refused) and nothing is written"
)
FORCE_HELP = "delete_missing may delete over max_delete or half of the root's documents (never all of an empty root's)"
FOLDER_PREFIX = "strata-upload-"

T = TypeVar("T")


def root_name(root: str) -> str:
    """The root an upload's documents record for the folder the client named."""
    return ROOT_PREFIX + root


def shown(name: str) -> str:
    """``name`` as an answer quotes it: escaped (``repr``) and cut to ``NAME_SHOWN`` characters."""
    return repr(name[:NAME_SHOWN] + "…") if len(name) > NAME_SHOWN else repr(name)


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
