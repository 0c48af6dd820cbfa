"""amqps:// through a TLS-terminating proxy with a throwaway self-signed certificate."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from clienthelp import run
from leveret.client import ConnectError, connect

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


class TlsProxy:
    """Accepts TLS on a loopback port and forwards the plain bytes to the broker."""

    def __init__(self, cert: Path, key: Path, target: tuple[str, int]) -> None:
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(cert, key)
        self.target = target
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.ctx)
        )
        self.port = self.server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(OSError, RuntimeError):
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def tls_proxy(certificate, amqp_host_port):
    proxy = TlsProxy(*certificate, amqp_host_port)
    yield proxy
    proxy.close()


def test_amqps_with_the_ca_file_verifies_and_works(tls_proxy, certificate, names):
    cert, _ = certificate
    url = f"amqps://guest:guest@localhost:{tls_proxy.port}/%2F?cafile={cert}"

    async def main() -> None:
        async with await connect(url, name="i12-tls") as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(names.queue())
            await ch.publish(b"over TLS", routing_key=q.name)
            assert (await q.get(no_ack=True)).body == b"over TLS"

    run(main())


def test_amqps_refuses_an_unknown_certificate(tls_proxy):
    url = f"amqps://guest:guest@localhost:{tls_proxy.port}/%2F"

    async def main() -> None:
        with pytest.raises(ConnectError, match="CERTIFICATE_VERIFY_FAILED|certificate verify"):
            await connect(url)

    run(main())


def test_amqps_without_verification_and_with_an_ssl_context(tls_proxy, certificate):
    cert, _ = certificate

    async def main() -> None:
        url = f"amqps://guest:guest@127.0.0.1:{tls_proxy.port}/%2F?verify=verify_none"
        async with await connect(url) as conn:
            assert conn.is_open
        ctx = ssl.create_default_context(cafile=str(cert))
        url = f"amqps://guest:guest@127.0.0.1:{tls_proxy.port}/%2F"
        async with await connect(url, ssl_context=ctx) as conn:  # SAN has the IP
            assert conn.is_open

    run(main())
