"""MQTT.js's browser bundle, for the web page of tests/test_mqtt_browser.py.

The npm package ``mqtt`` (pinned: VERSION, checked against its sha512 integrity) is
fetched with ``npm pack`` and its ``dist/mqtt.min.js`` (a self-contained bundle that
defines the global ``mqtt``) and licence are kept in ``.cache/mqttjs/mqtt-VERSION``;
nothing of it is committed.

    python tests/mqttjs.py --fetch      # download once (scripts/install-test-deps.sh)
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "mqttjs"
VERSION = "5.16.0"
INTEGRITY = "sha512-G0VsEtuJz5sJUgZJaaADMVfW7SIFPzkIuHR+d6rk+tBeSwdCfd9BaIRycRfd2AbyFDEmLlFM+SDQeti/+IbOnw=="
TARGET = CACHE / f"mqtt-{VERSION}"
BUNDLE = TARGET / "mqtt.min.js"
KEPT = {"package/dist/mqtt.min.js": "mqtt.min.js", "package/LICENSE.md": "LICENSE.md"}


def fetch() -> Path:
    """The bundle's path, downloading the pinned package the first time."""
    if BUNDLE.exists():
        return BUNDLE
    if shutil.which("npm") is None:
        raise RuntimeError("npm is missing: scripts/install-test-deps.sh installs it")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        subprocess.run(
            ["npm", "pack", "--silent", f"mqtt@{VERSION}"],
            cwd=tmp,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        archive = Path(tmp) / f"mqtt-{VERSION}.tgz"
        digest = (
            "sha512-" + base64.b64encode(hashlib.sha512(archive.read_bytes()).digest()).decode()
        )
        if digest != INTEGRITY:
            raise RuntimeError(f"{archive.name}: integrity {digest} is not the pinned {INTEGRITY}")
        staged = Path(tmp) / "kept"
        staged.mkdir()
        with tarfile.open(archive) as tar:
            for member, name in KEPT.items():
                source = tar.extractfile(member)
                if source is None:
                    raise RuntimeError(f"{archive.name} has no {member}")
                (staged / name).write_bytes(source.read())
        shutil.rmtree(TARGET, ignore_errors=True)
        shutil.move(str(staged), TARGET)
    return BUNDLE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fetch", action="store_true", help="download the pinned bundle")
    args = parser.parse_args()
    if args.fetch:
        print(fetch())
    else:
        print(BUNDLE if BUNDLE.exists() else f"{BUNDLE} (missing: --fetch)")


if __name__ == "__main__":
    main()
