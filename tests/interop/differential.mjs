// A differential test of acpd's transparency against a real agent, claude-agent-acp (pinned in
// package.json), run offline against mock-model.mjs. The official TypeScript SDK's client runs
// one sequence (a) directly against the agent and (b) through `acpd stdio`, and prints one JSON
// object saying what each side answered; tests/agents/real_agent.rs asserts on it.
//
//   node differential.mjs --work DIR [--acpd BIN]
//
// Without `--acpd` only (a) runs. The sequence, per side:
//   initialize → session/new → one prompt → session/list {cwd} → end that process →
//   a NEW process: initialize → session/load of that session id (the history replays).
// Each side has its own HOME, XDG dirs and CLAUDE_CONFIG_DIR under DIR; both use one project
// directory and one mock model server, so their answers can be compared field by field.
//
// Nothing here sleeps and hopes: every step waits for an answer or an exit, each under a
// deadline, and a step that fails (error, timeout, early exit) is recorded as
// `{"error": {...}}` and ends that side, so the test reports what failed instead of hanging.
import { spawn } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { PassThrough, Readable, Writable } from "node:stream";
import { fileURLToPath } from "node:url";
import * as acp from "@agentclientprotocol/sdk";

const here = (p) => fileURLToPath(new URL(p, import.meta.url));
const AGENT = here("./node_modules/@agentclientprotocol/claude-agent-acp/dist/index.js");
const MOCK = here("./mock-model.mjs");
/** The one prompt; the mock answers `REPLY <prompt>`. */
const PROMPT = "hello differential";
/** One request's deadline: generous for a loaded CI machine, far below the test's budget. */
const STEP_MS = 20_000;
/** How long a process may take to exit after its stdin closed. */
const EXIT_MS = 10_000;
/**
 * The whole run's budget: past it the report so far is printed with an `error`, so the test
 * fails saying where it stood instead of hanging. Processes left behind end on their stdin's
 * EOF when this one exits.
 */
const TOTAL_MS = 55_000;
/**
 * Updates the agent sends on its own schedule, not as part of a turn: the slash command list
 * (after session/new and session/load) and the generated title (a background model call that
 * lands during or after the turn). Their order against the turn's updates is not the agent's
 * promise, so the compared sequences leave them out; they are still counted.
 */
const UNORDERED = new Set(["available_commands_update", "session_info_update"]);

function args() {
  const out = {};
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) out[argv[i].replace(/^--/, "")] = argv[i + 1];
  if (!out.work) throw new Error("usage: differential.mjs --work DIR [--acpd BIN]");
  return out;
}

const opts = args();
const t0 = performance.now();
const ms = () => Math.round(performance.now() - t0);
const timings = {};

