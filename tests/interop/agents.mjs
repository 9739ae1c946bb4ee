// The differential harness of issue 19: one scripted editor (the official TypeScript SDK's
// client) runs the same ACP sequence against a real agent (a) directly, (b) through `acpd
// stdio` and (c) through `acpd serve` + `acpd connect`, all offline against mock-model.mjs on
// 127.0.0.1, and says per method whether (b) and (c) answered as (a) did. The network sides
// (issue 31), asked for by name, run `acpd serve --listen https://127.0.0.1:0` with the given
// certificate and a token from `acpd token create`, reached by the SDK's own network clients:
// (d) `https`, createHttpStream (POST + SSE), and (e) `wss`, createWebSocketStream on `ws`. The
// certificate must be trusted through NODE_EXTRA_CA_CERTS, which node reads only at its start.
//
//   node agents.mjs --agent claude|codex|gemini|opencode|echo --work DIR [--acpd BIN]
//                   [--sides direct,stdio,serve[,https,wss]] [--cert PEM --key PEM] [--bench N]
//
// Prints one JSON object on stdout: every side's normalized answers (`sides`), the comparison
// (`table`: method → {stdio, serve, …} each "same" | "differs" | "not offered" | "not run", with
// a short diff in `diffs`), the same table as text (`text`), and with `--bench N` the warm-start
// figures (`bench`). tests/agents/differential.rs runs it per agent and asserts on `table`.
//
// The sequence, each step only where the agent advertises what it needs (else "not offered"):
//   initialize → authenticate (an advertised method) → session/new A → prompt A →
//   prompt "HANG" + session/cancel → prompt "HANG" + $/cancel_request → set_mode / set_model /
//   set_config_option → session/list → load A and resume A while open → fork A →
//   close A → resume A (closed) → close A → load A (closed) → delete A → delete of an unknown
//   id → an unknown `_` method → logout; and whether the agent's stderr reached the editor.
// Then, on connections of their own: a session made and prompted, the agent (or acpd, with
// `warm = 1`) started again, and the session loaded and prompted (`restarted`).
// With the scripted child (`--agent echo`: `acpd agent echo`, run directly as well, whose
// prompt `:` directives make it ask the editor), also: an elicitation/create round trip (the
// editor advertises elicitation and accepts with content), elicitation/complete, and a
// `$/cancel_request` from the agent for its own elicitation/create. The real agents elicit
// only from a tool call the mock does not script, so these rows are "not run" for them.
// Answers are normalized before comparing: session ids become `<S1>`, `<S2>`… in order of first
// appearance, timestamps `<time>`, the side's private directory `<root>`, a title the mock
// generated or the prompt `<title>`; `_meta.acpd` is removed everywhere. For a turn the
// answer, the ordered update kinds (leaving out the ones agents send on their own schedule:
// commands and session info) and the text per kind are compared.
//
// Nothing sleeps and hopes: a turn is cancelled once the mock reports the model request it is
// waiting on; every step has a deadline and a failure is recorded as `{"error": …}`.
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { PassThrough, Readable, Writable } from "node:stream";
import { fileURLToPath } from "node:url";
import * as acp from "@agentclientprotocol/sdk";
import { createHttpStream } from "@agentclientprotocol/sdk/experimental/http-client";
import { createWebSocketStream } from "@agentclientprotocol/sdk/experimental/ws-client";
import { WebSocket } from "ws";

const here = (p) => fileURLToPath(new URL(p, import.meta.url));
const MOCK = here("./mock-model.mjs");
const PROMPT = "hello differential";
const TITLE = "Differential session";
/**
 * One request's deadline: generous, because the three sides (and other agents' tests) start
 * their agents at once on a small machine, where opencode's cold start alone can take 20 s.
 */
const STEP_MS = 60_000;
/** How long a process may take to exit after its stdin closed (then SIGTERM, then SIGKILL). */
const EXIT_MS = 10_000;
/** How long a cancelled turn may take to end (the agents take milliseconds). */
const CANCEL_MS = 5_000;
/** The elicitation the editor accepts, with content `{name: "Ada"}`. */
const ELICIT_ACCEPT = "Your name?";
/** The elicitation the agent cancels with `$/cancel_request` before the editor answers. */
const ELICIT_CANCELLED = "Cancelled by the agent?";
/** An elicitation/create form request asking `message`. */
const elicitForm = (message) =>
  JSON.stringify({ mode: "form", message, requestedSchema: { type: "object", properties: { name: { type: "string" } } } });
/** An id no side ever created. */
const UNKNOWN_ID = "sess-unknown-0000-differential";
/**
 * Updates agents send on their own schedule rather than as part of a turn or a replay: the
 * command list, session info (titles), config and mode changes, and usage (codex-acp reports a
 * thread's token usage when it learns it, before or after a replay's answer). The compared
 * sequences leave them out.
 */
const UNORDERED = new Set(["available_commands_update", "session_info_update", "config_option_update", "current_mode_update", "usage_update"]);
/**
 * The marker Claude Code appends to its transcript when a turn is interrupted. It lands there on
 * Claude Code's own schedule, after the cancelled prompt has been answered, so whether a load
 * right after replays it is timing (CI once saw the second one in the direct replay and in
 * neither replay through acpd). Replays leave it out; the cancel rows still compare the turns.
 */
const INTERRUPTED = "[Request interrupted by user]";

function args() {
  const out = { sides: "direct,stdio,serve" };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) out[argv[i].replace(/^--/, "")] = argv[i + 1];
  if (!out.work || !out.agent) throw new Error("usage: agents.mjs --agent NAME --work DIR [--acpd BIN] [--sides direct,stdio,serve[,https,wss]] [--cert PEM --key PEM] [--bench N]");
  return out;
}
const opts = args();

// ---- the agents ---------------------------------------------------------------------------

