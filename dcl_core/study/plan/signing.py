"""This user's signing key, and what a study signs with it: the files it writes into an output folder others may
write too, and reads back trusting that it wrote them (its Ray session note, its record, the record of its summary
run, Tune's saved state).

The key (:func:`key_path`, ``~/.cache/dcl_core/ray_session.key``: named for its first use, the session note) is 256
random bits, readable by its owner only, in a folder of this user's; whoever can write an output folder cannot
read it, so an HMAC-SHA256 with it (:func:`mac`) proves that this user's study wrote what it covers. Each signature
names what it is for (its ``purpose``), so none can be moved from one kind of file to another. A signed JSON object
carries its signature under :data:`SIGNATURE`, over everything else it holds (:func:`signed_json`,
:func:`json_trust`), with the key's fingerprint: a file signed with another key (another user's, another machine's)
is told apart from one changed since this user signed it.

A signature can be removed with the file still read as one from before signing existed, so the records whose
content decides a verdict are also remembered where they lie (:func:`remember`, a name per path in this user's
cache folder): a file at a path this user's studies signed that is no longer signed was changed. Where the key
cannot be kept privately (a read-only home, a link planted at its name, a file others may read) nothing is signed
and nothing can be checked: set ``XDG_CACHE_HOME`` to a private folder of yours.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

KEY_BYTES = 32  # the signing key: 256 random bits
SIGNATURE = "signature"  # the field of a signed JSON object that holds its signature
REMEMBERED = "signed"  # this user's cache folder's list of the paths its studies signed a record at

# What :func:`json_trust` finds
SIGNED = "signed"  # signed with this user's key, unchanged since
CHANGED = "changed"  # signed with this user's key, changed since (or its signature written over)
UNSIGNED = "unsigned"  # no signature, or another key's: nothing says this user's study wrote it
NO_KEY = "no key"  # this user's key is there but cannot be used privately: nothing can be checked


def key_path() -> Path:
    """This user's signing key: in ``$XDG_CACHE_HOME`` (else ``~/.cache``) ``/dcl_core/``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "dcl_core" / "ray_session.key"


def key(create: bool) -> bytes | None:
    """The signing key, made first when ``create`` (None when it cannot be kept privately: a link, another
    owner, a file others may read, a read-only home). Two studies making it at once agree on one key: it is
    written under a temporary name, then linked to its own, which only the first link gets."""
    path = key_path()
    with contextlib.suppress(OSError):
        if create and not os.path.lexists(path):
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(secrets.token_bytes(KEY_BYTES))
                with contextlib.suppress(FileExistsError):
                    os.link(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            found = f.read(KEY_BYTES + 1)
        if (stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077
                and len(found) == KEY_BYTES):
            return found
        log.debug("%s is not a private key of %d bytes: nothing is signed or checked with it", path, KEY_BYTES)
    return None


def key_unusable() -> bool:
    """Whether this user's key is there but cannot be used (a link, another owner's, readable by others): unlike a
    key never made (nothing was signed with it), what it signed can no longer be checked."""
    return os.path.lexists(key_path()) and key(create=False) is None


def mac(secret: bytes, purpose: str, payload: Any) -> str:
    """HMAC-SHA256 (hex) of ``payload`` (anything JSON holds, in a canonical form) for ``purpose``."""
    message = json.dumps([purpose, payload], sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def fingerprint(secret: bytes) -> str:
    """Which key signed: a digest of it that reveals nothing of it."""
    return hashlib.sha256(b"dcl_core signing key\0" + secret).hexdigest()[:16]


def signed_json(data: dict[str, Any], purpose: str) -> dict[str, Any]:
    """``data`` with its signature for ``purpose`` under :data:`SIGNATURE` (made with this user's key, created if
    needed); ``data`` as it is, unsigned, when no key can be kept."""
    secret = key(create=True)
    body = {k: v for k, v in data.items() if k != SIGNATURE}
    if secret is None:
        return body
    # the canonical form of what a reader parses back: tuples are lists, keys are strings
    body = json.loads(json.dumps(body))
    return {**body, SIGNATURE: {"key": fingerprint(secret), "hmac": mac(secret, purpose, body)}}


def json_trust(data: dict[str, Any], purpose: str) -> str:
    """Whether ``data`` (a parsed JSON object) is as this user's study signed it for ``purpose``:
    :data:`SIGNED`, :data:`CHANGED`, :data:`UNSIGNED` or :data:`NO_KEY`."""
    secret = key(create=False)
    if secret is None:
        return NO_KEY if key_unusable() else UNSIGNED
    signature = data.get(SIGNATURE)
    if not (isinstance(signature, dict) and signature.get("key") == fingerprint(secret)):
        return UNSIGNED
    body = {k: v for k, v in data.items() if k != SIGNATURE}
    return SIGNED if hmac.compare_digest(str(signature.get("hmac")), mac(secret, purpose, body)) else CHANGED


def _remembered_at(path: Path) -> Path:
    where = str(Path(path).expanduser().resolve())
    return key_path().parent / REMEMBERED / hashlib.sha256(where.encode()).hexdigest()[:32]


def remember(path: Path) -> None:
    """Note (in this user's cache folder, private) that this user's study signed the file at ``path``."""
    marker = _remembered_at(path)
    try:
        marker.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600))
    except OSError as err:  # a read-only home: what it would protect is then said unsigned when read
        log.debug("not remembered that %s was signed: %s", path, err)


def remembered(path: Path) -> bool:
    """Whether this user's study once signed the file at ``path`` (:func:`remember`)."""
    marker = _remembered_at(path)
    try:
        st = os.lstat(marker)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()
