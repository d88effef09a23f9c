"""API keys and what each may do.

Keys come from ``STRATA_API__KEYS`` (JSON), ``STRATA_API__KEYS_FILE`` (the
same JSON in a file) and the single all-access ``STRATA_API__API_KEY``. A key
reads only its knowledge bases (``"*"`` = all), writes only with
``write: true`` and reads ``/metrics`` only with ``metrics: true`` (or with
full access). Without any key the service is open, and binds to loopback
only (see ``strata.cli.serve``).

A key that no client could send (empty, spaces at either end, characters a
header cannot carry) or one defined twice (in one source or across them) is a
``ConfigError`` naming the key by where it was defined ("STRATA_API__KEYS key
#3 is the same key as STRATA_API__KEYS_FILE (keys.json) key #1"), never by its
value; a short key is a warning. Keys are read by ``strata.key_grants``, whose
errors name positions too.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from strata.config import ENV_PREFIX, ApiKeyGrant, ApiSettings, ConfigError
from strata.errors import KeyGrantError
from strata.key_grants import read_grants

logger = logging.getLogger(__name__)

ALL_KBS = "*"
MIN_KEY_CHARS = 16
UNAUTHORIZED = "send a valid key as 'Authorization: Bearer <key>'"
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="strata"'}


@dataclass(frozen=True)
class Principal:
    """The caller: the kbs it may read (None = every kb), whether it may write and read the metrics."""

    kbs: frozenset[str] | None
    write: bool
    name: str = "anonymous"
    metrics: bool = False

    def can_read(self, kb_id: str) -> bool:
        return self.kbs is None or kb_id in self.kbs

    def can_write(self, kb_id: str) -> bool:
        return self.write and self.can_read(kb_id)

    @property
    def can_read_metrics(self) -> bool:
        """Metrics show every tenant's activity: a ``metrics`` grant, or full access (every kb, write)."""
        return self.metrics or (self.kbs is None and self.write)

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


@dataclass(frozen=True)
class _Defined:
    """One configured key and where it was defined (the name errors and warnings use)."""

    where: str
    key: str
    grant: ApiKeyGrant


class KeyRing:
    """The configured keys; ``lookup`` compares against every key in constant time."""

    def __init__(self, grants: dict[str, ApiKeyGrant]) -> None:
        self._entries = [(_digest(key), _principal(key, grant)) for key, grant in grants.items()]

    @classmethod
    def from_settings(cls, settings: ApiSettings) -> KeyRing:
        """The keys of ``settings``; raises ``ConfigError`` for a key that could never match or is defined twice."""
        grants: dict[str, _Defined] = {}
        for defined in _defined_keys(settings):
            _check_key(defined)
            first = grants.get(defined.key)
            if first is not None:
                raise ConfigError(f"{defined.where} is the same key as {first.where}: define each key once")
            grants[defined.key] = defined
        return cls({key: defined.grant for key, defined in grants.items()})

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
    return Principal(kbs=kbs, write=grant.write, name=f"key-{_digest(key).hex()[:8]}", metrics=grant.metrics)


def _defined_keys(settings: ApiSettings) -> list[_Defined]:
    """Every configured key in order: the keys file's, ``STRATA_API__KEYS``', then the full-access key."""
    defined: list[_Defined] = []
    if settings.keys_file is not None:
        source = f"{ENV_PREFIX}API__KEYS_FILE ({settings.keys_file})"
        pairs = _read_keys_file(settings.keys_file)
        defined += [_Defined(f"{source} key #{n}", key, grant) for n, (key, grant) in enumerate(pairs, 1)]
    items = enumerate(settings.keys.items(), 1)
    defined += [_Defined(f"{ENV_PREFIX}API__KEYS key #{n}", key, grant) for n, (key, grant) in items]
    admin = settings.api_key.get_secret_value()
    if admin:
        defined.append(_Defined(f"{ENV_PREFIX}API__API_KEY", admin, ApiKeyGrant(kbs=[ALL_KBS], write=True)))
    return defined


def _check_key(defined: _Defined) -> None:
    """Refuses a key no client can send as ``Authorization: Bearer <key>``; warns for a short one."""
    key = defined.key
    if not key:
        raise ConfigError(f"{defined.where} is empty: no request can send it")
    if key != key.strip():
        raise ConfigError(f"{defined.where} starts or ends with whitespace, which HTTP drops: it could never match")
    if not all(" " <= ch <= "~" for ch in key):
        raise ConfigError(
            f"{defined.where} has characters other than printable ASCII, which a header cannot carry: "
            "it could never match"
        )
    if len(key) < MIN_KEY_CHARS:
        logger.warning("%s has %d characters: use at least %d random ones", defined.where, len(key), MIN_KEY_CHARS)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def _read_keys_file(path: Path) -> list[tuple[str, ApiKeyGrant]]:
    """The file's keys in order; the errors name a key by its position (``read_grants``), never by its value."""
    where = f"{ENV_PREFIX}API__KEYS_FILE ({path})"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:  # its message names the file, not the text
        raise ConfigError(f"{where}: cannot read keys: {exc}") from None
    except UnicodeDecodeError as exc:  # its message would quote a byte of the text
        raise ConfigError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    try:
        return list(read_grants(text).items())
    except KeyGrantError as exc:
        raise ConfigError(f"{where}: {exc}") from None
