// A real agent calls `acpd mcp`'s `delegate`: claude-agent-acp (pinned in package.json), offline
// against mock-model.mjs, gets `acpd mcp` as an MCP server in `session/new`; the prompt
// `DELEGATE <json>` makes the mock answer with a tool_use of `mcp__acpd__delegate`, Claude Code
// calls the tool, acpd runs the echo agent, and the tool result goes back to the mock, which
// answers `RESULT <the tool result>`. Prints one JSON object saying what the client and the mock
// saw; tests/agents/real_delegate.rs asserts on it.
//
//   node delegate.mjs --work DIR --acpd BIN --via direct|stdio [--input JSON] [--max-depth N]
//                     [--kill agent|mcp|stdin | --cancel 1] [--permission allow|reject]
//                     [--then JSON] [--daemon 1] [--tool-search VALUE]
//
// `--via direct` runs the agent as this script's child; `--via stdio` runs it as the child of
// `acpd stdio` (provider `claude`), so the delegated run is a grandchild of acpd at depth 2.
// Either way `acpd mcp --in-process` is the agent's MCP server, with the config in DIR
// (`max_depth` from `--max-depth`). Once the delegated echo agent runs (the input should make it
// hang), `--kill agent` SIGKILLs claude-agent-acp (the process this script started, or acpd
// stdio's child), `--kill mcp` SIGKILLs `acpd mcp`, `--kill stdin` closes the started process's
// stdin (the client goes away); the turn is then awaited (through acpd, or after `mcp`) or left. Every run ends with `left`: this run's processes (acpd's argv
// names its config, the agent's environment its HOME) still there after a deadline — none,
// when nothing outlives the run — and then kills them.
//
// `--cancel 1` sends `session/cancel` once the delegated echo runs, awaits the turn's answer,
// and records in `cancelled` how long the echo took to go while the agent and `acpd mcp` stay
// (Claude Code's MCP cancellation, not a teardown). `--permission reject` answers the
// permission request `reject_once`. `--then JSON` runs a second turn, `DELEGATE <JSON>`, in the
// same session (`second`). `turns` holds each turn's updates. `--daemon 1` starts `acpd serve`
// on a socket in DIR (its log in DIR/daemon.log), `acpd mcp --socket` uses it, and `acpd runs
// --json` is recorded (`runs`) once the echo runs; the daemon gets SIGTERM at the end.
// `--tool-search false` sets Claude Code's ENABLE_TOOL_SEARCH, so MCP tools are offered up front.
//
// Nothing sleeps and hopes: each step waits for an answer or an exit under a deadline, and a
// failed step is recorded as `{"error": {...}}` so the test says what failed instead of hanging.
import { execFileSync, spawn } from "node:child_process";
import { mkdirSync, openSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { PassThrough, Readable, Writable } from "node:stream";
import { fileURLToPath } from "node:url";
import * as acp from "@agentclientprotocol/sdk";

const here = (p) => fileURLToPath(new URL(p, import.meta.url));
const AGENT = here("./node_modules/@agentclientprotocol/claude-agent-acp/dist/index.js");
const MOCK = here("./mock-model.mjs");
/** What the model is scripted to hand the echo agent, by default: a line and its pid. */
const DEFAULT_INPUT = { provider: "echo", prompt: "delegated hello\n:pid\n:env ACPD_DEPTH\n:cwd", label: "from-claude" };
/** One request's deadline; the prompt turn gets three (the agent starts `acpd mcp` first). */
const STEP_MS = 20_000;
const EXIT_MS = 10_000;
/** The whole run's budget: past it the report so far is printed with an `error`. */
const TOTAL_MS = 80_000;

function args() {
  const out = {};
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) out[argv[i].replace(/^--/, "")] = argv[i + 1];
  if (!out.work || !out.acpd || !["direct", "stdio"].includes(out.via)) {
    throw new Error("usage: delegate.mjs --work DIR --acpd BIN --via direct|stdio [--input JSON]");
  }
  return out;
}

const opts = args();
const input = opts.input ? JSON.parse(opts.input) : DEFAULT_INPUT;
if (opts.kill && !["agent", "mcp", "stdin"].includes(opts.kill)) throw new Error("--kill agent|mcp|stdin");
if (opts.permission && !["allow", "reject"].includes(opts.permission)) throw new Error("--permission allow|reject");
const report = { via: opts.via, input, steps: {} };
const t0 = performance.now();

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

