"""Password hashes in RabbitMQ's format, so definitions exports move both ways.

RabbitMQ stores base64(salt + H(salt + utf8(password))) with a random 4-byte
salt, and names the hash function by module: rabbit_password_hashing_sha256
(its default since 3.6), _sha512 and _md5. Leveret writes sha256 and reads all
three. Comparison is constant-time (hmac.compare_digest).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

from leveret.broker.errors import InvalidValue

SHA256 = "rabbit_password_hashing_sha256"
SHA512 = "rabbit_password_hashing_sha512"
MD5 = "rabbit_password_hashing_md5"
ALGORITHMS = {SHA256: hashlib.sha256, SHA512: hashlib.sha512, MD5: hashlib.md5}
DEFAULT_ALGORITHM = SHA256
SALT_BYTES = 4


def _digest(algorithm: str, salt: bytes, password: str) -> bytes:
    return ALGORITHMS[algorithm](salt + password.encode("utf-8")).digest()


def hash_password(password: str, algorithm: str = DEFAULT_ALGORITHM) -> str:
    """A new salted hash of `password`, base64 as RabbitMQ's definitions hold it."""
    check_algorithm(algorithm)
    salt = os.urandom(SALT_BYTES)
    return base64.b64encode(salt + _digest(algorithm, salt, password)).decode("ascii")


def check_algorithm(algorithm: str) -> None:
    if algorithm not in ALGORITHMS:
        raise InvalidValue(
            f"unknown hashing_algorithm '{algorithm}'; expected one of " + ", ".join(ALGORITHMS)
        )


def validate_hash(password_hash: str, algorithm: str) -> None:
    """Refuse a hash that can never match (bad base64, wrong length) when it is imported.

    An empty hash is valid: RabbitMQ uses it for users with no password, who
    cannot log in with PLAIN (only with EXTERNAL).
    """
    check_algorithm(algorithm)
    if password_hash == "":
        return
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidValue(f"password_hash '{password_hash}' is not valid base64") from None
    expected = SALT_BYTES + ALGORITHMS[algorithm]().digest_size
    if len(raw) != expected:
        raise InvalidValue(
            f"password_hash '{password_hash}' has {len(raw)} bytes; {algorithm} "
            f"hashes have {expected} (a 4-byte salt and the digest)"
        )


def check_password(password_hash: str, algorithm: str, password: str) -> bool:
    """True when `password` matches; always does the hashing work, in constant time."""
    raw = b""
    if password_hash and algorithm in ALGORITHMS:
        try:
            raw = base64.b64decode(password_hash)
        except (binascii.Error, ValueError):
            raw = b""
    if len(raw) <= SALT_BYTES:
        # Hash anyway, so an unknown user or a password-less one takes as long.
        _digest(SHA256, b"\0" * SALT_BYTES, password)
        return False
    salt, stored = raw[:SALT_BYTES], raw[SALT_BYTES:]
    return hmac.compare_digest(_digest(algorithm, salt, password), stored)
