"""``strata milvus-user create``: the Milvus user strata runs as, with only the privileges strata uses.

strata needs no cluster rights: it creates, loads, indexes, writes, searches and
drops its own collections in the ``default`` database. The role ``strata_rw``
gets exactly that (``GRANTS``), and the user named by ``STRATA_MILVUS__TOKEN``
(``user:password``) gets the role. The command logs in as an administrator
whose token (``root:<password>``) it reads from ``MILVUS_ADMIN_TOKEN``, never
from the command line. Safe to run twice: an existing role, grant or user is
kept (an existing user's password is not changed).

Milvus Lite has no users or roles (``milvus-lite server`` answers every RBAC
call with UNIMPLEMENTED): the command refuses it with one line.
"""

from __future__ import annotations

import argparse
import os
from typing import Protocol

from pymilvus.exceptions import MilvusException

from strata.config import Settings
from strata.errors import ConfigError, StoreError

ROLE = "strata_rw"
DATABASE = "default"
ADMIN_TOKEN_VARIABLE = "MILVUS_ADMIN_TOKEN"

# The built-in privilege groups strata's role gets, with the privileges of each that strata uses (Milvus's
# "Privilege Group" page lists each group's full content), granted on every collection ("*") of DATABASE.
GROUPS: dict[str, frozenset[str]] = {
    "CollectionReadWrite": frozenset(
        {
            "Search",
            "Query",
            "Insert",
            "Upsert",
            "Delete",
            "Flush",
            "Load",
            "CreateIndex",
            "IndexDetail",
            "CreatePartition",
            "ShowPartitions",
            "HasPartition",
            "DescribeCollection",
            "GetStatistics",
            "GetLoadState",
        }
    ),
    "DatabaseReadOnly": frozenset({"ShowCollections", "DescribeDatabase"}),
}
# Beyond the groups: a kb of the `collection` isolation level is a collection strata creates, and drops with the kb.
PRIVILEGES = ("CreateCollection", "DropCollection")
GRANTS: tuple[str, ...] = (*GROUPS, *PRIVILEGES)

# The privilege behind each pymilvus call strata makes (tests/cli/test_milvus_user.py finds every call in the package
# and fails on one missing here). None: a call Milvus checks for no privilege.
PRIVILEGE_OF_CALL: dict[str, str | None] = {
    "search": "Search",
    "hybrid_search": "Search",
    "query": "Query",
    "query_iterator": "Query",
    "insert": "Insert",
    "upsert": "Upsert",
    "delete": "Delete",
    "flush": "Flush",
    "load_collection": "Load",
    "create_index": "CreateIndex",
    "list_indexes": "IndexDetail",
    "describe_index": "IndexDetail",
    "create_partition": "CreatePartition",
    "list_partitions": "ShowPartitions",
    "has_partition": "HasPartition",
    "describe_collection": "DescribeCollection",
    "has_collection": "DescribeCollection",
    "get_collection_stats": "GetStatistics",
    "get_partition_stats": "GetStatistics",
    "get_load_state": "GetLoadState",
    "list_collections": "ShowCollections",
    "create_collection": "CreateCollection",
    "drop_collection": "DropCollection",
    "get_server_version": None,
}


def granted_privileges() -> frozenset[str]:
    """Every privilege strata's role holds through ``GRANTS``."""
    return frozenset(PRIVILEGES).union(*GROUPS.values())


class RbacClient(Protocol):
    """The part of pymilvus's ``MilvusClient`` this command uses."""

    def list_roles(self, **kwargs: object) -> list[str]: ...
    def create_role(self, role_name: str, **kwargs: object) -> None: ...
    def grant_privilege_v2(
        self, role_name: str, privilege: str, collection_name: str, db_name: str | None = None, **kwargs: object
    ) -> None: ...
    def list_users(self, **kwargs: object) -> list[str]: ...
    def create_user(self, user_name: str, password: str, **kwargs: object) -> None: ...
    def grant_role(self, user_name: str, role_name: str, **kwargs: object) -> None: ...


def ensure_user(client: RbacClient, user: str, password: str, role: str = ROLE) -> list[str]:
    """Makes ``role`` with ``GRANTS`` and ``user`` holding it; returns what it did, one line per step."""
    steps = []
    if role not in client.list_roles():
        client.create_role(role)
        steps.append(f"created role {role}")
    for privilege in GRANTS:
        client.grant_privilege_v2(role, privilege, "*", db_name=DATABASE)
    steps.append(f"granted {', '.join(GRANTS)} on every collection of database {DATABASE} to {role}")
    if user in client.list_users():
        steps.append(f"user {user} exists: its password is unchanged")
    else:
        client.create_user(user, password)
        steps.append(f"created user {user}")
    client.grant_role(user, role)
    steps.append(f"user {user} holds role {role}")
    return steps


def strata_credentials(token: str) -> tuple[str, str]:
    """The user and password of ``STRATA_MILVUS__TOKEN``; refuses root and a token without a user."""
    user, colon, password = token.partition(":")
    if not colon or not user or not password:
        raise ConfigError("STRATA_MILVUS__TOKEN must be <user>:<password> of the user to create")
    if user == "root":
        raise ConfigError("STRATA_MILVUS__TOKEN names root: give strata its own user (e.g. strata:<password>)")
    return user, password


def cmd_milvus_user_create(args: argparse.Namespace, settings: Settings) -> int:
    from strata.stores.milvus_connection import connect

    user, password = strata_credentials(settings.milvus.token.get_secret_value())
    admin = os.environ.get(ADMIN_TOKEN_VARIABLE, "")
    if not admin:
        raise ConfigError(f"set {ADMIN_TOKEN_VARIABLE} to an administrator's token (root:<password>)")
    client, lite = connect(settings.milvus.model_copy(update={"token": type(settings.milvus.token)(admin)}))
    try:
        if lite:
            raise ConfigError("Milvus Lite has no users or roles: `strata milvus-user create` is for a Milvus server")
        steps = ensure_user(client, user, password, role=args.role)
    except MilvusException as exc:
        raise StoreError(f"Milvus refused an RBAC call: {exc}") from exc
    finally:
        client.close()
    for step in steps:
        print(step)
    return 0