function withDeadline(promise, what, limit = STEP_MS) {
  let timer;
  const deadline = new Promise((_, reject) => {
    timer = setTimeout(() => reject(Object.assign(new Error(`${what}: no answer in ${limit} ms`), { code: "timeout" })), limit);
  });
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

function errorOf(e) {
  return { code: e?.code ?? null, message: String(e?.message ?? e), data: e?.data ?? null };
}

/** Starts the mock model server; resolves with its port once it listens. */
async function startMock(log) {
  const mock = spawn(process.execPath, [MOCK, log], { stdio: ["pipe", "pipe", "inherit"] });
  const port = await withDeadline(
    new Promise((resolve, reject) => {
      createInterface({ input: mock.stdout }).once("line", (l) => resolve(JSON.parse(l).port));
      mock.once("exit", (code) => reject(new Error(`mock model server exited (${code})`)));
    }),
    "mock model server start",
  );
  return { mock, port };
}

/** A private HOME, XDG dirs and Claude config dir for one side. */
function sideDirs(name) {
  const root = `${opts.work}/${name}`;
  const dirs = {
    HOME: `${root}/home`,
    XDG_CONFIG_HOME: `${root}/xdg/config`,
    XDG_DATA_HOME: `${root}/xdg/data`,
    XDG_CACHE_HOME: `${root}/xdg/cache`,
    XDG_STATE_HOME: `${root}/xdg/state`,
    CLAUDE_CONFIG_DIR: `${root}/claude`,
  };
  for (const d of Object.values(dirs)) mkdirSync(d, { recursive: true });
  // Manual permission mode: the default ("auto") makes Claude Code prepend a billing notice
  // about gateways to the first reply whenever the base URL is not Anthropic's.
  writeFileSync(`${dirs.CLAUDE_CONFIG_DIR}/settings.json`, JSON.stringify({ permissions: { defaultMode: "default" } }));
  return { root, dirs };
}

/** What the agent needs besides its dirs: the mock, a dummy key, and no traffic elsewhere. */
function agentEnv(port) {
  const env = {
    ANTHROPIC_BASE_URL: `http://127.0.0.1:${port}`,
    ANTHROPIC_API_KEY: "sk-ant-mock-differential",
    DISABLE_AUTOUPDATER: "1",
    DISABLE_TELEMETRY: "1",
    DISABLE_ERROR_REPORTING: "1",
  };
  // Claude Code refuses to skip permission checks as root unless told it is sandboxed.
  if (process.getuid?.() === 0) env.IS_SANDBOX = "1";
  return env;
}

/**
 * Runs `command` as an ACP agent over its stdio and `body(ctx, seen)` as its client; `seen`
 * collects every session/update and other notification. Then closes its stdin and waits for
 * it to exit. `rec` gets `error` (the first failure, which ends body), `exit` (the exit code or
 * signal) and, when either went wrong, the tail of the process's stderr.
 */
async function session(label, [command, argv, env], cwd, rec, body) {
  const child = spawn(command, argv, { env, cwd, stdio: ["pipe", "pipe", "pipe"] });
  const stderr = [];
  child.stderr.on("data", (c) => stderr.push(c));
  const exited = new Promise((resolve) => child.once("exit", (code, signal) => resolve(code ?? signal)));
  // The SDK cancels its reader when the connection ends; the agent may still be writing then.
  // Reading child.stdout for ever (into a pipe that drops what nobody reads) keeps the agent
  // from dying of EPIPE, so its exit code says how it ended.
  const out = new PassThrough();
  child.stdout.on("data", (c) => {
    if (!out.destroyed && !out.writableEnded) out.write(c);
  });
  child.stdout.on("end", () => out.end());
  const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(out));
  const seen = { updates: [], notifications: [], permissionRequests: 0 };
  const app = acp
    .client({ name: "acpd-differential", version: "1.0.0" })
    .onNotification("session/update", ({ params }) => {
      seen.updates.push(params);
    })
    .onNotification("*", ({ method }) => {
      seen.notifications.push(method);
    })
    .onRequest("session/request_permission", () => {
      seen.permissionRequests += 1;
      return { outcome: { outcome: "cancelled" } };
    });
  const died = exited.then((code) => {
    throw new Error(`${label}: exited (${code}) before the client was done`);
  });
  try {
    await Promise.race([app.connectWith(stream, (ctx) => body(ctx, seen)), died]);
  } catch (e) {
    rec.error = errorOf(e);
  }
  child.stdin.end();
  try {
    rec.exit = await withDeadline(exited, `${label} exit`, EXIT_MS);
  } catch (e) {
    child.kill("SIGKILL");
    rec.exit = errorOf(e);
  }
  if (rec.exit !== 0 || rec.error) {
    rec.stderrTail = Buffer.concat(stderr).toString("utf8").split("\n").slice(-15).join("\n");
  }
}

async function call(ctx, method, params, log, prefix = "") {
  const started = performance.now();
  try {
    return await withDeadline(ctx.request(method, params), method);
  } finally {
    log[prefix + method] = Math.round(performance.now() - started);
  }
}

/** The kinds (in order, unordered kinds left out), the text and the sessionIds of updates. */
function summarize(updates) {
  const kinds = [];
  const unordered = {};
  const texts = {};
  const sessionIds = new Set();
  for (const u of updates) {
    const kind = u.update?.sessionUpdate;
    sessionIds.add(u.sessionId);
    if (UNORDERED.has(kind)) unordered[kind] = (unordered[kind] ?? 0) + 1;
    else kinds.push(kind);
    if (u.update?.content?.type === "text") texts[kind] = (texts[kind] ?? "") + u.update.content.text;
  }
  return { kinds, unordered, texts, sessionIds: [...sessionIds] };
}

/**
 * One side: a first process creates a session, prompts once and lists; a second one loads what
 * the list said. `spawnArgs()` gives [command, argv, env] for a fresh process. What happened
 * goes into `out` as it happens, so a run stopped by the deadline still reports it.
 */
