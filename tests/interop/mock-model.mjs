// A stand-in for the Anthropic Messages API on 127.0.0.1 (random port), so the real
// claude-agent-acp (and the Claude Code binary it drives) runs offline and deterministically.
//
// Usage: `node mock-model.mjs [LOG]` prints `{"port":N}` as its first stdout line, then serves
// until stdin closes (its parent went away) or SIGTERM. Every request is appended to LOG (one
// JSON line: method, path, model, stream, the start of the last user text) when given, so a
// failing test can say what the agent asked for. With MOCK_DUMP set, whole bodies go to
// LOG.bodies too (for learning what a new agent version sends).
//
// What claude-agent-acp 0.101.0 (Claude Agent SDK 0.3.318) was seen to call, and the answers:
// - `HEAD /api/hello`, a connectivity probe, a few times per process: 404 (it carries on).
// - `POST /v1/messages`, `stream: true`, for the turn: one assistant text turn as server-sent
//   events (`message_start`, `content_block_start`, two `content_block_delta` text deltas,
//   `content_block_stop`, `message_delta` with `stop_reason: "end_turn"`, `message_stop`). The
//   text is `REPLY <last user text>`, so the test sees the prompt went through the model; two
//   deltas so a bridge that keeps only one chunk shows.
// - `POST /v1/messages`, `stream: true`, for the session title (its instructions ask for JSON
//   with a single "title" field): `{"title":"Differential session"}`, so the title is fixed.
// - `POST /v1/messages` without `stream` (not seen, answered for safety): the same reply as
//   one JSON message. `POST /v1/messages/count_tokens` (not seen): `{"input_tokens": 10}`.
// - Anything else: 404 with an Anthropic-shaped error body.
// Usage numbers are fixed (10 input tokens, a few output), so the agent's `usage_update`s are
// too, unless a user text of the request says `MOCK_USAGE=<n>` (tests/agents/isolation_claude.rs,
// a token budget): every reply to it then reports n input tokens.
//
// A scripted tool call (delegate.mjs, tests/agents/real_delegate.rs): a turn whose user text is
// `DELEGATE <json>` is answered with a `tool_use` of the tool whose name ends in `__delegate`
// (Claude Code names MCP tools `mcp__<server>__<tool>`), with the JSON as its input, streamed as
// `content_block_start` (tool_use, empty input), two `input_json_delta`s and `stop_reason:
// "tool_use"`. Claude Code defers MCP tools by default (tool search): the request then offers
// `ToolSearch` and only names `mcp__acpd__delegate` in a system reminder, so the mock first
// calls `ToolSearch` with `select:<that name>`, as a model does; Claude Code runs it itself
// and its next request offers the tool (its last user message: the ToolSearch result and the
// text "Tool loaded."). Without the tool in the request the reply is `NO DELEGATE TOOL
// <names>`, so a test says what the agent offered instead. The request that carries the
// delegate's `tool_result` (in the last user message, which Claude Code may follow with a
// `system` one) is answered `RESULT <its text>` (`RESULT ERROR <its text>` for an error):
// Claude Code puts the tool's `structuredContent` there as JSON when it has one, else its text.
// A cancelled call's result comes with the next prompt, in the same message as its text; a
// `DELEGATE` text there is a new ask. After each turn Claude Code sends a prompt-suggestion
// query ("[SUGGESTION MODE: …]", with tools), answered as any text turn. With MOCK_TOOLS set,
// the log line of every request also names the tools it offered and carries its tool results
// whole, so a test asserts on what reached the model.
//
// A scripted Bash call (tests/agents/tool_filter.rs): a turn whose user text is `BASH <command>`
// is answered with a `tool_use` of `Bash` running that command, whether or not the request
// offers Bash; its tool_result is answered `RESULT <text>` (`RESULT ERROR <text>`).
//
// A scripted file edit (tests/agents/isolation_claude.rs): a turn whose user text is
// `WRITE <path> <content>` (path without spaces; relative to the session's directory, which
// Claude Code names in its system prompt as `Primary working directory: <dir>`) is answered
// with a `Read` of the file (Claude Code refuses to overwrite a file it has not read), then,
// on the Read's tool_result (an error too: the file may not exist yet), a `Write` of
// `<content>` and a newline; the Write's tool_result is answered `RESULT <text>`.
import { createServer } from "node:http";
import { isAbsolute, join } from "node:path";
import { appendFileSync } from "node:fs";
import { anyUserText, hang, hangs, other } from "./mock-apis.mjs";

