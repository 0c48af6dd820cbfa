#!/usr/bin/env bash
# Everything the test suite needs, on a fresh Debian machine: the Python extras, Debian's
# Chromium (the web UI tests drive it with Playwright) and RabbitMQ's own command-line tool
# rabbitmqadmin (the management API is checked with it). rabbitmqadmin is taken out of
# Debian's rabbitmq-server package without installing RabbitMQ.
set -euo pipefail
cd "$(dirname "$0")/.."

pip install -q -e ".[test,spark]"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
  echo "install-test-deps: need root (or sudo) to run: $*" >&2; return 1; fi; }
apt_updated=
apt_update() { [ -n "$apt_updated" ] || { as_root apt-get update -qq >/dev/null; apt_updated=1; }; }

if ! command -v chromium >/dev/null; then
  echo "install-test-deps: installing Debian's chromium for the web UI tests"
  apt_update
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

tools=.cache/tools
if ! command -v rabbitmqadmin >/dev/null && [ ! -x $tools/rabbitmqadmin ]; then
  echo "install-test-deps: fetching rabbitmqadmin from Debian's rabbitmq-server package"
  apt_update
  work=$(mktemp -d)
  (cd "$work" && apt-get download -qq rabbitmq-server >/dev/null && dpkg-deb -x rabbitmq-server_*.deb root)
  mkdir -p $tools
  cp "$work/root/usr/bin/rabbitmqadmin" $tools/rabbitmqadmin
  chmod +x $tools/rabbitmqadmin
  rm -rf "$work"
fi

# etcd for the cluster tests (tests/cluster): the binaries of Debian's etcd-server
# (etcd) and etcd-client (etcdctl) packages, taken out of the packages as for
# rabbitmqadmin, because installing etcd-server also starts a system etcd on 2379.
if ! command -v etcd >/dev/null && [ ! -x $tools/etcd/etcd ]; then
  echo "install-test-deps: fetching etcd from Debian's etcd-server and etcd-client packages"
  apt_update
  work=$(mktemp -d)
  (cd "$work" && apt-get download -qq etcd-server etcd-client >/dev/null &&
    for deb in ./*.deb; do dpkg-deb -x "$deb" root; done)
  mkdir -p $tools/etcd
  cp "$work/root/usr/bin/etcd" "$work/root/usr/bin/etcdctl" $tools/etcd/
  rm -rf "$work"
fi

# The partition tests (tests/partitions) put each node, etcd member and client in a network
# namespace of its own (`ip netns`, veth pairs on a bridge) and cut links with nftables
# inside them: Debian's iproute2 and nftables (tc comes with iproute2).
if ! command -v ip >/dev/null || ! command -v nft >/dev/null; then
  echo "install-test-deps: installing Debian's iproute2 and nftables for the partition tests"
  apt_update
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 nftables >/dev/null
fi

# Node's amqplib runs its own tests against Leveret (tests/peers/node_amqplib.py): node,
# npm, and amqplib's package with mocha, fetched from npm into .cache/peers.
if ! command -v npm >/dev/null; then
  echo "install-test-deps: installing Debian's nodejs and npm for amqplib's tests"
  apt_update
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
python tests/peers/node_amqplib.py --fetch >/dev/null

# MQTT.js's browser bundle for the Web MQTT page test (tests/test_mqtt_browser.py): the
# npm package mqtt, pinned, fetched into .cache/mqttjs.
python tests/mqttjs.py --fetch >/dev/null