async function side(label, spawnArgs, project, out) {
  out.steps = {};
  const started = performance.now();
  await session(`${label} #1`, spawnArgs(), project, out, async (ctx, seen) => {
    out.initialize = await call(ctx, "initialize", { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: {} }, out.steps);
    const created = await call(ctx, "session/new", { cwd: project, mcpServers: [] }, out.steps);
    out.sessionId = created.sessionId;
    out.newKeys = Object.keys(created).sort();
    const before = seen.updates.length;
    const prompt = await call(ctx, "session/prompt", { sessionId: created.sessionId, prompt: [{ type: "text", text: PROMPT }] }, out.steps);
    out.stopReason = prompt.stopReason;
    out.turn = summarize(seen.updates.slice(before));
    try {
      out.list = await call(ctx, "session/list", { cwd: project }, out.steps);
    } catch (e) {
      out.list = { error: errorOf(e) };
    }
    out.notifications = seen.notifications;
    out.permissionRequests = seen.permissionRequests;
  });
  out.steps["#1 process"] = Math.round(performance.now() - started);
  if (out.error || !out.sessionId) return;
  out.load = {};
  await session(`${label} #2`, spawnArgs(), project, out.load, async (ctx, seen) => {
    await call(ctx, "initialize", { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: {} }, out.steps, "#2 ");
    const loaded = await call(ctx, "session/load", { sessionId: out.sessionId, cwd: project, mcpServers: [] }, out.steps, "#2 ");
    out.load.keys = Object.keys(loaded ?? {}).sort();
    // claude-agent-acp names the session in its answer; through acpd that must be acpd's id.
    out.load.sessionId = loaded?.sessionId ?? null;
    // What arrived before the answer: ACP replays the history first.
    out.load.replay = summarize(seen.updates);
  });
  out.steps["#2 process"] = Math.round(performance.now() - started) - out.steps["#1 process"];
}

const report = { agent: "@agentclientprotocol/claude-agent-acp", prompt: PROMPT, timings };

function finish() {
  // What the agents asked the model, in order: proof the prompt went through it, and the
  // first thing to read when the agent changed what it calls.
  try {
    report.modelRequests = readFileSync(`${opts.work}/mock-requests.jsonl`, "utf8").trim().split("\n").map((l) => JSON.parse(l));
  } catch {
    report.modelRequests = null;
  }
  process.stdout.write(JSON.stringify(report) + "\n");
  process.exit(0);
}

async function main() {
  const { mock, port } = await startMock(`${opts.work}/mock-requests.jsonl`);
  timings.mockReady = ms();
  const project = `${opts.work}/project`;
  mkdirSync(project, { recursive: true });
  report.project = project;
  const env = agentEnv(port);

  const d = sideDirs("direct");
  report.direct = {};
  await side("claude-agent-acp", () => [process.execPath, [AGENT], { PATH: process.env.PATH, ...d.dirs, ...env }], project, report.direct);
  timings.direct = ms() - timings.mockReady;

  if (opts.acpd) {
    const a = sideDirs("acpd");
    const { CLAUDE_CONFIG_DIR, ...ambient } = a.dirs;
    // The agent's variables reach it the two ways a user's config would pass them: by name from
    // acpd's environment (`env_passthrough`) and set in the provider (`env`).
    const passthrough = ["ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"];
    const fixed = { CLAUDE_CONFIG_DIR, ...Object.fromEntries(Object.entries(env).filter(([k]) => !passthrough.includes(k))) };
    const toml = [
      `default_provider = "claude"`,
      `[providers.claude]`,
      `command = ${JSON.stringify([process.execPath, AGENT])}`,
      `env_passthrough = ${JSON.stringify(passthrough)}`,
      `eof_grace = "5s"`,
      `term_grace = "2s"`,
      `[providers.claude.env]`,
      ...Object.entries(fixed).map(([k, v]) => `${k} = ${JSON.stringify(v)}`),
      "",
    ].join("\n");
    const config = `${a.root}/config.toml`;
    writeFileSync(config, toml);
    report.acpdConfig = toml;
    const acpdEnv = {
      PATH: process.env.PATH,
      ...ambient,
      ANTHROPIC_BASE_URL: env.ANTHROPIC_BASE_URL,
      ANTHROPIC_API_KEY: env.ANTHROPIC_API_KEY,
      STATE_DIRECTORY: `${a.root}/state`,
      ACPD_LOG: process.env.ACPD_LOG ?? "warn",
    };
    const started = ms();
    report.acpd = {};
    await side("acpd stdio", () => [opts.acpd, ["--config", config, "stdio"], acpdEnv], project, report.acpd);
    timings.acpd = ms() - started;
  }
  timings.total = ms();
  mock.stdin.end();
}

setTimeout(() => {
  report.error = { code: "timeout", message: `the whole run took over ${TOTAL_MS} ms`, data: null };
  finish();
}, TOTAL_MS).unref();
await main().catch((e) => {
  report.error = errorOf(e);
});
finish();
