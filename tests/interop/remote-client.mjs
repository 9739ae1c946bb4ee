// The official TypeScript SDK's client driving acpd through one of its doors, so that
// tests/agents/remote_clients.rs can compare what each door answers:
//   node remote-client.mjs http URL PHASE [SESSION]   createHttpStream (POST + SSE)
//   node remote-client.mjs ws URL PHASE [SESSION]     createWebSocketStream (the `ws` package)
//   node remote-client.mjs stdio PHASE [SESSION] -- COMMAND ARGS...
//                                                     ndJsonStream over a child's stdio (`acpd
//                                                     connect --socket`, `acpremote mirror`)
// The bearer token is read from $ACPD_TOKEN (an argument would be readable by every local user
// in /proc); a self-signed server certificate is trusted through NODE_EXTRA_CA_CERTS, the way
// Node itself takes an extra CA, for fetch and `ws` alike.
//
// PHASE `first`: initialize, session/new, a streamed prompt holding a permission round-trip,
// then a prompt that waits and is cancelled once its first chunk came. PHASE `load SESSION`
// (a new connection): initialize, session/load of that session (its history replayed), one more
// prompt. Each prints one JSON summary; ids that differ per run are left out.
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import * as acp from "@agentclientprotocol/sdk";
import { createHttpStream } from "@agentclientprotocol/sdk/experimental/http-client";
import { createWebSocketStream } from "@agentclientprotocol/sdk/experimental/ws-client";
import { WebSocket } from "ws";

const argv = process.argv.slice(2);
const dash = argv.indexOf("--");
const [door, ...rest] = dash < 0 ? argv : argv.slice(0, dash);
const url = door === "stdio" ? null : rest.shift();
const [phase, loadId] = rest;
const token = process.env.ACPD_TOKEN;
const auth = token ? { Authorization: `Bearer ${token}` } : {};

let child = null;
function open() {
  switch (door) {
    case "http":
      return createHttpStream(url, { headers: auth });
    case "ws":
      return createWebSocketStream(url, { headers: auth, WebSocket });
    case "stdio": {
      const [command, ...args] = argv.slice(dash + 1);
      child = spawn(command, args, { stdio: ["pipe", "pipe", "inherit"] });
      return acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
    }
    default:
      throw new Error(`unknown door ${door}: http, ws or stdio`);
  }
}

// What the agent streamed, as [kind, text] per update; a waiter resolved by the next chunk.
let updates = [];
let onChunk = null;
let permissions = [];
const cwd = process.cwd();

const app = acp
  .client({ name: "ts-remote" })
  .onNotification("session/update", ({ params }) => {
    const u = params.update;
    if (u.sessionUpdate === "agent_message_chunk" || u.sessionUpdate === "user_message_chunk") {
      updates.push([u.sessionUpdate, u.content.text]);
      if (u.sessionUpdate === "agent_message_chunk") onChunk?.();
    }
  })
  .onRequest("session/request_permission", ({ params }) => {
    permissions.push(params.options.map((o) => [o.optionId, o.kind]));
    const allow = params.options.find((o) => o.kind === "allow_once");
    return { outcome: { outcome: "selected", optionId: allow.optionId } };
  });

function take() {
  const seen = { updates, permissions };
  updates = [];
  permissions = [];
  return seen;
}

const summary = await app.connectWith(open(), async (ctx) => {
  const init = await ctx.request("initialize", {
    protocolVersion: acp.PROTOCOL_VERSION,
    clientCapabilities: {},
  });
  const out = {
    protocolVersion: init.protocolVersion,
    acpd: init.agentCapabilities?._meta?.acpd?.version ?? null,
    loadSession: init.agentCapabilities?.loadSession ?? false,
  };
  if (phase === "first") {
    const session = await ctx.request("session/new", { cwd, mcpServers: [] });
    out.sessionId = session.sessionId;
    const turn = await ctx.request("session/prompt", {
      sessionId: session.sessionId,
      prompt: [{ type: "text", text: "hello\n:permission" }],
    });
    out.prompt = { stopReason: turn.stopReason, ...take() };
    // Cancel only once the turn is known to run: its first chunk has arrived.
    const running = new Promise((resolve) => (onChunk = resolve));
    const waiting = ctx.request("session/prompt", {
      sessionId: session.sessionId,
      prompt: [{ type: "text", text: "waiting\n:hang" }],
    });
    await running;
    onChunk = null;
    await ctx.notify("session/cancel", { sessionId: session.sessionId });
    out.cancel = { stopReason: (await waiting).stopReason, ...take() };
  } else if (phase === "load") {
    const loaded = await ctx.request("session/load", { sessionId: loadId, cwd, mcpServers: [] });
    out.load = { answered: loaded !== undefined, ...take() };
    const turn = await ctx.request("session/prompt", {
      sessionId: loadId,
      prompt: [{ type: "text", text: "again" }],
    });
    out.again = { stopReason: turn.stopReason, ...take() };
  } else {
    throw new Error(`unknown phase ${phase}: first or load SESSION`);
  }
  return out;
});
if (child) {
  child.stdin.end();
  summary.childExit = await new Promise((resolve) => child.on("exit", resolve));
}
console.log(JSON.stringify(summary));
