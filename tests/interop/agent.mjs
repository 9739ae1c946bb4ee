// A minimal agent on the official TypeScript SDK, run by acpd as a child: it streams the
// prompt back prefixed and ends the turn; `cancel` in the prompt waits for session/cancel.
import { Readable, Writable } from "node:stream";
import * as acp from "@agentclientprotocol/sdk";

const waiting = new Map();
let sessions = 0;

acp
  .agent({ name: "ts-agent" })
  .onRequest("initialize", () => ({
    protocolVersion: acp.PROTOCOL_VERSION,
    agentCapabilities: { loadSession: false },
    agentInfo: { name: "ts-agent", version: "1.0.0" },
    authMethods: [],
  }))
  .onRequest("session/new", () => ({ sessionId: `ts-${++sessions}` }))
  .onRequest("session/prompt", async ({ params, client }) => {
    const text = params.prompt.filter((b) => b.type === "text").map((b) => b.text).join("");
    await client.notify("session/update", {
      sessionId: params.sessionId,
      update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text: `ts agent: ${text}` } },
    });
    if (text.includes("cancel")) {
      await new Promise((resolve) => waiting.set(params.sessionId, resolve));
      return { stopReason: "cancelled" };
    }
    return { stopReason: "end_turn" };
  })
  .onNotification("session/cancel", ({ params }) => {
    waiting.get(params.sessionId)?.();
  })
  .connect(acp.ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin)));
