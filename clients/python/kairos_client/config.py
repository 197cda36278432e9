"""Where a client finds its cluster, as the `kairos` CLI does.

First found wins: the arguments given to `Client`, then the environment (`KAIROS_CONTROLLERS`,
`KAIROS_TOKEN_FILE`, `KAIROS_TOKEN`, `KAIROS_CA`, `KAIROS_CERT`, `KAIROS_KEY`), then the CLI's
context (`context=` or `KAIROS_CONTEXT`, else the current one, in
`$XDG_CONFIG_HOME/kairos/config.toml` or `~/.config/kairos/config.toml`), then the defaults
(`127.0.0.1:7001`, `~/.config/kairos/token`). As with the CLI, a context's token and TLS files
go only with its own addresses: addresses given (or KAIROS_CONTROLLERS) that are not all the
current context's take nothing from it; a context named explicitly always applies.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from typing import List, Optional, Sequence

try:  # Python 3.11+
    import tomllib as _toml
except ModuleNotFoundError:  # pragma: no cover - older Pythons install tomli (pyproject.toml)
    import tomli as _toml  # type: ignore[no-redef]

#: The CLI's default controller address.
DEFAULT_CONTROLLER = "127.0.0.1:7001"


def config_dir() -> Optional[pathlib.Path]:
    """`$XDG_CONFIG_HOME/kairos`, else `~/.config/kairos` (None without either)."""
    xdg = os.environ.get("XDG_CONFIG_HOME")
    if xdg:
        return pathlib.Path(xdg) / "kairos"
    home = os.environ.get("HOME")
    return pathlib.Path(home) / ".config" / "kairos" if home else None


def _load_config() -> dict:
    """The CLI's contexts file, or {} where there is none."""
    directory = config_dir()
    path = directory / "config.toml" if directory else None
    if path is None or not path.exists():
        return {}
    with open(path, "rb") as f:
        try:
            return _toml.load(f)
        except _toml.TOMLDecodeError as e:
            raise ValueError(f"{path}: {e}") from None


def _selected(config: dict, name: Optional[str]) -> tuple:
    """(name, context dict) of context `name`, else the current one; (None, {}) when none is
    named. A named context that is not there is a ValueError."""
    wanted = name or config.get("current")
    if not wanted:
        return None, {}
    contexts = config.get("contexts", {})
    if wanted not in contexts:
        known = ", ".join(sorted(contexts)) or "none"
        raise ValueError(f'context "{wanted}" not found (known: {known})')
    return wanted, dict(contexts[wanted])


def load_context(name: Optional[str] = None) -> dict:
    """The CLI context named `name` (else KAIROS_CONTEXT, else the current one) as a dict, or
    {} when none is named. A named context that is not there is a ValueError."""
    return _selected(_load_config(), name or os.environ.get("KAIROS_CONTEXT"))[1]


def _context_for(named: Optional[str], given: Optional[List[str]]) -> tuple:
    """The context whose credentials go with `given` addresses (None: the context's own), as
    the CLI decides (`Config::resolve`): one named explicitly; else the current one, when no
    addresses are given or all of them are its own."""
    config = _load_config()
    if named or given is None:
        return _selected(config, named)
    try:
        name, ctx = _selected(config, None)
    except ValueError:  # a current context that is gone: the given addresses need none
        return None, {}
    own = [a.strip() for a in ctx.get("controllers", [])]
    if not all(a in own for a in given):
        return None, {}
    return name, ctx


@dataclass(frozen=True)
class Settings:
    """What a client connects with, resolved (`resolve`)."""

    addresses: List[str]
    token: str
    ca: Optional[str]
    cert: Optional[str]
    key: Optional[str]


def _split(addresses: Sequence[str] | str) -> List[str]:
    if isinstance(addresses, str):
        return [a.strip() for a in addresses.split(",") if a.strip()]
    return [a.strip() for a in addresses if a.strip()]


def _read(path: str) -> str:
    full = os.path.expanduser(path)
    try:
        with open(full, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as e:
        raise ValueError(f"reading the API token from {full}: {e.strerror}") from None
    if not token:
        raise ValueError(f"the token file {full} is empty")
    return token


def resolve(
    addresses: Optional[Sequence[str] | str] = None,
    token: Optional[str] = None,
    token_file: Optional[str] = None,
    ca: Optional[str] = None,
    cert: Optional[str] = None,
    key: Optional[str] = None,
    context: Optional[str] = None,
) -> Settings:
    """The addresses, token and TLS files a client uses, in the CLI's order (module doc)."""
    env = os.environ.get
    found = addresses if addresses is not None else env("KAIROS_CONTROLLERS")
    given = _split(found) if found else None
    if given == []:
        raise ValueError("addresses: at least one controller address (HOST:PORT) is needed")
    name, ctx = _context_for(context or env("KAIROS_CONTEXT"), given)
    own = _split(ctx["controllers"]) if ctx.get("controllers") else None
    resolved = given or own or [DEFAULT_CONTROLLER]
    if token:
        secret = token.strip()
    elif token_file or env("KAIROS_TOKEN_FILE"):
        secret = _read(token_file or env("KAIROS_TOKEN_FILE", ""))
    elif env("KAIROS_TOKEN", "").strip():
        secret = env("KAIROS_TOKEN", "").strip()
    elif ctx.get("token_file"):
        path = os.path.expanduser(ctx["token_file"])
        if not os.path.exists(path):
            raise ValueError(
                f'context "{name}": its token file {path} is gone; forget the context with '
                f"`kairos context delete {name}` (or choose another: `kairos context use NAME`, "
                "context=, token_file=)"
            )
        secret = _read(path)
    else:
        directory = config_dir()
        default = directory / "token" if directory else None
        if default is None or not default.exists():
            raise ValueError(
                "no API token: pass token= or token_file=, set KAIROS_TOKEN_FILE or KAIROS_TOKEN, "
                "or use a CLI context (kairos context list)"
            )
        secret = _read(str(default))
    pick = lambda given, var, name: given or env(var) or ctx.get(name)  # noqa: E731
    return Settings(
        addresses=resolved,
        token=secret,
        ca=pick(ca, "KAIROS_CA", "ca"),
        cert=pick(cert, "KAIROS_CERT", "cert"),
        key=pick(key, "KAIROS_KEY", "key"),
    )