const log = process.argv[2];

function lastUserText(body) {
  const messages = Array.isArray(body.messages) ? body.messages : [];
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i];
    if (m.role !== "user") continue;
    if (typeof m.content === "string") return m.content;
    if (Array.isArray(m.content)) {
      const texts = m.content
        .filter((b) => b.type === "text" && !b.text.startsWith("<system-reminder>"))
        .map((b) => b.text);
      if (texts.length) return texts[texts.length - 1];
    }
  }
  return "";
}

/** Every text of the request (system prompt and messages), for recognizing side queries. */
function allText(body) {
  const texts = [];
  const collect = (content) => {
    if (typeof content === "string") texts.push(content);
    else if (Array.isArray(content)) for (const b of content) if (typeof b?.text === "string") texts.push(b.text);
  };
  collect(body.system);
  for (const m of Array.isArray(body.messages) ? body.messages : []) collect(m.content);
  return texts.join("\n");
}

/** The reply's text: a fixed title for the title query, else the prompt echoed after a marker. */
function replyFor(body) {
  if (allText(body).includes('a single "title" field')) return JSON.stringify({ title: TITLE });
  const result = freshAsk(body) ? null : lastToolResult(body);
  if (result && result.name !== TOOL_SEARCH) return `RESULT ${result.isError ? "ERROR " : ""}${result.text}`;
  return `REPLY ${lastUserText(body).trim()}`;
}

/** The marker of a user turn that asks for a scripted delegate call; the rest is its input. */
const DELEGATE = "DELEGATE ";

/** The names of the tools the request offers the model. */
function toolNames(body) {
  return Array.isArray(body.tools) ? body.tools.map((t) => t?.name).filter((n) => typeof n === "string") : [];
}

/** The text of a tool_result block (a string, or text blocks). */
function resultText(block) {
  if (typeof block.content === "string") return block.content;
  if (Array.isArray(block.content)) return block.content.filter((c) => c?.type === "text").map((c) => c.text).join("");
  return "";
}

/** The name of the tool the assistant called with this id, from the request's history. */
function toolNameOf(body, id) {
  for (const m of Array.isArray(body.messages) ? body.messages : []) {
    if (m.role !== "assistant" || !Array.isArray(m.content)) continue;
    const use = m.content.find((b) => b?.type === "tool_use" && b.id === id);
    if (use) return use.name;
  }
  return null;
}

/** Every tool_result the request carries, in order: what the agent told the model its tools did. */
function toolResults(body) {
  const out = [];
  for (const m of Array.isArray(body.messages) ? body.messages : []) {
    if (m.role !== "user" || !Array.isArray(m.content)) continue;
    for (const b of m.content) {
      if (b?.type === "tool_result") {
        out.push({ toolUseId: b.tool_use_id, name: toolNameOf(body, b.tool_use_id), isError: b.is_error === true, text: resultText(b) });
      }
    }
  }
  return out;
}

/** The last user or assistant message (Claude Code may end the list with a `system` one). */
function lastTurn(body) {
  const messages = Array.isArray(body.messages) ? body.messages : [];
  return messages.findLast((m) => m?.role === "user" || m?.role === "assistant") ?? null;
}

/** The tool_result in the last message, when the last message is the answer to a tool call. */
function lastToolResult(body) {
  const last = lastTurn(body);
  if (last?.role !== "user" || !Array.isArray(last.content)) return null;
  const block = last.content.find((b) => b?.type === "tool_result");
  return block ? { name: toolNameOf(body, block.tool_use_id), isError: block.is_error === true, text: resultText(block) } : null;
}