/** The mock's pid, which carries this run's HOME too but is this script's to end. */
let mockPid = null;

async function startMock(log) {
  const mock = spawn(process.execPath, [MOCK, log], { stdio: ["pipe", "pipe", "inherit"], env: { ...process.env, MOCK_TOOLS: "1" } });
  mockPid = mock.pid;
  const port = await withDeadline(
    new Promise((resolve, reject) => {
      createInterface({ input: mock.stdout }).once("line", (l) => resolve(JSON.parse(l).port));
      mock.once("exit", (code) => reject(new Error(`mock model server exited (${code})`)));
    }),
    "mock model server start",
  );
  return { mock, port };
}

/** HOME, XDG dirs and the Claude config dir, all under DIR. */
function dirs() {
  const d = {
    HOME: `${opts.work}/home`,
    XDG_CONFIG_HOME: `${opts.work}/xdg/config`,
    XDG_DATA_HOME: `${opts.work}/xdg/data`,
    XDG_CACHE_HOME: `${opts.work}/xdg/cache`,
    XDG_STATE_HOME: `${opts.work}/xdg/state`,
    // No daemon socket to find: `acpd mcp` is in-process anyway, this keeps `acpd stdio` local.
    XDG_RUNTIME_DIR: `${opts.work}/runtime`,
    CLAUDE_CONFIG_DIR: `${opts.work}/claude`,
  };
  for (const v of Object.values(d)) mkdirSync(v, { recursive: true });
  // Manual permission mode (see differential.mjs): the MCP tool call asks the client first.
  writeFileSync(`${d.CLAUDE_CONFIG_DIR}/settings.json`, JSON.stringify({ permissions: { defaultMode: "default" } }));
  return d;
}

function agentEnv(port) {
  const env = {
    ANTHROPIC_BASE_URL: `http://127.0.0.1:${port}`,
    ANTHROPIC_API_KEY: "sk-ant-mock-delegate",
    ...(opts["tool-search"] ? { ENABLE_TOOL_SEARCH: opts["tool-search"] } : {}),
    DISABLE_AUTOUPDATER: "1",
    DISABLE_TELEMETRY: "1",
    DISABLE_ERROR_REPORTING: "1",
  };
  if (process.getuid?.() === 0) env.IS_SANDBOX = "1";
  return env;
}

/** The acpd config: the built-in echo provider with fast graces, and claude for `acpd stdio`. */
function writeConfig(env, d) {
  const { CLAUDE_CONFIG_DIR } = d;
  const toml = [
    // `acpd stdio` bridges to the default provider; the mock names `echo` in its tool call.
    `default_provider = "${opts.via === "stdio" ? "claude" : "echo"}"`,
    ...(opts["max-depth"] ? [`max_depth = ${Number(opts["max-depth"])}`] : []),
    `[providers.echo]`,
    // The config in the echo agent's argv too, so this run's processes are found by it.
    `command = ${JSON.stringify([opts.acpd, "--config", `${opts.work}/config.toml`, "agent", "echo"])}`,
    `description = "Echoes the prompt back; for tests"`,
    `cancel_grace = "300ms"`,
    `eof_grace = "300ms"`,
    `term_grace = "300ms"`,
    `[providers.claude]`,
    `command = ${JSON.stringify([process.execPath, AGENT])}`,
    `eof_grace = "5s"`,
    `term_grace = "2s"`,
    `[providers.claude.env]`,
    ...Object.entries({ CLAUDE_CONFIG_DIR, ...env }).map(([k, v]) => `${k} = ${JSON.stringify(v)}`),
    "",
  ].join("\n");
  const path = `${opts.work}/config.toml`;
  writeFileSync(path, toml);
  return path;
}

/**
 * This run's processes other than this script and the mock: acpd's (their argv names this
 * run's config) and the agent's (their environment names this run's HOME). What must not
 * survive the run.
 */
function processesOf(config) {
  const out = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid || Number(name) === mockPid) continue;
    try {
      const argv = readFileSync(`/proc/${name}/cmdline`, "utf8").split("\0");
      const state = readFileSync(`/proc/${name}/stat`, "utf8").split(") ").pop().split(" ")[0];
      let ours = argv.includes(config);
      if (!ours) {
        try {
          ours = readFileSync(`/proc/${name}/environ`, "utf8").split("\0").includes(`HOME=${opts.work}/home`);
        } catch {
          // Not ours to read: not ours.
        }
      }
      if (ours) out.push({ pid: Number(name), state, argv: argv.filter(Boolean).map((a) => a.slice(0, 120)) });
    } catch {
      // Gone while we looked.
    }
  }
  return out;
}

