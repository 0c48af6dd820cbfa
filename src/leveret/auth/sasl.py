"""The identity a verified client certificate gives: SASL EXTERNAL and MQTT's
certificate login (`mqtt_ssl_cert_login`, the keys of `mqtt_default_vhosts`).

`ssl_cert_login_from` picks it, as RabbitMQ's setting of that name: the subject's
common name (`common_name`, Leveret's default) or its whole distinguished name
(`distinguished_name`, RabbitMQ's default) written as RabbitMQ writes it: RFC 4514,
the last RDN first (`CN=guest,O=client`), RabbitMQ's short attribute names.
"""

from __future__ import annotations

from typing import Any

LOGIN_FROM = ("common_name", "distinguished_name")

# ssl.getpeercert()'s (OpenSSL's long) attribute names → RabbitMQ's (rabbit_cert_info).
_SHORT = {
    "surname": "SN",
    "givenName": "GIVENNAME",
    "initials": "INITIALS",
    "generationQualifier": "GENERATIONQUALIFIER",
    "commonName": "CN",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "title": "TITLE",
    "countryName": "C",
    "serialNumber": "SERIALNUMBER",
    "pseudonym": "PSEUDONYM",
    "domainComponent": "DC",
    "emailAddress": "EMAILADDRESS",
    "streetAddress": "STREET",
    "userId": "UID",
}


def certificate_cn(peercert: Any) -> str | None:
    """The subject's common name from ssl's getpeercert() dict."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return None


def _escape(value: str) -> str:
    """RFC 4514 escaping as RabbitMQ does it: a leading space or '#', a trailing space,
    the special characters, and every byte outside printable ASCII as \\XX (UTF-8)."""
    out = []
    for i, char in enumerate(value):
        if (i == 0 and char in " #") or (char == " " and i == len(value) - 1):
            out.append("\\" + char)
        elif char in '"+,;<>\\':
            out.append("\\" + char)
        elif ord(char) < 32 or ord(char) >= 126:
            out.extend(f"\\{byte:02X}" for byte in char.encode())
        else:
            out.append(char)
    return "".join(out)


def distinguished_name(peercert: Any) -> str | None:
    """The subject as RabbitMQ's rabbit_cert_info:subject/1 writes it."""
    if not peercert or not peercert.get("subject"):
        return None
    rdns = [
        "+".join(f"{_SHORT.get(key, key)}={_escape(value)}" for key, value in rdn)
        for rdn in peercert["subject"]
    ]
    return ",".join(reversed(rdns))


def certificate_login_name(peercert: Any, login_from: str = "common_name") -> str | None:
    """The user name a verified certificate gives (None without one, or without a CN)."""
    if login_from == "distinguished_name":
        return distinguished_name(peercert)
    return certificate_cn(peercert)
