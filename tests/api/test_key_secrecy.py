"""API keys never appear in what strata prints: every misconfiguration of keys stops ``strata serve`` (and any
command that loads the settings) with a message that names the key by its position, never by its value.

Each case runs the installed ``strata`` in a process of its own, as an operator would, and searches all it
printed for the key as written, upper-cased (how a variable's name is shown) and lower-cased.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.processes import run_strata, strata_env

pytestmark = [pytest.mark.slow, pytest.mark.cost(20)]  # strata in processes of its own

KEY = "Tenant-A-Secret-Key-7f3e9c01"  # mixed case, so that its upper- and lower-case forms differ from it
OTHER = "Tenant-B-Secret-Key-0a41d2b6"
SHORT = "Short-Key-9x"  # under 16 characters: a warning


def grants(*pairs: str) -> str:
    """A JSON object written by hand, so that a key may appear twice (json.dumps of a dict cannot)."""
    return "{" + ", ".join(pairs) + "}"


def keys_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "keys.json"
    path.write_text(text, encoding="utf-8")
    return str(path)


def strata_toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "strata.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


# (case, variables for the given tmp_path, what the one error line must say). Every command refuses these:
# they are wrong in the settings themselves.
SETTINGS_CASES: list[tuple[str, Callable[[Path], dict[str, str]], str]] = [
    (
        "a typo in a grant field",
        lambda _: {"STRATA_API__KEYS": grants(f'"{KEY}": {{"kbz": ["alpha"]}}')},
        "STRATA_API__KEYS: key #1: 'kbz' is not a grant field (kbs, write, metrics); did you mean 'kbs'?",
    ),
    (
        "kbs of the wrong type",
        lambda _: {"STRATA_API__KEYS": grants(f'"{KEY}": {{"kbs": 5}}')},
        "STRATA_API__KEYS: key #1: 'kbs': Input should be a valid list (got 5)",
    ),
    (
        "a grant that is text",
        lambda _: {"STRATA_API__KEYS": grants(f'"alpha": "{KEY}"')},
        "STRATA_API__KEYS: key #1: its grant must be an object",
    ),
    (
        "a key inside another key's grant",
        lambda _: {"STRATA_API__KEYS": grants(f'"{OTHER}": {{"kbs": ["beta"], "{KEY}": {{"kbs": ["alpha"]}}}}')},
        "STRATA_API__KEYS: key #1: a field (a key inside another key's grant? check the braces) is not a grant field",
    ),
    (
        "STRATA_API__KEYS that is not JSON",
        lambda _: {"STRATA_API__KEYS": f'{{"{KEY}": {{"kbs": ["alpha"]}}'},
        "STRATA_API__KEYS: not valid JSON",
    ),
    (
        "a key twice in STRATA_API__KEYS",
        lambda _: {
            "STRATA_API__KEYS": grants(
                f'"{KEY}": {{"kbs": ["alpha"]}}',
                f'"{OTHER}": {{"kbs": ["beta"]}}',
                f'"{KEY}": {{"kbs": ["*"], "write": true}}',
            )
        },
        "STRATA_API__KEYS: key #3 is the same key as key #1: define each key once",
    ),
    (
        "a key twice in STRATA_API given whole",
        lambda _: {
            "STRATA_API": '{{"keys": {}}}'.format(
                grants(f'"{KEY}": {{"kbs": ["alpha"]}}', f'"{KEY}": {{"kbs": ["*"], "write": true}}')
            )
        },
        "STRATA_API: keys: key #2 is the same key as key #1",
    ),
    (
        "a key in a variable's name",
        lambda _: {f"STRATA_API__KEYS__{KEY}__KBS": '["alpha"]'},
        "a variable STRATA_API__KEYS__… would put an API key in its name",
    ),
    (
        "a key in a misspelt variable's name",
        lambda _: {f"STRATA_API__KEY__{KEY}__KBS": '["alpha"]'},
        "unknown setting STRATA_API__KEY__…",
    ),
    (
        "a key twice in strata.toml",
        lambda tmp: {
            "STRATA_CONFIG": strata_toml(
                tmp, f'[api.keys."{KEY}"]\nkbs = ["alpha"]\n\n[api.keys."{KEY}"]\nkbs = ["*"]\nwrite = true\n'
            )
        },
        "Cannot declare … (a table or key defined twice; at line 4",
    ),
    (
        "a typo in a grant in strata.toml",
        lambda tmp: {"STRATA_CONFIG": strata_toml(tmp, f'[api.keys."{KEY}"]\nkbz = ["alpha"]\n')},
        "STRATA_API__KEYS: key #1: 'kbz' is not a grant field",
    ),
]

# Wrong only once the keys of every source are put together: `strata serve` reads them all before it starts.
SERVE_CASES: list[tuple[str, Callable[[Path], dict[str, str]], str]] = [
    (
        "a keys file that is not JSON",
        lambda tmp: {"STRATA_API__KEYS_FILE": keys_file(tmp, f'{{"{KEY}": {{"kbs": [')},
        "STRATA_API__KEYS_FILE ({file}): not valid JSON",
    ),
    (
        "a bad grant in the keys file",
        lambda tmp: {
            "STRATA_API__KEYS_FILE": keys_file(
                tmp, grants(f'"{OTHER}": {{}}', f'"{KEY}": {{"kbs": "alpha", "writ": true}}')
            )
        },
        "STRATA_API__KEYS_FILE ({file}): key #2: 'kbs': Input should be a valid list; 'writ' is not a grant field",
    ),
    (
        "a key twice in the keys file",
        lambda tmp: {
            "STRATA_API__KEYS_FILE": keys_file(
                tmp, grants(f'"{KEY}": {{"kbs": ["alpha"]}}', f'"{KEY}": {{"kbs": ["*"]}}')
            )
        },
        "STRATA_API__KEYS_FILE ({file}): key #2 is the same key as key #1",
    ),
    (
        "a key in STRATA_API__KEYS and in the keys file",
        lambda tmp: {
            "STRATA_API__KEYS_FILE": keys_file(tmp, grants(f'"{OTHER}": {{}}', f'"{KEY}": {{"kbs": ["alpha"]}}')),
            "STRATA_API__KEYS": grants(f'"{KEY}": {{"kbs": ["*"], "write": true}}'),
        },
        "STRATA_API__KEYS key #1 is the same key as STRATA_API__KEYS_FILE ({file}) key #2",
    ),
    (
        "STRATA_API__API_KEY given as a tenant's key too",
        lambda _: {
            "STRATA_API__KEYS": grants(f'"{OTHER}": {{}}', f'"{KEY}": {{"kbs": ["alpha"]}}'),
            "STRATA_API__API_KEY": KEY,
        },
        "STRATA_API__API_KEY is the same key as STRATA_API__KEYS key #2",
    ),
    (
        "a key a header cannot carry",
        lambda _: {"STRATA_API__KEYS": grants(f'"{KEY} ": {{"kbs": ["alpha"]}}')},
        "STRATA_API__KEYS key #1 starts or ends with whitespace",
    ),
]


def assert_silent_about_keys(printed: str) -> None:
    for key in (KEY, OTHER, SHORT):
        for form in {key, key.upper(), key.lower()}:
            assert form not in printed, f"a key ({form!r}) was printed:\n{printed}"


def refused(args: list[str], tmp_path: Path, variables: dict[str, str]) -> str:
    """What ``strata ARGS`` printed, after checking that it stopped with a configuration error."""
    done = run_strata(args, strata_env(tmp_path / "data", **variables), timeout=120)
    printed = done.stdout + done.stderr
    assert done.returncode != 0, printed
    assert_silent_about_keys(printed)
    return printed


COMMANDS = [["serve", "--port", "1"], ["query", "lighthouse keeper"], ["db", "current"]]


@pytest.mark.parametrize(("case", "variables", "expected"), SETTINGS_CASES, ids=[c[0] for c in SETTINGS_CASES])
@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_bad_key_setting_stops_every_command_without_showing_the_key(
    case: str, variables: Callable[[Path], dict[str, str]], expected: str, command: list[str], tmp_path: Path
) -> None:
    printed = refused(command, tmp_path, variables(tmp_path))
    assert "strata: configuration error: " in printed and expected in printed, printed


@pytest.mark.parametrize(("case", "variables", "expected"), SERVE_CASES, ids=[c[0] for c in SERVE_CASES])
def test_keys_that_clash_or_cannot_be_read_stop_serve_naming_positions(
    case: str, variables: Callable[[Path], dict[str, str]], expected: str, tmp_path: Path
) -> None:
    printed = refused(["serve", "--port", "1"], tmp_path, variables(tmp_path))
    assert expected.format(file=tmp_path / "keys.json") in printed, printed


def test_serve_warns_of_a_short_key_by_its_position(tmp_path: Path) -> None:
    """Keys that are fine get as far as serve's own refusals: its warnings name positions too."""
    variables = {"STRATA_API__KEYS": json.dumps({KEY: {"kbs": ["alpha"]}, SHORT: {"kbs": ["beta"]}})}
    printed = refused(["serve", "--port", "1", "--workers", "2"], tmp_path, variables)  # refused on Milvus Lite
    assert "STRATA_API__KEYS key #2 has 12 characters" in printed and "needs a Milvus server" in printed, printed