const bin = (p) => here(`./node_modules/${p}`);

/**
 * Per agent: the argv that runs it, the environment it needs besides the side's HOME and XDG
 * dirs (a dummy key, the mock's URL, its state dir, no telemetry or update checks), files to
 * write first, and the acpd preset whose quirks (eof_grace, root env) it should get.
 */
const AGENTS = {
  /**
   * The scripted child: acpd's own echo agent, the same binary run directly. It needs no model,
   * no network and no key; its sessions live in the side's directory.
   */
  echo: {
    scripted: true,
    clientCapabilities: { elicitation: { form: {} } },
    argv: (root) => {
      if (!opts.acpd) throw new Error("--agent echo needs --acpd BIN (the echo agent is acpd's)");
      return [opts.acpd, "agent", "echo", "--sessions", `${root}/echo-sessions`, "--null-cursor", "--stderr", "echo: started"];
    },
    setup: () => ({}),
  },
  claude: {
    preset: "claude",
    argv: () => [process.execPath, bin("@agentclientprotocol/claude-agent-acp/dist/index.js")],
    setup(root, port) {
      const dir = `${root}/claude`;
      mkdirSync(dir, { recursive: true });
      // Manual permission mode: the default makes Claude Code prepend a gateway billing notice.
      writeFileSync(`${dir}/settings.json`, JSON.stringify({ permissions: { defaultMode: "default" } }));
      const env = {
        ANTHROPIC_BASE_URL: `http://127.0.0.1:${port}`,
        ANTHROPIC_API_KEY: "sk-ant-mock-differential",
        CLAUDE_CONFIG_DIR: dir,
        DISABLE_AUTOUPDATER: "1",
        DISABLE_TELEMETRY: "1",
        DISABLE_ERROR_REPORTING: "1",
      };
      if (process.getuid?.() === 0) env.IS_SANDBOX = "1";
      return env;
    },
  },
  codex: {
    preset: "codex",
    argv: () => [process.execPath, bin("@agentclientprotocol/codex-acp/dist/index.js")],
    setup(root, port) {
      const home = `${root}/codex`;
      mkdirSync(home, { recursive: true });
      // A custom provider speaking the Responses API to the mock; the bundled codex binary
      // (@openai/codex's platform package) needs nothing else from the network.
      const config = {
        model: "gpt-mock",
        model_provider: "mock",
        model_providers: {
          mock: { name: "mock", base_url: `http://127.0.0.1:${port}/v1`, wire_api: "responses", env_key: "CODEX_API_KEY", request_max_retries: 0, stream_max_retries: 0 },
        },
        check_for_update_on_startup: false,
        analytics: { enabled: false },
      };
      writeFileSync(
        `${home}/config.toml`,
        [
          `model = "gpt-mock"`,
          `model_provider = "mock"`,
          `check_for_update_on_startup = false`,
          `[model_providers.mock]`,
          `name = "mock"`,
          `base_url = "http://127.0.0.1:${port}/v1"`,
          `wire_api = "responses"`,
          `env_key = "CODEX_API_KEY"`,
          `request_max_retries = 0`,
          `stream_max_retries = 0`,
          "",
        ].join("\n"),
      );
      return {
        CODEX_HOME: home,
        CODEX_API_KEY: "sk-mock-differential",
        CODEX_CONFIG: JSON.stringify(config),
        MODEL_PROVIDER: "mock",
        NO_BROWSER: "1",
      };
    },
  },
  gemini: {
    preset: "gemini",
    argv: () => [process.execPath, bin("@google/gemini-cli/bundle/gemini.js"), "--acp"],
    setup(root, port, dirs) {
      const dir = `${dirs.HOME}/.gemini`;
      mkdirSync(dir, { recursive: true });
      writeFileSync(
        `${dir}/settings.json`,
        JSON.stringify({
          security: { auth: { selectedType: "gemini-api-key" }, folderTrust: { enabled: false } },
          general: { disableAutoUpdate: true, disableUpdateNag: true, enableAutoUpdate: false, enableAutoUpdateNotification: false },
          privacy: { usageStatisticsEnabled: false },
          telemetry: { enabled: false },
          model: { name: "gemini-2.5-flash" },
        }),
      );
      return {
        GEMINI_API_KEY: "mock-gemini-key",
        GOOGLE_GEMINI_BASE_URL: `http://127.0.0.1:${port}`,
        GEMINI_CLI_NO_RELAUNCH: "true",
        NO_BROWSER: "1",
      };
    },
  },
  opencode: {
    preset: "opencode",
    argv: () => [bin("opencode-ai/bin/opencode.exe"), "acp"],
    setup(root, port) {
      const file = `${root}/opencode-config.json`;
      writeFileSync(
        file,
        JSON.stringify({
          $schema: "https://opencode.ai/config.json",
          model: "mock/mock-model",
          small_model: "mock/mock-model",
          autoupdate: false,
          share: "disabled",
          provider: {
            mock: {
              npm: "@ai-sdk/openai-compatible",
              name: "Mock",
              options: { baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "mock-opencode-key" },
              models: { "mock-model": { name: "Mock model" } },
            },
          },
        }),
      );
      return {
        OPENCODE_CONFIG: file,
        OPENCODE_DISABLE_AUTOUPDATE: "1",
        OPENCODE_DISABLE_MODELS_FETCH: "1",
        OPENCODE_DISABLE_LSP_DOWNLOAD: "1",
        OPENCODE_DISABLE_SHARE: "1",
        OPENCODE_DISABLE_DEFAULT_PLUGINS: "1",
        OPENCODE_DISABLE_CLAUDE_CODE: "1",
        // opencode also reads every opencode.json from the project directory up to /: a stray
        // one (e.g. /tmp/opencode.json) would change or break the run.
        OPENCODE_DISABLE_PROJECT_CONFIG: "1",
      };
    },
  },
};

