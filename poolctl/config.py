"""Where poolctl finds the server and the token: the environment first, then a TOML file.

POOLCTL_URL, POOLCTL_TOKEN, POOLCTL_TENANT, POOLCTL_POOL   (the environment wins)
POOLCTL_CONFIG, default ~/.config/poolctl/config.toml    (keys: url, token, tenant, pool,
                                                          timeout)
"""

from __future__ import annotations

import os
import stat
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PATH = Path("~/.config/poolctl/config.toml")
DEFAULT_TIMEOUT_S = 30.0
KEYS = ("url", "token", "tenant", "pool", "timeout")


class UsageError(Exception):
    """Something poolctl cannot do as asked, found before (or instead of) asking the server:
    bad flags, a bad manifest, a file in the way. Exit code 1."""


class ConfigError(UsageError):
    """Missing or unreadable configuration."""


@dataclass(frozen=True)
class Config:
    url: str  # the server's root, e.g. http://127.0.0.1:8000 (no /api/v1)
    token: str
    tenant: str = ""  # default tenant of `submit` and `leases reserve`
    pool: str = ""  # default pool of the same
    timeout: float = DEFAULT_TIMEOUT_S

    @property
    def api(self) -> str:
        return f"{self.url}/api/v1"


def config_path(environ) -> Path:
    return Path(environ.get("POOLCTL_CONFIG") or DEFAULT_PATH).expanduser()


def read_file(path: Path) -> dict:
    """The file's known keys; {} when it does not exist."""
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(unknown)} (known: {', '.join(KEYS)})")
    if data.get("token") and path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        # as ssh does for keys: a token others can read is a leaked token
        print(f"poolctl: warning: {path} holds a token and others may read it", file=sys.stderr)
    return data


def normalise_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if url.endswith("/api/v1"):  # either form is accepted
        url = url[: -len("/api/v1")]
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"the server URL must start with http:// or https://, not {url!r}")
    return url


def load(environ=None) -> Config:
    """The configuration, or ConfigError naming what is missing and where to set it."""
    environ = os.environ if environ is None else environ
    path = config_path(environ)
    values = read_file(path)
    for key in ("url", "token", "tenant", "pool"):
        if environ.get(f"POOLCTL_{key.upper()}"):
            values[key] = environ[f"POOLCTL_{key.upper()}"]
    for key in ("url", "token"):
        if not isinstance(values.get(key), str) or not values.get(key):
            raise ConfigError(f'no {key}: set POOLCTL_{key.upper()} or `{key} = "…"` in {path}')
    try:
        timeout = float(values.get("timeout", DEFAULT_TIMEOUT_S))
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: timeout must be a number of seconds") from None
    return Config(
        url=normalise_url(values["url"]),
        token=values["token"].strip(),
        tenant=str(values.get("tenant") or ""),
        pool=str(values.get("pool") or ""),
        timeout=timeout,
    )