/** The state letter of a pid (Z for a zombie), or null once it is gone. */
function stateOf(pid) {
  try {
    return readFileSync(`/proc/${pid}/stat`, "utf8").split(") ").pop().split(" ")[0];
  } catch {
    return null;
  }
}

/**
 * What is left of this run after up to `limit` ms: its processes, and every pid seen before an
 * attack that still exists in any state (a zombie's argv and environment are empty, so only its
 * pid can find it).
 */
async function untilNoneLeft(config, limit) {
  const deadline = performance.now() + limit;
  const seen = (report.beforeKill ?? []).map((p) => p.pid);
  for (;;) {
    const left = processesOf(config);
    for (const pid of seen) {
      const state = stateOf(pid);
      if (state && !left.some((p) => p.pid === pid)) left.push({ pid, state, argv: [] });
    }
    if (left.length === 0 || performance.now() >= deadline) return left;
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** `acpd serve` on `socket`, once it answers `acpd status`. */
async function startDaemon(config, socket, d) {
  mkdirSync(`${opts.work}/run`, { recursive: true });
  const log = openSync(`${opts.work}/daemon.log`, "w");
  const env = { PATH: process.env.PATH, ...d, STATE_DIRECTORY: `${opts.work}/state`, ACPD_LOG: "info" };
  const daemon = spawn(opts.acpd, ["--config", config, "serve", "--socket", socket], { env, stdio: ["ignore", "ignore", log] });
  await poll(() => {
    try {
      execFileSync(opts.acpd, ["status", "--json", "--socket", socket], { stdio: "ignore", timeout: STEP_MS });
      return true;
    } catch {
      if (daemon.exitCode !== null) throw new Error(`acpd serve exited (${daemon.exitCode})`);
      return false;
    }
  }, "acpd serve to answer");
  return daemon;
}

/** Resolves with `probe()`'s first truthy value (polled every 20 ms), or rejects at the deadline. */
async function poll(probe, what, limit = 3 * STEP_MS) {
  const deadline = performance.now() + limit;
  for (;;) {
    const v = probe();
    if (v) return v;
    if (performance.now() >= deadline) throw Object.assign(new Error(`${what}: not in ${limit} ms`), { code: "timeout" });
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A process of this run that is an echo agent (the delegated child `acpd mcp` starts). */
function isEcho(p) {
  return p.argv.includes("agent") && p.argv.includes("echo");
}

async function main() {
  const log = `${opts.work}/mock-requests.jsonl`;
  const { mock, port } = await startMock(log);
  const project = `${opts.work}/project`;
  mkdirSync(project, { recursive: true });
  const d = dirs();
  const env = agentEnv(port);
  const config = writeConfig(env, d);
  report.config = config;
  report.project = project;

  const socket = `${opts.work}/run/acpd.sock`;
  const daemon = opts.daemon ? await startDaemon(config, socket, d) : null;
  const acpdQuery = (what) => JSON.parse(execFileSync(opts.acpd, ["--config", config, what, "--json", "--socket", socket], { encoding: "utf8", timeout: STEP_MS }));
  const [command, argv, childEnv] =
    opts.via === "direct"
      ? [process.execPath, [AGENT], { PATH: process.env.PATH, ...d, ...env }]
      : [opts.acpd, ["--config", config, "stdio"], { PATH: process.env.PATH, ...d, STATE_DIRECTORY: `${opts.work}/state`, ACPD_LOG: process.env.ACPD_LOG ?? "warn" }];
  const child = spawn(command, argv, { env: childEnv, cwd: project, stdio: ["pipe", "pipe", "pipe"] });
  const stderr = [];
  child.stderr.on("data", (c) => stderr.push(c));
  const exited = new Promise((resolve) => child.once("exit", (code, signal) => resolve(code ?? signal)));
  const out = new PassThrough();
  child.stdout.on("data", (c) => {
    if (!out.destroyed && !out.writableEnded) out.write(c);
  });
  child.stdout.on("end", () => out.end());
  const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(out));
  // Every delegated echo agent seen while the run lasts (one started by a hanging prompt is
  // seen for sure), so a test can say whether acpd ran one at all.
  const echoesSeen = new Set();
  const watcher = setInterval(() => {
    for (const p of processesOf(config)) if (isEcho(p)) echoesSeen.add(p.pid);
  }, 25);

  const updates = [];
  /** Where each turn's updates start in `updates`. */
  const turnStarts = [];
  const permissions = [];
  const app = acp
    .client({ name: "acpd-delegate", version: "1.0.0" })
    .onNotification("session/update", ({ params }) => {
      updates.push(params);
    })
    .onRequest("session/request_permission", ({ params }) => {
      // Allow once, as a user would (the tool call is what the test is about), unless told not to.
      const want = opts.permission === "reject" ? "reject_once" : "allow_once";
      const chosen = params.options.find((o) => o.kind === want);
      permissions.push({ toolCall: params.toolCall, options: params.options.map((o) => o.kind), chose: chosen?.kind ?? null });
      return chosen ? { outcome: { outcome: "selected", optionId: chosen.optionId } } : { outcome: { outcome: "cancelled" } };
    });
  const died = exited.then((code) => {
    throw new Error(`agent exited (${code}) before the client was done`);
  });
  const mcpServers = [
    {
      name: "acpd",
      command: opts.acpd,
      args: ["--config", config, "mcp", ...(daemon ? ["--socket", socket] : ["--in-process"])],
      env: [
        { name: "STATE_DIRECTORY", value: `${opts.work}/state` },
        { name: "ACPD_LOG", value: "info" },
      ],
    },
  ];
  const step = async (name, p) => {
    const started = performance.now();
    try {
      return await p;
    } finally {
      report.steps[name] = Math.round(performance.now() - started);
    }
  };
  try {
    await Promise.race([
      app.connectWith(stream, async (ctx) => {
        report.initialize = await step("initialize", withDeadline(ctx.request("initialize", { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: {} }), "initialize"));
        const created = await step("session/new", withDeadline(ctx.request("session/new", { cwd: project, mcpServers }), "session/new"));
        report.sessionId = created.sessionId;
        const ask = (what) => ctx.request("session/prompt", { sessionId: created.sessionId, prompt: [{ type: "text", text: `DELEGATE ${JSON.stringify(what)}` }] });
        turnStarts.push(updates.length);
        const prompt = ask(input);
        if (opts.cancel) {
          const echo = await step("echo running", poll(() => processesOf(config).find(isEcho), "the delegated echo agent to start"));
          report.beforeKill = processesOf(config);
          if (daemon) report.runs = acpdQuery("runs");
          const sent = performance.now();
          await ctx.notify("session/cancel", { sessionId: created.sessionId });
          const answer = await step("session/prompt", withDeadline(prompt, "session/prompt after cancel"));
          report.stopReason = answer.stopReason;
          await poll(() => !stateOf(echo.pid), "the echo to go after session/cancel", STEP_MS);
          // The very processes from before the cancel, not restarted ones.
          const alive = (pred) => {
            const p = report.beforeKill.find(pred);
            return Boolean(p && stateOf(p.pid) && stateOf(p.pid) !== "Z");
          };
          report.cancelled = {
            echo: echo.pid,
            echoGoneMs: Math.round(performance.now() - sent),
            mcpAlive: alive((p) => p.argv.includes("mcp")),
            agentAlive: alive((p) => p.argv.includes(AGENT)),
          };
        }
        if (opts.kill) {
          const echo = await step("echo running", poll(() => processesOf(config).find(isEcho), "the delegated echo agent to start"));
          report.beforeKill = processesOf(config);
          if (opts.kill === "stdin") {
            report.killed = { what: "stdin", pid: child.pid, echo: echo.pid };
            return;
          }
          const victim = report.beforeKill.find((p) => (opts.kill === "agent" ? p.argv.includes(AGENT) : p.argv.includes("mcp")))?.pid;
          report.killed = { what: opts.kill, pid: victim ?? null, echo: echo.pid };
          if (victim) process.kill(victim, "SIGKILL");
          // Directly, the client's peer is dead: nothing will answer.
          if (opts.kill === "agent" && opts.via === "direct") return;
        }
        if (!opts.cancel) {
          try {
            const answer = await step("session/prompt", withDeadline(prompt, "session/prompt", 3 * STEP_MS));
            report.stopReason = answer.stopReason;
            // Through acpd the agent's death is an answer: `cancelled`, naming the exit.
            if (answer._meta?.acpd?.sessionEnded) report.sessionEnded = answer._meta.acpd.sessionEnded;
          } catch (e) {
            if (opts.kill !== "agent") throw e;
            report.promptError = errorOf(e);
          }
        }
        if (opts.then) {
          turnStarts.push(updates.length);
          const answer = await step("second session/prompt", withDeadline(ask(JSON.parse(opts.then)), "second session/prompt", 3 * STEP_MS));
          report.second = { stopReason: answer.stopReason };
        }
      }),
      died,
    ]);
  } catch (e) {
    if (!["agent", "stdin"].includes(opts.kill)) report.error = errorOf(e);
  }
  clearInterval(watcher);
  report.echoesSeen = [...echoesSeen];
  // Clipped: what the agent streams repeats the tool's whole output several times.
  report.updates = updates.map((u) => clip(u.update));
  report.turns = turnStarts.map((start, i) => report.updates.slice(start, turnStarts[i + 1]));
  report.permissions = permissions;
  child.stdin.end();
  try {
    report.exit = await withDeadline(exited, "agent exit", EXIT_MS);
  } catch (e) {
    child.kill("SIGKILL");
    report.exit = errorOf(e);
  }
  if (daemon) {
    // Once the agent is gone the daemon holds nothing of it: its runs are disposed.
    report.runsAfter = acpdQuery("runs");
    daemon.kill("SIGTERM");
    report.daemonExit = await withDeadline(new Promise((r) => (daemon.exitCode !== null ? r(daemon.exitCode) : daemon.once("exit", (c, sig) => r(c ?? sig)))), "daemon exit", EXIT_MS).catch(errorOf);
  }
  // What is left of acpd under this run once the agent is gone: nothing, within a deadline.
  report.left = await untilNoneLeft(config, 15_000);
  report.savedResults = savedResults();
  // Whatever outlived the deadline is killed, so a failing run leaves nothing behind either.
  for (const p of report.left) {
    try {
      process.kill(p.pid, "SIGKILL");
    } catch {
      // Already gone.
    }
  }
  // The whole stderr of the started process (acpd's log through acpd), for a failing test.
  report.stderrFile = `${opts.work}/agent.stderr`;
  writeFileSync(report.stderrFile, Buffer.concat(stderr));
  if (report.error || (report.exit !== 0 && !opts.kill)) {
    report.stderrTail = Buffer.concat(stderr).toString("utf8").split("\n").slice(-25).join("\n");
  }
  mock.stdin.end();
}

/**
 * The tool results Claude Code saved to files instead of handing them to the model (over its
 * token limit): each file's length and, when it is the result JSON, its `text`'s length.
 */
function savedResults() {
  const out = [];
  const walk = (dir) => {
    let entries = [];
    try {
      entries = readdirSync(dir, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      const path = `${dir}/${e.name}`;
      if (e.isDirectory()) walk(path);
      else if (dir.endsWith("/tool-results")) {
        const body = readFileSync(path, "utf8");
        let textChars = null;
        try {
          textChars = JSON.parse(body).text?.length ?? null;
        } catch {
          // Not the result JSON.
        }
        out.push({ file: e.name, chars: body.length, textChars });
      }
    }
  };
  walk(`${opts.work}/claude/projects`);
  return out;
}

/** `v` with every string over 2000 characters cut to its start and length (big outputs). */
function clip(v) {
  if (typeof v === "string") return v.length > 2000 ? `${v.slice(0, 200)}… (${v.length} characters)` : v;
  if (Array.isArray(v)) return v.map(clip);
  if (v && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, clip(x)]));
  return v;
}

let finished = false;

function finish() {
  if (finished) return;
  finished = true;
  try {
    report.modelRequests = readFileSync(`${opts.work}/mock-requests.jsonl`, "utf8").trim().split("\n").map((l) => JSON.parse(l));
  } catch {
    report.modelRequests = null;
  }
  report.ms = Math.round(performance.now() - t0);
  // Exit once it is written: stdout is a pipe, where an exit drops what is still queued.
  process.stdout.write(JSON.stringify(report) + "\n", () => process.exit(0));
}

setTimeout(() => {
  report.error = { code: "timeout", message: `the whole run took over ${TOTAL_MS} ms`, data: null };
  finish();
}, TOTAL_MS).unref();
await main().catch((e) => {
  report.error = errorOf(e);
});
finish();
