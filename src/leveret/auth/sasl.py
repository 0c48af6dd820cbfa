"""SASL EXTERNAL: the identity a verified client certificate gives."""

from __future__ import annotations

from typing import Any


def certificate_cn(peercert: Any) -> str | None:
    """The subject's common name from ssl's getpeercert() dict, as RabbitMQ's default."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return None