/**
 * The `DELEGATE <json>` text of the last message, when it is a user turn that asks: a new ask
 * even when the same message also carries the result of an interrupted earlier call (Claude
 * Code sends a cancelled call's tool_result with the next prompt).
 */
function freshAsk(body) {
  const last = lastTurn(body);
  if (last?.role !== "user") return null;
  const texts = typeof last.content === "string" ? [last.content] : Array.isArray(last.content) ? last.content.filter((b) => b?.type === "text").map((b) => b.text) : [];
  return texts.map((t) => t.trim()).findLast((t) => t.startsWith(DELEGATE)) ?? null;
}

/** The marker of a user turn that asks for a scripted `Bash` call; the rest is its command. */
const BASH = "BASH ";

/**
 * `{name: "Bash", input}` when the last message is a user turn whose text is `BASH <command>`:
 * asked whether or not the request offers Bash (a model that ignores its tool list, so a test
 * sees what the agent and acpd do with a tool call that was filtered out). The request that
 * carries its tool_result is answered `RESULT …` as any other.
 */
function bashCallFor(body) {
  const last = lastTurn(body);
  if (last?.role !== "user") return null;
  const texts = typeof last.content === "string" ? [last.content] : Array.isArray(last.content) ? last.content.filter((b) => b?.type === "text").map((b) => b.text) : [];
  const ask = texts.map((t) => t.trim()).findLast((t) => t.startsWith(BASH));
  return ask ? { name: "Bash", input: { command: ask.slice(BASH.length), description: "scripted by the mock" } } : null;
}

/** The marker of a user turn that asks for a scripted file edit: `WRITE <path> <content>`. */
const WRITE = "WRITE ";

/** The texts of a message (a string, or its text blocks). */
function textsOfMessage(m) {
  if (typeof m?.content === "string") return [m.content];
  return Array.isArray(m?.content) ? m.content.filter((b) => b?.type === "text").map((b) => b.text) : [];
}

/** The session's directory, as Claude Code's system prompt names it. */
function workingDirectory(body) {
  return allText(body).match(/Primary working directory: (\S+)/)?.[1] ?? null;
}

/**
 * The next step of a scripted `WRITE <path> <content>`: a `Read` of the file when the last
 * message asks, a `Write` of the content when it carries that Read's tool_result; else null.
 */
function writeCallFor(body) {
  const last = lastTurn(body);
  if (last?.role !== "user") return null;
  const fresh = textsOfMessage(last).map((t) => t.trim()).findLast((t) => t.startsWith(WRITE));
  if (!fresh && lastToolResult(body)?.name !== "Read") return null;
  const ask = fresh ?? lastAsk(body, WRITE);
  if (!ask) return null;
  const rest = ask.slice(WRITE.length);
  const space = rest.indexOf(" ");
  const path = space < 0 ? rest : rest.slice(0, space);
  const file_path = isAbsolute(path) ? path : join(workingDirectory(body) ?? "/", path);
  if (fresh) return { name: "Read", input: { file_path } };
  return { name: "Write", input: { file_path, content: `${space < 0 ? "" : rest.slice(space + 1)}\n` } };
}

/** The last user text that starts with `marker`, or "". */
function lastAsk(body, marker) {
  const messages = Array.isArray(body.messages) ? body.messages : [];
  for (let i = messages.length - 1; i >= 0; i--) {
    if (messages[i].role !== "user") continue;
    const ask = textsOfMessage(messages[i]).map((t) => t.trim()).findLast((t) => t.startsWith(marker));
    if (ask) return ask;
  }
  return "";
}

/** The input tokens every reply reports: `MOCK_USAGE=<n>` in a user text, else 10. */
function inputTokens(body) {
  for (const m of Array.isArray(body.messages) ? body.messages : []) {
    if (m?.role !== "user") continue;
    for (const t of textsOfMessage(m)) {
      const n = t.match(/\bMOCK_USAGE=(\d+)\b/)?.[1];
      if (n) return Number(n);
    }
  }
  return 10;
}

