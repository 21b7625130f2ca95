"""Secrets at rest: engine API keys and URL credentials, encrypted with the server's key.

The key is ``PARROT_SECRET_KEY`` (a Fernet key; several comma-separated rotate: the first
encrypts, every one decrypts), else the file ``secret.key`` in the data folder, generated
on first start with mode 0600 and reused after. A stored secret is ``fernet:<token>``;
anything else in a secret column is a plaintext secret of an older version, which the
store encrypts on start (:meth:`parrot.platform.store.store.Store.migrate`).
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

log = logging.getLogger(__name__)

PREFIX = "fernet:"
KEY_FILE = "secret.key"
ENV = "PARROT_SECRET_KEY"


class SecretKeyError(ValueError):
    """A secret cannot be decrypted with the configured keys, or a key is malformed."""


class SecretBox:
    def __init__(self, keys: Sequence[bytes | str], source: str = "given") -> None:
        if not keys:
            raise SecretKeyError("a SecretBox needs at least one key")
        try:
            self._fernets = [Fernet(k.encode() if isinstance(k, str) else k) for k in keys]
        except (ValueError, TypeError):
            raise SecretKeyError(
                f"{ENV} must be Fernet keys (32 url-safe base64-encoded bytes, comma-separated); "
                'make one with: python -c "from cryptography.fernet import Fernet; '
                'print(Fernet.generate_key().decode())"'
            ) from None
        self._current = self._fernets[0]
        self._all = MultiFernet(self._fernets)
        self.source = source  # where the key came from (for messages; never the key)

    def __repr__(self) -> str:
        return f"SecretBox(source={self.source!r}, keys={len(self._fernets)})"

    @classmethod
    def load(cls, keys: Sequence[str], folder: Path | str) -> SecretBox:
        """The configured ``keys``, else the key file in ``folder`` (made when absent)."""
        if keys:
            return cls(list(keys), source=ENV)
        return cls([read_or_create_key(Path(folder) / KEY_FILE)], source=str(Path(folder) / KEY_FILE))

    @classmethod
    def from_env(cls, folder: Path | str, env: Mapping[str, str] | None = None) -> SecretBox:
        env = os.environ if env is None else env
        keys = [k.strip() for k in env.get(ENV, "").split(",") if k.strip()]
        return cls.load(keys, folder)

    # -- one secret ----------------------------------------------------------------------
    @staticmethod
    def is_sealed(stored: str) -> bool:
        return stored.startswith(PREFIX)

    def seal(self, secrets: Mapping[str, str]) -> str:
        """``secrets`` (name -> value) as one stored string."""
        return PREFIX + self._current.encrypt(json.dumps(dict(secrets)).encode()).decode()

    def open(self, stored: str) -> dict[str, str]:
        """The secrets of a stored string (raises :class:`SecretKeyError` with the wrong keys)."""
        if not self.is_sealed(stored):
            raise SecretKeyError("not an encrypted secret")
        try:
            return json.loads(self._all.decrypt(stored.removeprefix(PREFIX).encode()))
        except InvalidToken:
            raise SecretKeyError(
                f"a stored secret does not decrypt with the key from {self.source} "
                f"(was {ENV} changed? list the old key after the new one to rotate)"
            ) from None

    def needs_rotation(self, stored: str) -> bool:
        """Sealed with an older key than the current one (it is re-sealed on start)."""
        try:
            self._current.decrypt(stored.removeprefix(PREFIX).encode())
            return False
        except InvalidToken:
            return True


def read_or_create_key(path: Path) -> bytes:
    """The key in ``path``; a new one, written with mode 0600, when there is none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        key = Fernet.generate_key()
        # Written whole to a private temporary file, then linked into place: a link fails
        # when the file exists, so two servers starting at once on one folder agree on the
        # first key, and nobody ever reads a half-written one.
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(key + b"\n")
            os.link(tmp, path)
            log.info("generated the secret key %s (keep it with the database: engine secrets need it)", path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        log.warning("secret key file %s is readable by others (mode %o): chmod 600 it", path, mode)
    key = path.read_bytes().strip()
    if not key:
        raise SecretKeyError(f"the secret key file {path} is empty")
    return key
