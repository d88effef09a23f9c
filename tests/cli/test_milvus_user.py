"""``strata milvus-user create``: the Milvus role and user strata runs as (docs/deploy.md, "Least privilege").

Milvus Lite's server answers every RBAC call (CreateRole, SelectRole, OperatePrivilegeV2, CreateCredential,
OperateUserRole, ListCredUsers) with UNIMPLEMENTED, so the grants cannot be exercised against a server here.
What is tested: the plan against a client that keeps roles, grants and users as Milvus does; that every
Milvus call in the package needs a privilege the role holds; the command's refusals.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from strata.cli.milvus_user import (
    DATABASE,
    GRANTS,
    GROUPS,
    PRIVILEGE_OF_CALL,
    PRIVILEGES,
    ROLE,
    cmd_milvus_user_create,
    ensure_user,
    granted_privileges,
    strata_credentials,
)
from strata.config import load_settings
from strata.errors import ConfigError

PACKAGE = Path(__file__).resolve().parents[2] / "backend" / "strata"
LOCAL_METHODS = {"close", "prepare_index_params"}  # pymilvus methods that send nothing to the server


class RecordingMilvus:
    """Roles, grants and users as Milvus keeps them: a second create of the same name is an error there."""

    def __init__(self) -> None:
        self.roles: dict[str, set[tuple[str, str, str]]] = {}
        self.users: dict[str, str] = {}
        self.user_roles: dict[str, set[str]] = {}

    def list_roles(self, **kwargs: object) -> list[str]:
        return list(self.roles)

    def create_role(self, role_name: str, **kwargs: object) -> None:
        assert role_name not in self.roles, "role exists"
        self.roles[role_name] = set()

    def grant_privilege_v2(
        self, role_name: str, privilege: str, collection_name: str, db_name: str | None = None, **kwargs: object
    ) -> None:
        self.roles[role_name].add((privilege, collection_name, db_name or "default"))

    def list_users(self, **kwargs: object) -> list[str]:
        return list(self.users)

    def create_user(self, user_name: str, password: str, **kwargs: object) -> None:
        assert user_name not in self.users, "user exists"
        self.users[user_name] = password

    def grant_role(self, user_name: str, role_name: str, **kwargs: object) -> None:
        assert role_name in self.roles and user_name in self.users
        self.user_roles.setdefault(user_name, set()).add(role_name)


def test_the_user_gets_the_role_and_the_role_only_the_plans_grants() -> None:
    milvus = RecordingMilvus()
    steps = ensure_user(milvus, "strata", "s3cret-password")
    assert steps[0] == f"created role {ROLE}" and "created user strata" in steps
    assert milvus.users == {"strata": "s3cret-password"} and milvus.user_roles == {"strata": {ROLE}}
    assert milvus.roles[ROLE] == {(grant, "*", DATABASE) for grant in GRANTS}
    assert not {"Cluster_Admin", "ClusterAdmin", "DatabaseAdmin", "CollectionAdmin", "*"} & set(GRANTS)


def test_a_second_run_keeps_the_role_and_the_users_password() -> None:
    milvus = RecordingMilvus()
    ensure_user(milvus, "strata", "first-password")
    steps = ensure_user(milvus, "strata", "second-password")
    assert "user strata exists: its password is unchanged" in steps and not any("created" in s for s in steps)
    assert milvus.users == {"strata": "first-password"} and milvus.user_roles == {"strata": {ROLE}}


def _milvus_calls() -> set[str]:
    """Every pymilvus method the package calls, found in the modules that import pymilvus (this command aside:
    it runs as the administrator)."""
    calls: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        talks_to_milvus = path.name.startswith("milvus") or re.search(r"^(from|import) pymilvus", text, re.M)
        if path.name == "milvus_user.py" or not talks_to_milvus:
            continue
        calls |= set(re.findall(r"(?:call|_meta)\(\s*\"(\w+)\"", text))  # calls.call("x", _meta("x"
        calls |= set(re.findall(r"client\.(\w+)\(", text))  # self._client.x(, client.x( (not MilvusClient.x)
    return calls - LOCAL_METHODS


def test_every_milvus_call_of_the_package_is_covered_by_the_role() -> None:
    calls = _milvus_calls()
    assert {"search", "query", "upsert", "delete", "create_collection", "drop_collection", "list_collections"} <= calls
    unknown = calls - set(PRIVILEGE_OF_CALL)
    assert unknown == set(), f"add the privilege of {sorted(unknown)} to PRIVILEGE_OF_CALL (and GRANTS if needed)"
    needed = {PRIVILEGE_OF_CALL[call] for call in calls} - {None}
    assert needed <= granted_privileges(), sorted(needed - granted_privileges())


def test_the_groups_granted_are_milvus_built_in_groups_and_nothing_admin() -> None:
    assert set(GROUPS) == {"CollectionReadWrite", "DatabaseReadOnly"}  # names of Milvus's built-in groups
    assert set(PRIVILEGES) == {"CreateCollection", "DropCollection"}
    assert not any(p.startswith(("Create", "Drop")) for p in GROUPS["DatabaseReadOnly"])


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("root:Milvus", "names root"),
        ("strata", "must be <user>:<password>"),
        (":pw", "must be <user>:<password>"),
        ("strata:", "must be <user>:<password>"),
    ],
)
def test_the_token_must_name_a_user_of_its_own(token: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        strata_credentials(token)
    assert strata_credentials("strata:pw:with:colons") == ("strata", "pw:with:colons")


def test_the_command_needs_the_administrators_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MILVUS_ADMIN_TOKEN", raising=False)
    settings = load_settings(milvus={"uri": str(tmp_path / "milvus.db"), "token": "strata:pw"})
    with pytest.raises(ConfigError, match="set MILVUS_ADMIN_TOKEN"):
        cmd_milvus_user_create(argparse.Namespace(role=ROLE), settings)


@pytest.mark.integration
def test_milvus_lite_is_refused_with_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MILVUS_ADMIN_TOKEN", "root:Milvus")
    settings = load_settings(milvus={"uri": str(tmp_path / "milvus.db"), "token": "strata:pw"})
    with pytest.raises(ConfigError, match="Milvus Lite has no users or roles"):
        cmd_milvus_user_create(argparse.Namespace(role=ROLE), settings)
