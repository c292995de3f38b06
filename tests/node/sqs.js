// The SQS API's scenario from the AWS SDK for JavaScript v3 (@aws-sdk/client-sqs), against
// `msgtable serve --sqs-listen` (tests/acceptance/test_sqs_node.py runs it):
//   node sqs.js ENDPOINT open   the scenario, no auth
//   node sqs.js ENDPOINT auth   signatures checked against the auth file's access keys
//   node sqs.js ENDPOINT manage CreateQueue, PurgeQueue, DeleteQueue (serve --sqs-manage)
// At the long poll it prints "LONGPOLL" and the test INSERTs a row by SQL. It prints "OK" at
// the end; a failed check throws (exit 1, the assertion on stderr).
"use strict";
const assert = require("node:assert/strict");
const crypto = require("node:crypto");
const sqs = require("@aws-sdk/client-sqs");

const [endpoint, mode] = process.argv.slice(2);
const REGION = "eu-test-1";

function client(accessKeyId = "any", secretAccessKey = "anything-at-all") {
  return new sqs.SQSClient({
    endpoint,
    region: REGION,
    credentials: { accessKeyId, secretAccessKey },
    maxAttempts: 1,
  });
}

async function errorOf(promise) {
  try {
    await promise;
  } catch (e) {
    return { name: e.name, code: e.Code, status: e.$metadata && e.$metadata.httpStatusCode };
  }
  throw new Error("the call did not fail");
}

function md5(text) {
  return crypto.createHash("md5").update(Buffer.from(text, "utf8")).digest("hex");
}

function md5OfAttributes(attributes) {
  const h = crypto.createHash("md5");
  const field = (buf) => {
    const len = Buffer.alloc(4);
    len.writeUInt32BE(buf.length);
    h.update(len);
    h.update(buf);
  };
  for (const name of Object.keys(attributes).sort()) {
    const a = attributes[name];
    field(Buffer.from(name));
    field(Buffer.from(a.DataType));
    if (a.BinaryValue !== undefined) {
      h.update(Buffer.from([2]));
      field(Buffer.from(a.BinaryValue));
    } else {
      h.update(Buffer.from([1]));
      field(Buffer.from(a.StringValue, "utf8"));
    }
  }
  return h.digest("hex");
}

async function receive(c, url, waitS = 5, extra = {}) {
  const got = await c.send(
    new sqs.ReceiveMessageCommand({
      QueueUrl: url,
      MaxNumberOfMessages: 10,
      WaitTimeSeconds: waitS,
      MessageSystemAttributeNames: ["All"],
      MessageAttributeNames: ["All"],
      ...extra,
    }),
  );
  return got.Messages || [];
}

async function receiveAll(c, url, n, extra = {}) {
  let out = [];
  const deadline = Date.now() + 30000;
  while (out.length < n && Date.now() < deadline) out = out.concat(await receive(c, url, 5, extra));
  return out;
}

function nextLine() {
  return new Promise((resolve) => {
    let buf = "";
    const onData = (chunk) => {
      buf += chunk;
      if (buf.includes("\n")) {
        process.stdin.off("data", onData);
        process.stdin.pause();
        resolve(buf.split("\n")[0]);
      }
    };
    process.stdin.setEncoding("utf8");
    process.stdin.on("data", onData);
    process.stdin.resume();
  });
}

