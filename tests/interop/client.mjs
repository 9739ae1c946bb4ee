// The official TypeScript SDK's client driving `acpd stdio`: a bridge session (prompt, streamed
// chunks, a forwarded permission request) and one delegation. Prints one JSON summary.
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import * as acp from "@agentclientprotocol/sdk";

const [acpdBin, config, cwd] = process.argv.slice(2);
const child = spawn(acpdBin, ["--config", config, "stdio"], { stdio: ["pipe", "pipe", "inherit"] });
const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));

const chunks = [];
const extNotifications = [];
const app = acp
  .client({ name: "ts-interop" })
  .onNotification("session/update", ({ params }) => {
    if (params.update.sessionUpdate === "agent_message_chunk") chunks.push(params.update.content.text);
  })
  .onNotification("*", ({ method }) => {
    extNotifications.push(method);
  })
  .onRequest("session/request_permission", ({ params }) => {
    const allow = params.options.find((o) => o.kind === "allow_once");
    return { outcome: { outcome: "selected", optionId: allow.optionId } };
  });

const summary = await app.connectWith(stream, async (ctx) => {
  const init = await ctx.request("initialize", { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: {} });
  const session = await ctx.request("session/new", { cwd, mcpServers: [] });
  const prompt = await ctx.request("session/prompt", {
    sessionId: session.sessionId,
    prompt: [{ type: "text", text: "hello from typescript\n:permission" }],
  });
  const start = await ctx.request("_acpd/subagent/start", {
    prompt: [{ type: "text", text: "delegated" }],
    label: "ts",
  });
  const result = await ctx.request("_acpd/subagent/wait", { runId: start.runId });
  await ctx.request("_acpd/subagent/dispose", { runId: start.runId });
  return {
    protocolVersion: init.protocolVersion,
    acpd: init.agentCapabilities?._meta?.acpd?.version ?? null,
    sessionId: session.sessionId,
    stopReason: prompt.stopReason,
    text: chunks.join(""),
    delegated: result.output.map((b) => b.text).join(""),
    delegatedStop: result.stopReason,
    ext: extNotifications,
  };
});
child.stdin.end();
const code = await new Promise((resolve) => child.on("exit", resolve));
console.log(JSON.stringify({ ...summary, acpdExit: code }));
