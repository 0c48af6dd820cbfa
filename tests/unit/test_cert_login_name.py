"""The user name a client certificate gives (leveret.auth.sasl): its CN, or its subject
written as RabbitMQ's rabbit_cert_info:subject/1 writes it (RFC 4514, last RDN first)."""

from __future__ import annotations

import ssl

import pytest
import trustme
from cryptography import x509

from leveret.auth.sasl import certificate_login_name, distinguished_name


def _peercert(tmp_path, cert) -> dict:
    """What ssl.getpeercert() gives for `cert` (the same decoder)."""
    path = tmp_path / "cert.pem"
    cert.cert_chain_pems[0].write_to_path(path)
    return ssl._ssl._test_decode_cert(str(path))  # type: ignore[attr-defined]


@pytest.mark.parametrize("cn", ["guest", "bob, jr", 'say "hi"+a;b<c>d\\e'])
def test_distinguished_name_is_rfc_4514_as_cryptography_writes_it(tmp_path, cn):
    cert = trustme.CA().issue_cert("x@example", common_name=cn)
    expected = x509.load_pem_x509_certificate(cert.cert_chain_pems[0].bytes())
    peercert = _peercert(tmp_path, cert)
    assert distinguished_name(peercert) == expected.subject.rfc4514_string()
    assert certificate_login_name(peercert, "distinguished_name").startswith("CN=")
    assert certificate_login_name(peercert) == cn
    assert certificate_login_name(peercert, "common_name") == cn


def test_escapes_as_rabbitmq():
    subject = (
        (("countryName", "FR"),),
        (("organizationName", "#lead and trail "),),
        (("commonName", "José~"), ("userId", "7")),
    )
    assert distinguished_name({"subject": subject}) == (
        "CN=Jos\\C3\\A9\\7E+UID=7,O=\\#lead and trail\\ ,C=FR"
    )


def test_no_certificate_gives_no_name():
    for peercert in (None, {}, {"subject": ()}):
        assert certificate_login_name(peercert, "distinguished_name") is None
        assert certificate_login_name(peercert) is None
