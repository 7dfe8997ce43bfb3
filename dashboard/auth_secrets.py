"""Streamlit's secrets file for ``st.login``, written from the typed config when the dashboard is launched.

Streamlit reads OpenID Connect settings only from an ``[auth]`` table of a ``secrets.toml``. Rather than asking
operators to keep a second configuration in step with ``eventide.toml`` (and a client secret in a file in the
checkout), the launcher writes that file from ``config.dashboard`` into ``<data_dir>/dashboard/`` (directory 0700,
file 0600) and points Streamlit at it alone (``--secrets.files``), so a stray ``.streamlit/secrets.toml`` in the
working directory or the home directory is never read. No Streamlit import here: the CLI calls this before it
starts Streamlit.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from eventide.config import Config

SECRETS_FILE = "secrets.toml"
COOKIE_SECRET_FILE = "cookie-secret"
COOKIE_SECRET_BYTES = 32


def dashboard_dir(config: Config) -> Path:
    """The dashboard's private directory (0700): its secrets file and generated cookie secret."""
    path = config.data_dir / "dashboard"
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def streamlit_options(config: Config) -> list[str]:
    """``streamlit run`` options that give the app its sign-in settings: the secrets file written for
    ``sign_in = "oidc"``; for the other modes an absent one (any earlier file is removed, so no client secret is
    left on disk) and still ``--secrets.files``, so no other secrets file is picked up."""
    path = dashboard_dir(config) / SECRETS_FILE
    if config.dashboard.sign_in == "oidc":
        _write_private(path, auth_toml(config, cookie_secret(config)))
    else:
        path.unlink(missing_ok=True)
    return ["--secrets.files", str(path)]


def cookie_secret(config: Config) -> str:
    """``dashboard.oidc_cookie_secret``, else the one generated on first start and kept (a new one at each start
    would sign every user out)."""
    if config.dashboard.oidc_cookie_secret:
        return config.dashboard.oidc_cookie_secret
    path = dashboard_dir(config) / COOKIE_SECRET_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        generated = secrets.token_urlsafe(COOKIE_SECRET_BYTES)
        _write_private(path, generated + "\n")
        return generated


def auth_toml(config: Config, cookie: str) -> str:
    """The ``[auth]`` table Streamlit's ``st.login`` reads: one provider, the default."""
    d = config.dashboard
    values = {"redirect_uri": d.oidc_callback_url, "cookie_secret": cookie, "client_id": d.oidc_client_id,
              "client_secret": d.oidc_client_secret, "server_metadata_url": d.oidc_server_metadata_url}
    # A JSON string with ASCII escapes is a valid TOML basic string: no value can end the string or add a key.
    lines = ["[auth]", *(f"{key} = {json.dumps(value)}" for key, value in values.items()),
             "", "[auth.client_kwargs]", f"prompt = {json.dumps(d.oidc_prompt)}", ""]
    return "\n".join(lines)


def _write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``, readable by this user only from the first byte (created 0600, then renamed
    over the old file, so a reader never sees half of it)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.unlink(missing_ok=True)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
