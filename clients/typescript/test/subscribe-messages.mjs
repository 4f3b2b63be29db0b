// A MESSAGES subscriber for the resume-dedupe test of clients/python/tests/test_resume_dedupe.py:
// prints one JSON line per event the package yields (message snapshots as protobuf, base64), so
// that test can check what a TypeScript caller sees across a server kill and restart.
//   node subscribe-messages.mjs BASE_URL SESSION_ID
import { toBinary } from "@bufbuild/protobuf";
import { AgentHarnessClient, TranscriptMessageSchema, messageText } from "@agent-harness/client";

const [baseUrl, sessionId] = process.argv.slice(2);
const client = new AgentHarnessClient({ baseUrl, reconnectForMs: 60_000 });
for await (const event of client.subscribe(sessionId, { view: "messages" })) {
  const { case: kind, value } = event.event;
  const line = { offset: String(event.offset), kind };
  if (kind === "message") {
    Object.assign(line, {
      id: value.id,
      text: messageText(value),
      pb: Buffer.from(toBinary(TranscriptMessageSchema, value)).toString("base64"),
    });
  }
  if (kind === "turnEnded") Object.assign(line, { requestId: value.requestId, stopReason: value.stopReason });
  console.log(JSON.stringify(line));
}