async function scenario() {
  const c = client();
  const { QueueUrl: url } = await c.send(new sqs.GetQueueUrlCommand({ QueueName: "jobs" }));
  assert.ok(url.endsWith("/jobs") && url.startsWith(endpoint), url);
  const listed = (await c.send(new sqs.ListQueuesCommand({}))).QueueUrls.map((u) => u.split("/").pop());
  assert.deepEqual(listed, ["events.fifo", "jobs", "jobs_dead"]);
  const attrs = (await c.send(new sqs.GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: ["All"] })))
    .Attributes;
  assert.equal(attrs.VisibilityTimeout, "30");
  assert.equal(JSON.parse(attrs.RedrivePolicy).maxReceiveCount, 3);

  // send, with attributes: a column, the JSON column, binary
  const attributes = {
    customer: { DataType: "String", StringValue: "acme" },
    trace: { DataType: "String.id", StringValue: "t-1" },
    blob: { DataType: "Binary", BinaryValue: Uint8Array.from([0, 1, 255]) },
    n: { DataType: "Number", StringValue: "42" },
  };
  const sent = await c.send(
    new sqs.SendMessageCommand({ QueueUrl: url, MessageBody: "héllo", MessageAttributes: attributes }),
  );
  assert.equal(sent.MD5OfMessageBody, md5("héllo"));
  assert.equal(sent.MD5OfMessageAttributes, md5OfAttributes(attributes));
  const batch = await c.send(
    new sqs.SendMessageBatchCommand({
      QueueUrl: url,
      Entries: [0, 1, 2]
        .map((i) => ({ Id: `e${i}`, MessageBody: `batch ${i}` }))
        .concat([{ Id: "late", MessageBody: "later", DelaySeconds: 900 }]),
    }),
  );
  assert.deepEqual(batch.Successful.map((e) => e.Id).sort(), ["e0", "e1", "e2", "late"]);

  // receive (the SDK checks each MD5OfBody itself)
  const got = await receiveAll(c, url, 4);
  const byBody = Object.fromEntries(got.map((m) => [m.Body, m]));
  assert.deepEqual(Object.keys(byBody).sort(), ["batch 0", "batch 1", "batch 2", "héllo"]);
  const first = byBody["héllo"];
  assert.equal(first.MessageAttributes.customer.StringValue, "acme");
  assert.deepEqual(Array.from(first.MessageAttributes.blob.BinaryValue), [0, 1, 255]);
  assert.equal(first.MD5OfMessageAttributes, md5OfAttributes(attributes));
  assert.equal(first.Attributes.ApproximateReceiveCount, "1");
  assert.deepEqual(await receive(c, url, 1), []);

  // delete: a batch with one bad handle, then one by one
  const done = await c.send(
    new sqs.DeleteMessageBatchCommand({
      QueueUrl: url,
      Entries: [0, 1]
        .map((i) => ({ Id: `d${i}`, ReceiptHandle: byBody[`batch ${i}`].ReceiptHandle }))
        .concat([{ Id: "bad", ReceiptHandle: "bm90IGEgaGFuZGxl" }]),
    }),
  );
  assert.deepEqual(done.Successful.map((e) => e.Id), ["d0", "d1"]);
  assert.deepEqual(done.Failed.map((e) => [e.Id, e.Code, e.SenderFault]), [["bad", "ReceiptHandleIsInvalid", true]]);
  await c.send(new sqs.DeleteMessageCommand({ QueueUrl: url, ReceiptHandle: byBody["batch 2"].ReceiptHandle }));

  // visibility 0: back at once, its receive counted; a stale handle changes nothing
  const old = first.ReceiptHandle;
  await c.send(new sqs.ChangeMessageVisibilityCommand({ QueueUrl: url, ReceiptHandle: old, VisibilityTimeout: 0 }));
  const [again] = await receiveAll(c, url, 1);
  assert.equal(again.Body, "héllo");
  assert.equal(again.Attributes.ApproximateReceiveCount, "2");
  const stale = await errorOf(
    c.send(new sqs.ChangeMessageVisibilityCommand({ QueueUrl: url, ReceiptHandle: old, VisibilityTimeout: 60 })),
  );
  assert.deepEqual(stale, {
    name: "MessageNotInflight",
    code: "AWS.SimpleQueueService.MessageNotInflight",
    status: 400,
  });
  await c.send(new sqs.DeleteMessageCommand({ QueueUrl: url, ReceiptHandle: old })); // deletes nothing
  await c.send(
    new sqs.ChangeMessageVisibilityCommand({ QueueUrl: url, ReceiptHandle: again.ReceiptHandle, VisibilityTimeout: 2 }),
  );
  assert.deepEqual(await receive(c, url, 1), []);
  const [third] = await receiveAll(c, url, 1, { VisibilityTimeout: 60 });
  assert.equal(third.Attributes.ApproximateReceiveCount, "3");
  await c.send(new sqs.DeleteMessageCommand({ QueueUrl: url, ReceiptHandle: third.ReceiptHandle }));

  // a long poll the test's plain SQL INSERT answers
  const started = Date.now();
  const polling = receive(c, url, 20);
  console.log("LONGPOLL");
  await nextLine();
  const [inserted] = await polling;
  assert.ok(Date.now() - started < 15000, "the long poll waited for its end");
  assert.equal(inserted.Body, "by sql");
  assert.equal(inserted.MessageId, "7");
  await c.send(new sqs.DeleteMessageCommand({ QueueUrl: url, ReceiptHandle: inserted.ReceiptHandle }));

  // dead letters after vt_max_attempts = 3
  await c.send(new sqs.SendMessageCommand({ QueueUrl: url, MessageBody: "poison" }));
  for (const attempt of [1, 2, 3]) {
    const [m] = await receiveAll(c, url, 1, { VisibilityTimeout: 0 });
    assert.deepEqual([m.Body, m.Attributes.ApproximateReceiveCount], ["poison", String(attempt)]);
  }
  const { QueueUrl: deadUrl } = await c.send(new sqs.GetQueueUrlCommand({ QueueName: "jobs_dead" }));
  const [dead] = await receiveAll(c, deadUrl, 1);
  assert.equal(dead.Body, "poison");
  assert.equal(dead.MessageAttributes.attempts.StringValue, "3");

  // FIFO order per group
  const { QueueUrl: fifo } = await c.send(new sqs.GetQueueUrlCommand({ QueueName: "events.fifo" }));
  for (let i = 0; i < 4; i++) {
    for (const g of ["a", "b"]) {
      await c.send(
        new sqs.SendMessageCommand({ QueueUrl: fifo, MessageBody: `${g}${i}`, MessageGroupId: g, MessageDeduplicationId: `${g}-${i}` }),
      );
    }
  }
  await c.send(new sqs.SendMessageCommand({ QueueUrl: fifo, MessageBody: "dup", MessageGroupId: "a", MessageDeduplicationId: "a-0" }));
  const seen = { a: [], b: [] };
  const until = Date.now() + 30000;
  while (seen.a.length + seen.b.length < 8 && Date.now() < until) {
    for (const m of await receive(c, fifo, 2)) {
      seen[m.Attributes.MessageGroupId].push(m.Body);
      await c.send(new sqs.DeleteMessageCommand({ QueueUrl: fifo, ReceiptHandle: m.ReceiptHandle }));
    }
  }
  assert.deepEqual(seen, { a: ["a0", "a1", "a2", "a3"], b: ["b0", "b1", "b2", "b3"] });

  // bad input, as SQS answers it
  const nowhere = url.replace(/\/jobs$/, "/nowhere");
  assert.deepEqual(await errorOf(c.send(new sqs.SendMessageCommand({ QueueUrl: nowhere, MessageBody: "x" }))), {
    name: "QueueDoesNotExist",
    code: "AWS.SimpleQueueService.NonExistentQueue",
    status: 400,
  });
  assert.equal(
    (await errorOf(c.send(new sqs.DeleteMessageCommand({ QueueUrl: url, ReceiptHandle: "garbage" })))).name,
    "ReceiptHandleIsInvalid",
  );
  const eleven = Array.from({ length: 11 }, (_, i) => ({ Id: `m${i}`, MessageBody: "x" }));
  assert.deepEqual(await errorOf(c.send(new sqs.SendMessageBatchCommand({ QueueUrl: url, Entries: eleven }))), {
    name: "TooManyEntriesInBatchRequest",
    code: "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
    status: 400,
  });
  const big = await errorOf(c.send(new sqs.SendMessageCommand({ QueueUrl: url, MessageBody: "x".repeat(262145) })));
  assert.deepEqual([big.code, big.status], ["InvalidParameterValue", 400]);
}