/** The last user text that asks for a scripted delegate call, or "". */
function lastDelegateText(body) {
  const messages = Array.isArray(body.messages) ? body.messages : [];
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i];
    if (m.role !== "user") continue;
    const texts = typeof m.content === "string" ? [m.content] : Array.isArray(m.content) ? m.content.filter((b) => b?.type === "text").map((b) => b.text) : [];
    const ask = texts.map((t) => t.trim()).findLast((t) => t.startsWith(DELEGATE));
    if (ask) return ask;
  }
  return "";
}

/** Claude Code's tool that loads deferred tools' schemas (MCP tools are deferred by default). */
const TOOL_SEARCH = "ToolSearch";

/**
 * The scripted tool call this request asks for, when the last user text is `DELEGATE <json>`
 * and no tool result answers it yet: `{name, input}` of the delegate tool when it is offered;
 * a `ToolSearch` `select:` of it when it is only named as a deferred tool (as a model does: the
 * next request offers it); `{missing}` when neither; else null.
 */
function toolCallFor(body) {
  const fresh = freshAsk(body);
  const result = fresh ? null : lastToolResult(body);
  if (!fresh && result?.name !== TOOL_SEARCH) return null;
  // After a ToolSearch the last user text is its "Tool loaded."; the ask is the one before.
  const text = fresh ?? lastDelegateText(body);
  if (!text.startsWith(DELEGATE)) return null;
  const names = toolNames(body);
  const name = names.find((n) => n.endsWith("__delegate"));
  if (!name) {
    const deferred = allText(body).match(/^(mcp__\S+__delegate)$/m)?.[1];
    if (!result && deferred && names.includes(TOOL_SEARCH)) {
      return { name: TOOL_SEARCH, input: { query: `select:${deferred}`, max_results: 1 } };
    }
    return { missing: names };
  }
  try {
    return { name, input: JSON.parse(text.slice(DELEGATE.length)) };
  } catch {
    return { missing: names, badInput: true };
  }
}

/** The title every session gets when the agent asks the model for one. */
const TITLE = "Differential session";

function usage(body, output) {
  return {
    input_tokens: inputTokens(body),
    output_tokens: output,
    cache_creation_input_tokens: 0,
    cache_read_input_tokens: 0,
  };
}

let counter = 0;

function sse(res, event, data) {
  res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
}

function streamReply(res, body, text) {
  const id = `msg_mock_${++counter}`;
  res.writeHead(200, {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "request-id": `req_mock_${counter}`,
  });
  sse(res, "message_start", {
    type: "message_start",
    message: {
      id,
      type: "message",
      role: "assistant",
      model: body.model,
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: usage(body, 1),
    },
  });
  sse(res, "content_block_start", {
    type: "content_block_start",
    index: 0,
    content_block: { type: "text", text: "" },
  });
  // Two deltas, split inside the text, so a client that drops all but one chunk shows.
  const cut = Math.min(6, text.length);
  for (const part of [text.slice(0, cut), text.slice(cut)]) {
    sse(res, "content_block_delta", {
      type: "content_block_delta",
      index: 0,
      delta: { type: "text_delta", text: part },
    });
  }
  sse(res, "content_block_stop", { type: "content_block_stop", index: 0 });
  sse(res, "message_delta", {
    type: "message_delta",
    delta: { stop_reason: "end_turn", stop_sequence: null },
    usage: { output_tokens: 5 },
  });
  sse(res, "message_stop", { type: "message_stop" });
  res.end();
}

