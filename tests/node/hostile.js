// Hostile requests from Node's grpc-js, a second client stack (tests/integration/test_fuzz.py):
// each request is sent as raw bytes (no protobuf library: a client may send anything), and
// what came back is printed as JSON, one object per call: method, case, status code (the
// number), its name, and the message's length and first 200 characters.
//   node hostile.js HOST:PORT
"use strict";
const grpc = require("@grpc/grpc-js");

function varint(n) {
  const out = [];
  do {
    let byte = n & 0x7f;
    n = Math.floor(n / 128);
    out.push(n ? byte | 0x80 : byte);
  } while (n);
  return Buffer.from(out);
}

function field(number, data) {
  return Buffer.concat([varint((number << 3) | 2), varint(data.length), data]);
}

const ID_ONE = field(3, Buffer.from([0x10, 0x02])); // ids: [Value(int_value=1)] (sint64 field 2)
const METHODS = [
  ["MessageStream", Buffer.alloc(0), true],
  ["MessageAck", ID_ONE, false],
  ["MessageRelease", ID_ONE, false],
  ["ListDeadLetters", Buffer.alloc(0), false],
];
const CASES = [
  ["name of 70,000 characters", Buffer.from("t".repeat(70000))],
  ["name of 16,000 characters", Buffer.from("t".repeat(16000))],
  ["name not UTF-8", Buffer.from([0x74, 0xff, 0xfe])],
  ["unknown table", Buffer.from("no_such_table")],
];
const names = Object.fromEntries(Object.entries(grpc.status).map(([k, v]) => [v, k]));

const client = new grpc.Client(process.argv[2], grpc.credentials.createInsecure());
const identity = (x) => x;

function call(method, payload, stream) {
  const path = `/msgtable.v1.Messaging/${method}`;
  const deadline = new Date(Date.now() + 10000);
  return new Promise((resolve) => {
    const done = (err) =>
      resolve(err ? { code: err.code, details: err.details || "" } : { code: 0, details: "" });
    if (stream) {
      const s = client.makeServerStreamRequest(path, identity, identity, payload, { deadline });
      s.on("data", () => {
        s.cancel();
      });
      s.on("error", done);
      s.on("end", () => done(null));
    } else {
      client.makeUnaryRequest(path, identity, identity, payload, { deadline }, done);
    }
  });
}

(async () => {
  for (const [method, rest, stream] of METHODS) {
    for (const [label, name] of CASES) {
      const started = Date.now();
      const r = await call(method, Buffer.concat([field(1, name), rest]), stream);
      console.log(
        JSON.stringify({
          method,
          case: label,
          code: r.code,
          status: names[r.code],
          details_length: r.details.length,
          details: r.details.slice(0, 200),
          ms: Date.now() - started,
        }),
      );
    }
  }
  client.close();
})();
