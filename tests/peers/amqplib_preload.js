// Loaded with `mocha --require` before amqplib's tests (tests/peers/node_amqplib.py).
// A few tests in amqplib's test/connect.js dial the default localhost:5672 instead of
// $URL; send those to the broker under test, $AMQPLIB_TEST_PORT, since a test broker
// never takes a fixed port. [::1] is left alone (the ipv6 test).
'use strict';
const net = require('net');
const port = Number(process.env.AMQPLIB_TEST_PORT);
const connect = net.connect;

function redirected(options) {
  if (!port || !options || typeof options !== 'object') return options;
  const host = options.host;
  if (Number(options.port) !== 5672 || !(host === undefined || host === 'localhost' || host === '127.0.0.1')) {
    return options;
  }
  return Object.assign({}, options, { host: '127.0.0.1', port: port });
}

net.connect = net.createConnection = function (options, ...rest) {
  return connect.call(this, redirected(options), ...rest);
};