/** A streamed assistant turn that is one tool call, the input split over two deltas. */
function streamToolUse(res, body, { name, input }) {
  const id = `msg_mock_${++counter}`;
  res.writeHead(200, {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "request-id": `req_mock_${counter}`,
  });
  sse(res, "message_start", {
    type: "message_start",
    message: {
      id,
      type: "message",
      role: "assistant",
      model: body.model,
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: usage(body, 1),
    },
  });
  sse(res, "content_block_start", {
    type: "content_block_start",
    index: 0,
    content_block: { type: "tool_use", id: `toolu_mock_${counter}`, name, input: {} },
  });
  const json = JSON.stringify(input);
  const cut = Math.floor(json.length / 2);
  for (const part of [json.slice(0, cut), json.slice(cut)]) {
    sse(res, "content_block_delta", {
      type: "content_block_delta",
      index: 0,
      delta: { type: "input_json_delta", partial_json: part },
    });
  }
  sse(res, "content_block_stop", { type: "content_block_stop", index: 0 });
  sse(res, "message_delta", {
    type: "message_delta",
    delta: { stop_reason: "tool_use", stop_sequence: null },
    usage: { output_tokens: 5 },
  });
  sse(res, "message_stop", { type: "message_stop" });
  res.end();
}

function jsonReply(res, body, text) {
  res.writeHead(200, { "content-type": "application/json", "request-id": `req_mock_${++counter}` });
  res.end(
    JSON.stringify({
      id: `msg_mock_${counter}`,
      type: "message",
      role: "assistant",
      model: body.model,
      content: [{ type: "text", text }],
      stop_reason: "end_turn",
      stop_sequence: null,
      usage: usage(body, 5),
    }),
  );
}

function notFound(res) {
  res.writeHead(404, { "content-type": "application/json" });
  res.end(JSON.stringify({ type: "error", error: { type: "not_found_error", message: "mock: no such endpoint" } }));
}

const server = createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const raw = Buffer.concat(chunks).toString("utf8");
    let body = {};
    try {
      body = raw ? JSON.parse(raw) : {};
    } catch {
      body = {};
    }
    const path = (req.url ?? "").split("?")[0];
    if (process.env.MOCK_EVENTS) {
      // One line per request on stdout, for a harness that waits until a turn reached the model.
      process.stdout.write(JSON.stringify({ method: req.method, path, user: (lastUserText(body) || anyUserText(body)).slice(0, 200) }) + "\n");
    }
    if (log) {
      if (process.env.MOCK_DUMP) appendFileSync(log + ".bodies", raw + "\n");
      appendFileSync(
        log,
        JSON.stringify({
          method: req.method,
          path,
          model: body.model ?? null,
          stream: body.stream ?? null,
          user: (lastUserText(body) || anyUserText(body)).slice(0, 200),
          ...(process.env.MOCK_TOOLS ? { tools: toolNames(body), toolResults: toolResults(body) } : {}),
        }) + "\n",
      );
    }
    if (req.method === "POST" && path === "/v1/messages") {
      if (hangs(body)) return hang(req, res, () => streamReply(res, body, "late reply"));
      const call = bashCallFor(body) ?? writeCallFor(body) ?? toolCallFor(body);
      if (call?.name && body.stream) return streamToolUse(res, body, call);
      const text = call?.badInput
        ? "BAD DELEGATE INPUT (not JSON)"
        : call?.missing
          ? `NO DELEGATE TOOL ${JSON.stringify(call.missing)}`
          : replyFor(body);
      return body.stream ? streamReply(res, body, text) : jsonReply(res, body, text);
    }
    if (req.method === "POST" && path === "/v1/messages/count_tokens") {
      res.writeHead(200, { "content-type": "application/json" });
      return res.end(JSON.stringify({ input_tokens: 10 }));
    }
    if (other(req, res, path, body)) return;
    notFound(res);
  });
});

server.listen(0, "127.0.0.1", () => {
  process.stdout.write(JSON.stringify({ port: server.address().port }) + "\n");
});
// Ends with its parent: stdin closes when the test (or the differential script) goes away.
process.stdin.on("end", () => process.exit(0));
process.stdin.resume();
process.on("SIGTERM", () => process.exit(0));