const AGENT = AGENTS[opts.agent];
if (!AGENT) throw new Error(`unknown agent ${opts.agent}: one of ${Object.keys(AGENTS).join(", ")}`);

// ---- helpers ------------------------------------------------------------------------------

function withDeadline(promise, what, limit = STEP_MS) {
  let timer;
  const deadline = new Promise((_, reject) => {
    timer = setTimeout(() => reject(Object.assign(new Error(`${what}: no answer in ${limit} ms`), { code: "timeout" })), limit);
  });
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

function errorOf(e) {
  const out = { code: e?.code ?? null, message: String(e?.message ?? e) };
  if (e?.data !== undefined && e?.data !== null) out.data = e.data;
  return out;
}

/** Waits for `check()` to be truthy, looking again at each event of `emitter` or every 20 ms. */
async function until(check, what, limit = STEP_MS) {
  const start = performance.now();
  for (;;) {
    const v = await check();
    if (v) return v;
    if (performance.now() - start > limit) throw Object.assign(new Error(`${what}: not within ${limit} ms`), { code: "timeout" });
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** The mock model server, with every request it got (it prints one line per request). */
async function startMock(log) {
  const mock = spawn(process.execPath, [MOCK, log], { stdio: ["pipe", "pipe", "inherit"], env: { ...process.env, MOCK_EVENTS: "1" } });
  const requests = [];
  const lines = createInterface({ input: mock.stdout });
  const port = await withDeadline(
    new Promise((resolve, reject) => {
      lines.on("line", (l) => {
        const v = JSON.parse(l);
        if (v.port) resolve(v.port);
        else requests.push(v);
      });
      mock.once("exit", (code) => reject(new Error(`mock model server exited (${code})`)));
    }),
    "mock model server start",
  );
  return { mock, port, requests };
}

function sideDirs(root) {
  const dirs = {
    HOME: `${root}/home`,
    XDG_CONFIG_HOME: `${root}/xdg/config`,
    XDG_DATA_HOME: `${root}/xdg/data`,
    XDG_CACHE_HOME: `${root}/xdg/cache`,
    XDG_STATE_HOME: `${root}/xdg/state`,
  };
  for (const d of Object.values(dirs)) mkdirSync(d, { recursive: true });
  return dirs;
}

const toml = (v) => JSON.stringify(v);

/** An acpd config whose one provider, the default, runs the agent with `env`. */
function acpdConfig(root, env, { warm = 0, tls = false } = {}) {
  const [command, ...rest] = AGENT.argv(root);
  const lines = [
    `default_provider = "${opts.agent}"`,
    `detach_timeout = "0s"`,
    ...(tls ? [`tls_cert = ${toml(opts.cert)}`, `tls_key = ${toml(opts.key)}`] : []),
    `[providers.${opts.agent}]`,
    ...(AGENT.preset ? [`preset = "${AGENT.preset}"`] : []),
    `command = ${toml([command, ...rest])}`,
    `warm = ${warm}`,
    `handshake_timeout = "60s"`,
    `[providers.${opts.agent}.env]`,
    ...Object.entries(env).map(([k, v]) => `${k} = ${toml(v)}`),
    "",
  ];
  const file = `${root}/acpd.toml`;
  writeFileSync(file, lines.join("\n"));
  return file;
}

/**
 * How to start one side: `connect()` spawns the process the editor talks to; `stop()` ends
 * what else the side started (acpd serve). `label` names it in errors.
 */
async function sideProcess(kind, root, port, { warm = 0 } = {}) {
  const dirs = sideDirs(root);
  const agentEnv = AGENT.setup(root, port, dirs);
  const base = { PATH: process.env.PATH, LANG: "C.UTF-8", ...dirs };
  if (kind === "direct") {
    const [command, ...argv] = AGENT.argv(root);
    return { connect: () => [command, argv, { ...base, ...agentEnv }], stop: async () => {} };
  }
  if (!opts.acpd) throw new Error(`side ${kind} needs --acpd BIN`);
  const network = kind === "https" || kind === "wss";
  if (network && !(opts.cert && opts.key)) throw new Error(`side ${kind} needs --cert PEM --key PEM`);
  if (network && process.env.NODE_EXTRA_CA_CERTS !== opts.cert) throw new Error(`side ${kind} needs NODE_EXTRA_CA_CERTS=${opts.cert} (node trusts it only from its start)`);
  const config = acpdConfig(root, agentEnv, { warm, tls: network });
  const acpdEnv = { ...base, STATE_DIRECTORY: `${root}/state`, XDG_RUNTIME_DIR: `${root}/run`, ACPD_LOG: process.env.ACPD_LOG ?? "warn" };
  mkdirSync(`${root}/run`, { recursive: true, mode: 0o700 });
  if (kind === "stdio") {
    return { connect: () => [opts.acpd, ["--config", config, "stdio"], acpdEnv], stop: async () => {} };
  }
  // serve + connect, or serve with a network listener for https / wss
  const socket = `${root}/run/acpd.sock`;
  const listen = network ? ["--listen", "https://127.0.0.1:0"] : [];
  const serve = spawn(opts.acpd, ["--config", config, "serve", "--socket", socket, ...listen], { env: acpdEnv, stdio: ["ignore", "ignore", "pipe"] });
  const serveErr = [];
  serve.stderr.on("data", (c) => serveErr.push(c));
  const served = new Promise((resolve) => serve.once("exit", (code, signal) => resolve(code ?? signal)));
  let exited = null;
  served.then((c) => (exited = c));
  await until(() => existsSync(socket) || exited !== null, "acpd serve's socket");
  if (exited !== null) throw new Error(`acpd serve exited (${exited}): ${Buffer.concat(serveErr).toString().slice(-2000)}`);
  let face = null;
  if (network) {
    try {
      face = { ...(await faceOf(kind, config, socket, acpdEnv, root)), served };
    } catch (e) {
      // Nobody would stop this daemon otherwise: the side ends here.
      serve.kill("SIGKILL");
      throw e;
    }
  }
  return {
    connect: () => face ?? [opts.acpd, ["connect", "--socket", socket], { PATH: process.env.PATH }],
    serveStderr: () => Buffer.concat(serveErr).toString("utf8"),
    stop: async () => {
      serve.kill("SIGTERM");
      try {
        return await withDeadline(served, "acpd serve exit", 15_000);
      } catch {
        serve.kill("SIGKILL");
        return "killed";
      }
    },
  };
}

/** `acpd <args> --socket S`'s stdout, run as the side's acpd (its config, state and env). */
async function cli(config, socket, env, args) {
  const child = spawn(opts.acpd, ["--config", config, ...args, "--socket", socket], { env, stdio: ["ignore", "pipe", "pipe"] });
  const out = [];
  const err = [];
  child.stdout.on("data", (c) => out.push(c));
  child.stderr.on("data", (c) => err.push(c));
  const code = await withDeadline(new Promise((resolve) => child.once("exit", (c, sig) => resolve(c ?? sig))), `acpd ${args.join(" ")}`, EXIT_MS);
  if (code !== 0) throw new Error(`acpd ${args.join(" ")} exited (${code}): ${Buffer.concat(err).toString()}`);
  return Buffer.concat(out).toString("utf8");
}

/** The side's token: made once per side directory (the state DB keeps it across restarts). */
const tokens = new Map();

/**
 * The network face of the side's `acpd serve` as the editor reaches it: the TypeScript SDK's
 * Streamable HTTP client (`https`) or WebSocket client (`wss`, on the pinned `ws`), holding a
 * token from `acpd token create` and trusting the test's certificate through
 * NODE_EXTRA_CA_CERTS (read by node at its start, so the caller sets it).
 */
async function faceOf(kind, config, socket, env, root) {
  if (!tokens.has(root)) {
    const printed = await cli(config, socket, env, ["token", "create", `differential-${kind}`]);
    const token = printed.split(/\s+/).find((w) => w.startsWith("acpd_"));
    if (!token) throw new Error(`acpd token create printed no token: ${printed}`);
    tokens.set(root, token);
  }
  const headers = { Authorization: `Bearer ${tokens.get(root)}` };
  const url = await until(async () => JSON.parse(await cli(config, socket, env, ["status", "--json"])).listening?.[0], "the face's listener");
  return {
    open: () =>
      kind === "https"
        ? createHttpStream(url, { headers })
        : createWebSocketStream(url.replace(/^https:/, "wss:"), { headers, WebSocket }),
  };
}

/** A new client app recording into `seen`; every side's editor is this one. */
function editor(seen) {
  return acp
    .client({ name: "acpd-differential", version: "1.0.0" })
    .onNotification("session/update", ({ params }) => {
      seen.updates.push(params);
    })
    .onNotification("*", ({ method }) => {
      seen.notifications.push(method);
    })
    .onRequest("session/request_permission", () => {
      seen.requests.push("session/request_permission");
      return { outcome: { outcome: "cancelled" } };
    })
    .onNotification("elicitation/complete", ({ params }) => {
      seen.completes.push(params);
    })
    .onRequest("elicitation/create", async ({ params, signal }) => {
      seen.requests.push("elicitation/create");
      seen.elicitations.push(params);
      if (params?.message === ELICIT_ACCEPT) return { action: "accept", content: { name: "Ada" } };
      if (params?.message !== ELICIT_CANCELLED) return { action: "decline" };
      // The agent cancels this one with `$/cancel_request`: answered -32800 once that arrives.
      const cancelled = await withDeadline(
        new Promise((resolve) => (signal.aborted ? resolve(true) : signal.addEventListener("abort", () => resolve(true), { once: true }))),
        "the agent's $/cancel_request",
        CANCEL_MS,
      ).catch(() => false);
      seen.elicitationCancels.push(cancelled);
      if (cancelled) throw signal.reason;
      return { action: "decline" };
    });
}

/**
 * Runs `[command, argv, env]` as an ACP agent over its stdio with `body(ctx, seen)` as the
 * client, then closes its stdin and waits for it to exit; or, for a network side (`{open,
 * served}`), runs the client on the stream `open()` makes, which the SDK closes (DELETE, a
 * WebSocket close) when `body` is done. A network side has no process of its own, so no stderr.
 */
async function connection(label, target, cwd, rec, body) {
  const seen = { updates: [], notifications: [], requests: [], elicitations: [], completes: [], elicitationCancels: [] };
  const app = editor(seen);
  if (!Array.isArray(target)) {
    const died = target.served.then((code) => {
      throw new Error(`${label}: acpd serve exited (${code}) before the client was done`);
    });
    try {
      await Promise.race([app.connectWith(target.open(), (ctx) => body(ctx, seen)), died]);
    } catch (e) {
      rec.error = errorOf(e);
    }
    rec.stderrBytes = 0;
    rec.stderrTail = "";
    return;
  }
  const [command, argv, env] = target;
  const child = spawn(command, argv, { env, cwd, stdio: ["pipe", "pipe", "pipe"] });
  const stderr = [];
  child.stderr.on("data", (c) => stderr.push(c));
  const exited = new Promise((resolve) => child.once("exit", (code, signal) => resolve(code ?? signal)));
  const out = new PassThrough();
  child.stdout.on("data", (c) => {
    if (!out.destroyed && !out.writableEnded) out.write(c);
  });
  child.stdout.on("end", () => out.end());
  child.stdin.on("error", () => {});
  const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(out));
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
    child.kill("SIGTERM");
    try {
      rec.exit = { error: errorOf(e), after: await withDeadline(exited, `${label} exit after SIGTERM`, 5_000) };
    } catch {
      child.kill("SIGKILL");
      rec.exit = { error: errorOf(e), after: "SIGKILL" };
    }
  }
  rec.stderrBytes = Buffer.concat(stderr).length;
  rec.stderrTail = Buffer.concat(stderr).toString("utf8").split("\n").slice(-12).join("\n");
}

// ---- normalization ------------------------------------------------------------------------

/** Maps one side's session ids to `<S1>`, `<S2>`… in order of first appearance. */
class Normalizer {
  constructor(root) {
    this.ids = new Map();
    this.root = root;
  }
  id(raw) {
    if (typeof raw !== "string" || raw === UNKNOWN_ID) return raw;
    if (!this.ids.has(raw)) this.ids.set(raw, `<S${this.ids.size + 1}>`);
    return this.ids.get(raw);
  }
  str(s) {
    if (this.ids.has(s)) return this.ids.get(s);
    if (/^\d{4}-\d\d-\d\dT\d\d:\d\d/.test(s)) return "<time>";
    if (s === TITLE || s === PROMPT) return "<title>";
    let out = s.split(this.root).join("<root>");
    for (const [raw, id] of this.ids) if (raw.length >= 8) out = out.split(raw).join(id);
    return out;
  }
  value(v, key = "") {
    if (typeof v === "string") return key === "sessionId" || key === "parentSessionId" ? this.id(v) : this.str(v);
    if (typeof v === "number" && /(At|time|Time|timestamp)$/.test(key)) return "<time>";
    if (Array.isArray(v)) return v.map((x) => this.value(x));
    if (v && typeof v === "object") {
      const out = {};
      for (const k of Object.keys(v).sort()) {
        if (k === "_meta") {
          const { acpd, ...rest } = v._meta ?? {};
          if (Object.keys(rest).length) out._meta = this.value(rest, "_meta");
          continue;
        }
        out[k] = this.value(v[k], k);
      }
      return out;
    }
    return v;
  }
}

/** The compared summary of a list of session/updates. */
function turnOf(norm, updates) {
  const kinds = [];
  const texts = {};
  const sessions = new Set();
  for (const u of updates) {
    const kind = u.update?.sessionUpdate;
    if (UNORDERED.has(kind)) continue;
    if (kind === "user_message_chunk" && u.update?.content?.text === INTERRUPTED) continue;
    sessions.add(norm.id(u.sessionId));
    kinds.push(kind);
    if (u.update?.content?.type === "text") texts[kind] = (texts[kind] ?? "") + u.update.content.text;
  }
  return { kinds, texts: norm.value(texts), sessions: [...sessions].sort() };
}

// ---- the sequence -------------------------------------------------------------------------

/**
 * One side: the whole sequence on one connection. `rows[method]` gets `{answer}` or
 * `{error}` (normalized) or `{offered: false, why}`.
 */
async function sequence(label, proc, project, root, mock, rec) {
  const norm = new Normalizer(root);
  const rows = {};
  rec.rows = rows;
  const notOffered = (name, why) => (rows[name] = { offered: false, why });
  await connection(label, proc.connect(), project, rec, async (ctx, seen) => {
    /** The last request's own promise (still pending after a step's deadline passed). */
    let raw = null;
    /** Sends a request; records its normalized answer or error under `name`. */
    const call = async (name, method, params, options, limit = STEP_MS) => {
      const started = performance.now();
      try {
        raw = ctx.request(method, params, options);
        raw.catch(() => {});
        const answer = await withDeadline(raw, method, limit);
        rows[name] = { answer: norm.value(answer ?? null) };
        return answer ?? {};
      } catch (e) {
        rows[name] = { error: norm.value(errorOf(e)) };
        return null;
      } finally {
        (rec.ms ??= {})[name] = Math.round(performance.now() - started);
      }
    };
    /** A call whose session/updates (those sent before the answer) are part of the row. */
    const turn = async (name, method, params, options, limit) => {
      const before = seen.updates.length;
      const answer = await call(name, method, params, options, limit);
      rows[name].updates = turnOf(norm, seen.updates.slice(before));
      return answer;
    };
    /**
     * A prompt that waits on the mock (HANG), cancelled by `cancel` once the mock has it; the
     * scripted child streams the HANG line and then waits (`:hang`) until it is cancelled.
     */
    const cancelled = async (name, sessionId, cancel) => {
      const seenBefore = mock.requests.length;
      const updatesBefore = seen.updates.length;
      const text = AGENT.scripted ? `HANG ${name}\n:hang` : `HANG ${name}`;
      const controller = new AbortController();
      const pending = turn(name, "session/prompt", { sessionId, prompt: [{ type: "text", text }] }, { cancellationSignal: controller.signal }, CANCEL_MS);
      const hanging = AGENT.scripted
        ? () => seen.updates.slice(updatesBefore).some((u) => u.update?.content?.text?.startsWith("HANG"))
        : () => mock.requests.slice(seenBefore).some((r) => r.user?.startsWith("HANG"));
      try {
        await until(hanging, "the HANG turn under way");
        await cancel(controller);
      } catch (e) {
        rows[name] = { error: errorOf(e) };
      }
      await pending;
      if (rows[name].error?.code === "timeout") {
        // The cancel did not end the turn: end it the other way, so the sequence goes on.
        await ctx.notify("session/cancel", { sessionId });
        await withDeadline(raw, "the turn to end after session/cancel", EXIT_MS).catch(() => {});
      }
    };

    const init = await call("initialize", "initialize", { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: AGENT.clientCapabilities ?? {} });
    if (!init) throw new Error(`initialize failed: ${JSON.stringify(rows.initialize)}`);
    const caps = init.agentCapabilities ?? {};
    const sc = caps.sessionCapabilities ?? {};
    const methods = init.authMethods ?? [];
    if (methods.length) {
      const m = methods.find((x) => /api-key|apikey/i.test(x.id)) ?? methods[0];
      await call("authenticate", "authenticate", { methodId: m.id });
    } else notOffered("authenticate", "no authMethods");

    const created = await turn("session/new", "session/new", { cwd: project, mcpServers: [] });
    if (!created?.sessionId) throw new Error(`session/new failed: ${JSON.stringify(rows["session/new"])}`);
    const A = created.sessionId;
    norm.id(A);
    await turn("session/prompt", "session/prompt", { sessionId: A, prompt: [{ type: "text", text: PROMPT }] });
    await cancelled("session/cancel", A, () => ctx.notify("session/cancel", { sessionId: A }));
    await cancelled("$/cancel_request (editor → agent)", A, async (c) => c.abort());
    if (!AGENT.scripted) {
      for (const n of ["elicitation/create", "elicitation/complete", "$/cancel_request (agent → editor)"]) {
        rows[n] = { run: false, why: "the agent elicits only from a tool call the mock does not script" };
      }
    } else {
      /** A scripted turn whose row also holds what the editor was asked and told meanwhile. */
      const asked = async (name, script) => {
        const from = { e: seen.elicitations.length, c: seen.completes.length, x: seen.elicitationCancels.length };
        await turn(name, "session/prompt", { sessionId: A, prompt: [{ type: "text", text: script }] });
        rows[name].elicitations = norm.value(seen.elicitations.slice(from.e));
        rows[name].completes = norm.value(seen.completes.slice(from.c));
        rows[name].cancelled = seen.elicitationCancels.slice(from.x);
      };
      await asked("elicitation/create", `:request elicitation/create ${elicitForm(ELICIT_ACCEPT)}\ndone`);
      await asked("elicitation/complete", `:notify-json elicitation/complete {"elicitationId":"el-1"}\ndone`);
      await asked("$/cancel_request (agent → editor)", `:cancel-request elicitation/create ${elicitForm(ELICIT_CANCELLED)}\ndone`);
    }

    if (sc.list) await call("session/list", "session/list", { cwd: project });
    else notOffered("session/list", "no sessionCapabilities.list");
    const load = (name) => turn(name, "session/load", { sessionId: A, cwd: project, mcpServers: [] });
    const resume = (name) => turn(name, "session/resume", { sessionId: A, cwd: project, mcpServers: [] });
    if (caps.loadSession) await load("session/load (open)");
    else notOffered("session/load (open)", "no loadSession");
    if (sc.resume) await resume("session/resume (open)");
    else notOffered("session/resume (open)", "no sessionCapabilities.resume");
    if (sc.fork) {
      const fork = await call("session/fork", "session/fork", { sessionId: A, cwd: project, mcpServers: [] });
      if (fork?.sessionId) {
        norm.id(fork.sessionId);
        await turn("session/prompt (fork)", "session/prompt", { sessionId: fork.sessionId, prompt: [{ type: "text", text: "hello fork" }] });
      }
    } else notOffered("session/fork", "no sessionCapabilities.fork");
    const modes = created.modes?.availableModes ?? [];
    const mode = modes.find((m) => m.id !== created.modes?.currentModeId);
    if (mode) await call("session/set_mode", "session/set_mode", { sessionId: A, modeId: mode.id });
    else notOffered("session/set_mode", "no other mode in session/new");
    const models = created.models?.availableModels ?? [];
    const model = models.find((m) => m.modelId !== created.models?.currentModelId) ?? models[0];
    if (model) await call("session/set_model", "session/set_model", { sessionId: A, modelId: model.modelId });
    else notOffered("session/set_model", "no models in session/new");
    // A mode-like option first: a model option may name models only the network serves.
    const selects = (created.configOptions ?? []).filter((o) => o.type === "select" && (o.options ?? []).length > 1);
    const option = selects.find((o) => o.category === "mode") ?? selects.find((o) => o.category !== "model") ?? selects[0];
    if (option) {
      const flat = option.options.flatMap((o) => o.options ?? [o]);
      const value = flat.find((o) => o.value !== option.currentValue) ?? flat[0];
      await call("session/set_config_option", "session/set_config_option", { sessionId: A, configId: option.id, value: value.value });
    } else notOffered("session/set_config_option", "no select config option in session/new");

    if (sc.close) {
      await call("session/close", "session/close", { sessionId: A });
      if (sc.resume) {
        await resume("session/resume (closed)");
        await call("session/close (again)", "session/close", { sessionId: A });
      } else notOffered("session/resume (closed)", "no sessionCapabilities.resume");
      if (caps.loadSession) await load("session/load (closed)");
      else notOffered("session/load (closed)", "no loadSession");
    } else {
      for (const n of ["session/close", "session/resume (closed)", "session/load (closed)"]) notOffered(n, "no sessionCapabilities.close");
    }
    if (sc.delete) {
      await call("session/delete", "session/delete", { sessionId: A });
      await call("session/delete (unknown id)", "session/delete", { sessionId: UNKNOWN_ID });
    } else {
      for (const n of ["session/delete", "session/delete (unknown id)"]) notOffered(n, "no sessionCapabilities.delete");
    }
    await call("_unknown method", "_differential/unknown", {});
    if (caps.auth?.logout) await call("logout", "logout", {});
    else notOffered("logout", "no agentCapabilities.auth.logout");
    rec.notifications = [...new Set(seen.notifications)].sort();
    rec.clientRequests = seen.requests;
  });
  rows["agent stderr"] = { answer: { someStderr: rec.stderrBytes > 0 } };
}

// ---- a load after a restart ----------------------------------------------------------------

/** The row of a session loaded by a new agent (or a new acpd with `warm = 1`). */
const RESTARTED = "session/load (after a restart, warm = 1)";
const RESTART_PROMPT = "hello before the restart";

/** initialize and, when the agent offers a method, authenticate, as the sequence does. */
async function handshake(ctx) {
  const init = await withDeadline(ctx.request("initialize", { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: AGENT.clientCapabilities ?? {} }), "initialize");
  const methods = init.authMethods ?? [];
  if (methods.length) {
    const m = methods.find((x) => /api-key|apikey/i.test(x.id)) ?? methods[0];
    await withDeadline(ctx.request("authenticate", { methodId: m.id }), "authenticate");
  }
  return init;
}

/**
 * A session made and prompted on one connection, then loaded on the next after the process
 * the editor talks to was started again: the agent directly (started in the project, as an
 * editor starts it), or a new `acpd stdio` / `acpd serve` with `warm = 1` (the first had
 * none), started in the side's home (acpd's own cwd must not matter: the load names the
 * project) and loaded once its spare is ready: the load must run in the project, not where
 * the spare was started (an agent that reads its process's cwd, as gemini-cli reads its
 * workspace settings and `.env`, would load elsewhere). gemini-cli 0.61 answers this load
 * "No previous sessions found for this project" directly too (see development.md). The row
 * holds the load's answer, whether the replay brought the first prompt back (by the answer
 * of a prompt after it, whose updates the agent sends after the replay's), and that prompt's
 * stop reason.
 */
async function restarted(kind, root, mock, project, rec) {
  const rows = rec.rows;
  const norm = new Normalizer(root);
  let made = null;
  let offered = true;
  const life = async (label, cwd, warm, body) => {
    const proc = await sideProcess(kind, root, mock.port, { warm });
    const r = {};
    await connection(`${opts.agent} ${kind} ${label}`, proc.connect(), cwd, r, body);
    await proc.stop();
    if (r.error && !rows[RESTARTED]) {
      rows[RESTARTED] = { error: norm.value(r.error) };
      rec.restartStderrTail = r.stderrTail;
    }
  };
  await life("before the restart", project, 0, async (ctx) => {
    const init = await handshake(ctx);
    if (!init.agentCapabilities?.loadSession) {
      offered = false;
      return;
    }
    const s = await withDeadline(ctx.request("session/new", { cwd: project, mcpServers: [] }), "session/new");
    made = s.sessionId;
    await withDeadline(ctx.request("session/prompt", { sessionId: made, prompt: [{ type: "text", text: RESTART_PROMPT }] }), "session/prompt");
  });
  if (!offered) return void (rows[RESTARTED] = { offered: false, why: "no loadSession" });
  if (!made || rows[RESTARTED]) return;
  const home = `${root}/home`;
  await life("after the restart", kind === "direct" ? project : home, 1, async (ctx, seen) => {
    await handshake(ctx);
    if (kind !== "direct") {
      const deadline = performance.now() + STEP_MS;
      for (;;) {
        const st = await withDeadline(ctx.request("_acpd/status", {}), "_acpd/status");
        if ((st?.spares?.[opts.agent] ?? 0) >= 1) break;
        if (performance.now() > deadline) throw new Error(`no warm spare in ${STEP_MS} ms: ${JSON.stringify(st)}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    }
    const before = seen.updates.length;
    const row = {};
    rows[RESTARTED] = row;
    try {
      const answer = await withDeadline(ctx.request("session/load", { sessionId: made, cwd: project, mcpServers: [] }), "session/load");
      row.answer = norm.value(answer ?? null);
    } catch (e) {
      row.error = norm.value(errorOf(e));
      return;
    }
    try {
      const after = await withDeadline(ctx.request("session/prompt", { sessionId: made, prompt: [{ type: "text", text: "hello after the restart" }] }), "session/prompt");
      row.then = after?.stopReason ?? null;
    } catch (e) {
      row.then = norm.value(errorOf(e));
    }
    row.replayed = seen.updates.slice(before).some((u) => u.update?.content?.text === RESTART_PROMPT);
  });
}

// ---- comparison ---------------------------------------------------------------------------

/** Where two normalized values differ: up to 4 `path: a ≠ b` lines. */
function diff(a, b, path = "", out = []) {
  if (out.length >= 4) return out;
  if (JSON.stringify(a) === JSON.stringify(b)) return out;
  if (a && b && typeof a === "object" && typeof b === "object" && Array.isArray(a) === Array.isArray(b)) {
    const keys = [...new Set([...Object.keys(a), ...Object.keys(b)])];
    for (const k of keys) diff(a[k], b[k], `${path}.${k}`, out);
    return out;
  }
  const short = (v) => {
    const s = JSON.stringify(v);
    return s === undefined ? "(absent)" : s.length > 160 ? `${s.slice(0, 160)}…` : s;
  };
  out.push(`${path || "."}: ${short(a)} ≠ ${short(b)}`);
  return out;
}

function compare(report, sides) {
  const direct = report.sides.direct?.rows ?? {};
  const table = {};
  const diffs = {};
  const names = [...new Set(sides.flatMap((s) => Object.keys(report.sides[s]?.rows ?? {})))];
  for (const name of names) {
    table[name] = {};
    for (const s of sides.filter((x) => x !== "direct")) {
      const d = direct[name];
      const o = report.sides[s]?.rows?.[name];
      let verdict;
      if (d?.run === false) verdict = "not run";
      else if (d?.offered === false) verdict = o?.offered === false ? "not offered" : "differs";
      else if (!d || !o) verdict = "differs";
      else verdict = JSON.stringify(d) === JSON.stringify(o) ? "same" : "differs";
      table[name][s] = verdict;
      if (verdict === "differs") (diffs[name] ??= {})[s] = d && o ? diff(d, o) : [`${d ? "" : "direct: no row"}${o ? "" : `${s}: no row`}`];
    }
  }
  return { table, diffs };
}

function text(report, sides) {
  const others = sides.filter((s) => s !== "direct");
  const names = Object.keys(report.table);
  const w = Math.max(...names.map((n) => n.length), 6);
  const lines = [`${opts.agent}: method${" ".repeat(w - 6)}  ${others.map((s) => s.padEnd(12)).join("")}`];
  for (const n of names) {
    lines.push(`  ${n.padEnd(w)}  ${others.map((s) => report.table[n][s].padEnd(12)).join("")}`);
    for (const [s, d] of Object.entries(report.diffs[n] ?? {})) for (const l of d) lines.push(`      ${s}: ${l}`);
  }
  return lines.join("\n");
}

// ---- warm start ---------------------------------------------------------------------------

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.floor(s.length / 2)] : null;
}

/**
 * The warm-start row: the agent's own cold start (spawn + initialize + session/new, directly)
 * against a `session/new` through `acpd stdio` with `warm = 1` once the spare is ready.
 */
async function bench(n, project, mock) {
  const out = { cold: [], warm: [], coldNew: [] };
  for (let i = 0; i < n; i++) {
    const proc = await sideProcess("direct", `${opts.work}/bench-cold-${i}`, mock.port);
    const rec = {};
    await connection(`cold ${i}`, proc.connect(), project, rec, async (ctx) => {
      const t = performance.now();
      await withDeadline(ctx.request("initialize", { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: {} }), "initialize");
      const t1 = performance.now();
      await withDeadline(ctx.request("session/new", { cwd: project, mcpServers: [] }), "session/new");
      out.coldNew.push(performance.now() - t1);
      out.cold.push(performance.now() - t);
    });
    // Spawn time counts: measured from just before the spawn (connection() spawns, then the
    // SDK's first write) — the gap is a few ms, small against any agent's start.
    if (rec.error) out.coldError = { ...rec.error, stderrTail: rec.stderrTail };
  }
  const proc = await sideProcess("stdio", `${opts.work}/bench-warm`, mock.port, { warm: 1 });
  const rec = {};
  await connection("warm", proc.connect(), project, rec, async (ctx) => {
    await withDeadline(ctx.request("initialize", { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: {} }), "initialize");
    for (let i = 0; i < n; i++) {
      const deadline = performance.now() + 60_000;
      for (;;) {
        const st = await withDeadline(ctx.request("_acpd/status", {}), "_acpd/status");
        if ((st?.spares?.[opts.agent] ?? 0) >= 1) break;
        if (performance.now() > deadline) throw new Error(`no warm spare in 60 s: ${JSON.stringify(st)}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      const t = performance.now();
      const s = await withDeadline(ctx.request("session/new", { cwd: project, mcpServers: [] }), "session/new");
      out.warm.push(performance.now() - t);
      try {
        await withDeadline(ctx.request("session/close", { sessionId: s.sessionId }), "session/close", 10_000);
      } catch {
        // An agent without close keeps the session; n stays far below the session limit.
      }
    }
  });
  if (rec.error) out.warmError = { ...rec.error, stderrTail: rec.stderrTail };
  const c = median(out.cold);
  const w = median(out.warm);
  return { n, coldMs: c && Math.round(c), coldSessionNewMs: median(out.coldNew) && Math.round(median(out.coldNew)), warmMs: w && Math.round(w), ratio: c && w ? Math.round((w / c) * 1000) / 1000 : null, raw: out };
}

// ---- main ---------------------------------------------------------------------------------

async function main() {
  const report = { agent: opts.agent, sides: {}, timings: {} };
  const project = `${opts.work}/project`;
  mkdirSync(project, { recursive: true });
  const sides = opts.sides.split(",").filter(Boolean);
  const mocks = [];
  try {
    // The sides run at once, each with its own mock (a HANG turn is recognised by the requests
    // its own mock got) and its own directories; they share only the project directory.
    await Promise.all(
      sides.map(async (kind) => {
        const root = `${opts.work}/${kind}`;
        mkdirSync(root, { recursive: true });
        const rec = {};
        report.sides[kind] = rec;
        const t = performance.now();
        try {
          const mock = await startMock(`${root}/mock-requests.jsonl`);
          mocks.push(mock);
          const proc = await sideProcess(kind, root, mock.port);
          await sequence(`${opts.agent} ${kind}`, proc, project, root, mock, rec);
          const stopped = await proc.stop();
          if (stopped !== undefined) rec.serveExit = stopped;
          await restarted(kind, root, mock, project, rec);
          rec.modelRequests = mock.requests.length;
        } catch (e) {
          rec.error ??= errorOf(e);
        }
        report.timings[kind] = Math.round(performance.now() - t);
      }),
    );
    Object.assign(report, compare(report, sides));
    report.text = text(report, sides);
    if (opts.bench) {
      const t = performance.now();
      const mock = await startMock(`${opts.work}/bench-requests.jsonl`);
      mocks.push(mock);
      report.bench = await bench(Number(opts.bench), project, mock).catch((e) => ({ error: errorOf(e) }));
      report.timings.bench = Math.round(performance.now() - t);
    }
  } finally {
    for (const m of mocks) m.mock.stdin.end();
  }
  return report;
}

/**
 * The whole run's budget (all sides at once): opencode through acpd starts ~8 agents per side,
 * and the load after a restart two processes more (with a spare) per side.
 */
const TOTAL_MS = Number(process.env.DIFFERENTIAL_TOTAL_MS ?? 300_000);
/** Prints the report and exits once it is written (a pipe takes large writes in pieces). */
function finish(report) {
  process.stdout.write(JSON.stringify(report) + "\n", () => process.exit(0));
}
setTimeout(() => finish({ agent: opts.agent, error: { code: "timeout", message: `the whole run took over ${TOTAL_MS} ms` } }), TOTAL_MS).unref();
finish(await main().catch((e) => ({ agent: opts.agent, error: errorOf(e) })));