async function signatures() {
  const worker = client("AKIAMSGTABLETEST0001", "a-test-secret-of-some-length");
  const { QueueUrl: url } = await worker.send(new sqs.GetQueueUrlCommand({ QueueName: "jobs" }));
  await worker.send(new sqs.SendMessageCommand({ QueueUrl: url, MessageBody: "signed" }));
  const [m] = await receiveAll(worker, url, 1);
  assert.equal(m.Attributes.SenderId, "worker");
  await worker.send(new sqs.DeleteMessageCommand({ QueueUrl: url, ReceiptHandle: m.ReceiptHandle }));
  const forged = client("AKIAMSGTABLETEST0001", "not-the-secret-at-all");
  const bad = await errorOf(forged.send(new sqs.SendMessageCommand({ QueueUrl: url, MessageBody: "x" })));
  assert.deepEqual([bad.code, bad.status], ["SignatureDoesNotMatch", 403]);
  const stranger = client("AKIAUNKNOWNKEY000000", "a-test-secret-of-some-length");
  const unknown = await errorOf(stranger.send(new sqs.ListQueuesCommand({})));
  assert.deepEqual([unknown.code, unknown.status], ["InvalidClientTokenId", 403]);
  const nobody = client("AKIAMSGTABLENOBODY01", "another-secret-for-nobody");
  const denied = await errorOf(nobody.send(new sqs.SendMessageCommand({ QueueUrl: url, MessageBody: "x" })));
  assert.deepEqual([denied.code, denied.status], ["AccessDenied", 403]);
}

async function manage() {
  const c = client();
  const { QueueUrl: url } = await c.send(
    new sqs.CreateQueueCommand({ QueueName: "made_by_js", Attributes: { VisibilityTimeout: "7" } }),
  );
  assert.match(url, /\/made_by_js$/);
  const attrs = (await c.send(new sqs.GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: ["All"] })))
    .Attributes;
  assert.equal(attrs.VisibilityTimeout, "7");
  await c.send(new sqs.SendMessageCommand({ QueueUrl: url, MessageBody: "to be purged" }));
  await c.send(new sqs.PurgeQueueCommand({ QueueUrl: url }));
  assert.deepEqual(await errorOf(c.send(new sqs.PurgeQueueCommand({ QueueUrl: url }))), {
    name: "PurgeQueueInProgress",
    code: "AWS.SimpleQueueService.PurgeQueueInProgress",
    status: 400,
  });
  const exists = await errorOf(
    c.send(new sqs.CreateQueueCommand({ QueueName: "made_by_js", Attributes: { VisibilityTimeout: "8" } })),
  );
  assert.deepEqual([exists.name, exists.status], ["QueueNameExists", 400]);
  await c.send(new sqs.DeleteQueueCommand({ QueueUrl: url }));
  assert.equal(
    (await errorOf(c.send(new sqs.GetQueueUrlCommand({ QueueName: "made_by_js" })))).name,
    "QueueDoesNotExist",
  );
}

({ auth: signatures, manage }[mode] || scenario)().then(
  () => {
    console.log("OK");
    process.exit(0); // the SDK's keep-alive sockets and stdin would hold the loop open
  },
  (e) => {
    console.error(e && e.stack ? e.stack : e);
    process.exit(1);
  },
);
