"""API keys and what each may do.

Keys come from ``STRATA_API__KEYS`` (JSON), ``STRATA_API__KEYS_FILE`` (the
same JSON in a file) and the single all-access ``STRATA_API__API_KEY``. A key
reads only its knowledge bases (``"*"`` = all) and writes only with
``write: true``. Without any key the service is open, and binds to loopback
only (see ``strata.cli.serve``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from pydantic import TypeAdapter, ValidationError

from strata.config import ApiKeyGrant, ApiSettings, ConfigError

ALL_KBS = "*"


@dataclass(frozen=True)
class Principal:
    """The caller: the kbs it may read (None = every kb) and whether it may write."""

    kbs: frozenset[str] | None
    write: bool
    name: str = "anonymous"

    def can_read(self, kb_id: str) -> bool:
        return self.kbs is None or kb_id in self.kbs

    def can_write(self, kb_id: str) -> bool:
        return self.write and self.can_read(kb_id)

    def search_scope(self, requested: Sequence[str] | None) -> list[str] | None:
        """The kb ids to search: the requested ones (all readable) or every allowed kb (None = all).

        Raises ``KeyError`` with the first requested kb the caller may not read.
        """
        if requested:
            for kb_id in requested:
                if not self.can_read(kb_id):
                    raise KeyError(kb_id)
            return list(dict.fromkeys(requested))
        return None if self.kbs is None else sorted(self.kbs)


OPEN = Principal(kbs=None, write=True, name="open")


class KeyRing:
    """The configured keys; ``lookup`` compares against every key in constant time."""

    def __init__(self, grants: Mapping[str, ApiKeyGrant]) -> None:
        self._entries = [(_digest(key), _principal(key, grant)) for key, grant in grants.items()]

    @classmethod
    def from_settings(cls, settings: ApiSettings) -> KeyRing:
        grants: dict[str, ApiKeyGrant] = {}
        if settings.keys_file is not None:
            grants.update(_read_keys_file(settings.keys_file))
        grants.update(settings.keys)
        admin = settings.api_key.get_secret_value()
        if admin:
            grants[admin] = ApiKeyGrant(kbs=[ALL_KBS], write=True)
        return cls(grants)

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    def lookup(self, token: str) -> Principal | None:
        """The key's principal or None; every stored key is compared, so timing says nothing."""
        wanted = _digest(token)
        found = None
        for digest, principal in self._entries:
            if hmac.compare_digest(digest, wanted):
                found = principal
        return found


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _principal(key: str, grant: ApiKeyGrant) -> Principal:
    kbs = None if ALL_KBS in grant.kbs else frozenset(grant.kbs)
    return Principal(kbs=kbs, write=grant.write, name=f"key-{_digest(key).hex()[:8]}")


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def _read_keys_file(path: Path) -> dict[str, ApiKeyGrant]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return TypeAdapter(dict[str, ApiKeyGrant]).validate_python(data)
    except (OSError, ValueError, ValidationError) as exc:
        raise ConfigError(f"STRATA_API__KEYS_FILE: cannot read keys from {str(path)!r}: {exc}") from None
