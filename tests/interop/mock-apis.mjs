// The mock model server's other APIs (mock-model.mjs serves Anthropic Messages itself): what
// codex-acp (OpenAI Responses), opencode (OpenAI Chat Completions, through a custom
// `@ai-sdk/openai-compatible` provider) and gemini-cli (the Gemini API) call, so each runs
// offline against 127.0.0.1. Every API answers the same script:
// - a turn whose last user text starts with `HANG` is held open (headers sent, no content)
//   until the client goes away (an agent that cancels closes its request) or HANG_MS passes,
//   so a test can cancel a turn that is surely in flight;
// - a title query (the agent asks the model to name the session) gets TITLE;
// - anything else gets `REPLY <last user text>`, streamed as two deltas (split inside the text,
//   so a bridge that keeps only one chunk shows).
// Usage numbers are fixed, so the agents' usage reports are too.

/** The longest a HANG turn is held: far past any test's cancel, short of its deadline. */
const HANG_MS = 60_000;
/** The title every session gets when the agent asks the model for one. */
export const TITLE = "Differential session";

/** Text of one content value of any of the APIs (a string, or blocks/parts with `text`). */
function textsOf(content) {
  if (typeof content === "string") return [content];
  if (!Array.isArray(content)) return [];
  return content.filter((b) => typeof b?.text === "string").map((b) => b.text);
}

/**
 * Every message of the request as `{role, texts}`, whatever the API: Anthropic and Chat
 * Completions `messages`, Responses `input` (a string or items), Gemini `contents`.
 */
function messagesOf(body) {
  if (Array.isArray(body.messages)) return body.messages.map((m) => ({ role: m?.role, texts: textsOf(m?.content) }));
  if (typeof body.input === "string") return [{ role: "user", texts: [body.input] }];
  if (Array.isArray(body.input)) {
    return body.input
      .filter((i) => i?.type === "message" || (i?.role && i?.content !== undefined))
      .map((i) => ({ role: i.role, texts: textsOf(i.content) }));
  }
  if (Array.isArray(body.contents)) return body.contents.map((c) => ({ role: c?.role, texts: textsOf(c?.parts) }));
  return [];
}

/** Context an agent adds as user text (`<environment_context>`, `<system-reminder>`, …). */
const injected = (t) => t.trimStart().startsWith("<") || t.startsWith("# AGENTS.md");

/** The last user text that a person typed, as far as the mock can tell. */
export function anyUserText(body) {
  const messages = messagesOf(body);
  for (let i = messages.length - 1; i >= 0; i--) {
    if (messages[i].role !== "user") continue;
    const texts = messages[i].texts.filter((t) => !injected(t));
    if (texts.length) return texts[texts.length - 1];
  }
  return "";
}

/** Every text of the request: instructions, system prompt and messages. */
function allText(body) {
  const texts = [];
  for (const v of [body.system, body.instructions, body.systemInstruction?.parts, body.system_instruction?.parts]) texts.push(...textsOf(v));
  for (const m of messagesOf(body)) texts.push(...m.texts);
  return texts.join("\n");
}

/** A query for the session's title rather than a turn. */
function isTitleQuery(body) {
  const all = allText(body);
  return all.includes('a single "title" field') || /title generator|generate a (short )?title/i.test(all);
}

/** Whether this turn should be held open (its user text starts with `HANG`). */
export function hangs(body) {
  return anyUserText(body).trim().startsWith("HANG") && !isTitleQuery(body);
}

/**
 * Holds a turn open: `start` (headers, maybe a first event) now, `finish` when HANG_MS passes;
 * nothing more when the client closes the request first.
 */
export function hang(req, res, finish, start) {
  start?.();
  const timer = setTimeout(finish, HANG_MS);
  res.on("close", () => clearTimeout(timer));
}

function replyText(body) {
  return isTitleQuery(body) ? TITLE : `REPLY ${anyUserText(body).trim()}`;
}

function halves(text) {
  const cut = Math.min(6, text.length);
  return [text.slice(0, cut), text.slice(cut)];
}

let counter = 0;

// ---- OpenAI Responses (codex) ------------------------------------------------------------

function responsesEvent(res, data) {
  res.write(`event: ${data.type}\ndata: ${JSON.stringify(data)}\n\n`);
}

function responsesStream(res, body) {
  const id = `resp_mock_${++counter}`;
  const itemId = `msg_mock_${counter}`;
  const text = replyText(body);
  const created_at = 1_700_000_000;
  const base = { id, object: "response", created_at, model: body.model ?? "mock", output: [] };
  responsesEvent(res, { type: "response.created", response: { ...base, status: "in_progress" } });
  responsesEvent(res, { type: "response.in_progress", response: { ...base, status: "in_progress" } });
  const item = { type: "message", id: itemId, status: "in_progress", role: "assistant", content: [] };
  responsesEvent(res, { type: "response.output_item.added", output_index: 0, item });
  responsesEvent(res, { type: "response.content_part.added", item_id: itemId, output_index: 0, content_index: 0, part: { type: "output_text", text: "", annotations: [] } });
  for (const delta of halves(text)) {
    responsesEvent(res, { type: "response.output_text.delta", item_id: itemId, output_index: 0, content_index: 0, delta });
  }
  responsesEvent(res, { type: "response.output_text.done", item_id: itemId, output_index: 0, content_index: 0, text });
  const part = { type: "output_text", text, annotations: [] };
  responsesEvent(res, { type: "response.content_part.done", item_id: itemId, output_index: 0, content_index: 0, part });
  const done = { ...item, status: "completed", content: [part] };
  responsesEvent(res, { type: "response.output_item.done", output_index: 0, item: done });
  responsesEvent(res, {
    type: "response.completed",
    response: {
      ...base,
      status: "completed",
      output: [done],
      usage: { input_tokens: 10, input_tokens_details: { cached_tokens: 0 }, output_tokens: 5, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 15 },
    },
  });
  res.end();
}

function sseHead(res) {
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
}

// ---- OpenAI Chat Completions (opencode) --------------------------------------------------

function chatStream(res, body) {
  const id = `chatcmpl-mock-${++counter}`;
  const chunk = (delta, finish_reason = null, extra = {}) =>
    res.write(`data: ${JSON.stringify({ id, object: "chat.completion.chunk", created: 1_700_000_000, model: body.model ?? "mock", choices: [{ index: 0, delta, finish_reason }], ...extra })}\n\n`);
  const [a, b] = halves(replyText(body));
  chunk({ role: "assistant", content: a });
  chunk({ content: b });
  chunk({}, "stop");
  if (body.stream_options?.include_usage) {
    res.write(`data: ${JSON.stringify({ id, object: "chat.completion.chunk", created: 1_700_000_000, model: body.model ?? "mock", choices: [], usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 } })}\n\n`);
  }
  res.write("data: [DONE]\n\n");
  res.end();
}

function chatJson(res, body) {
  res.writeHead(200, { "content-type": "application/json" });
  res.end(
    JSON.stringify({
      id: `chatcmpl-mock-${++counter}`,
      object: "chat.completion",
      created: 1_700_000_000,
      model: body.model ?? "mock",
      choices: [{ index: 0, message: { role: "assistant", content: replyText(body) }, finish_reason: "stop" }],
      usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 },
    }),
  );
}

// ---- Gemini API (gemini-cli) -------------------------------------------------------------

const geminiUsage = { promptTokenCount: 10, candidatesTokenCount: 5, totalTokenCount: 15 };

/**
 * A non-streamed answer. gemini-cli asks some side questions with a JSON response schema (which
 * speaker goes next, whether a loop is happening); those get a JSON object that ends the turn.
 */
function geminiAnswer(body) {
  const config = body.generationConfig ?? body.generation_config ?? {};
  if (config.responseMimeType === "application/json" || config.responseSchema || config.responseJsonSchema) {
    const all = allText(body);
    if (/next_speaker/.test(all) || /next_speaker/.test(JSON.stringify(config))) {
      return JSON.stringify({ reasoning: "The model answered; the user speaks next.", next_speaker: "user" });
    }
    return JSON.stringify({ reasoning: "mock", confidence: 0 });
  }
  return replyText(body);
}

function geminiChunk(text, finishReason) {
  const candidate = { content: { role: "model", parts: [{ text }] }, index: 0 };
  if (finishReason) candidate.finishReason = finishReason;
  return { candidates: [candidate], usageMetadata: geminiUsage, modelVersion: "mock" };
}

function geminiStream(res, body) {
  const [a, b] = halves(replyText(body));
  res.write(`data: ${JSON.stringify(geminiChunk(a))}\n\n`);
  res.write(`data: ${JSON.stringify(geminiChunk(b, "STOP"))}\n\n`);
  res.end();
}

/**
 * Serves the request when it is one of these APIs; `false` leaves it to the caller.
 * Paths: `/v1/responses` (Responses), `/v1/chat/completions` (Chat Completions),
 * `/v1beta/models/M:streamGenerateContent` / `:generateContent` / `:countTokens` (Gemini), and
 * `/v1/models` (an empty list, for an agent that asks which models exist).
 */
export function other(req, res, path, body) {
  if (req.method === "GET" && /\/models\/?$/.test(path)) {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ object: "list", data: [], models: [] }));
    return true;
  }
  if (req.method !== "POST") return false;
  if (path.endsWith("/responses")) {
    if (hangs(body)) {
      hang(req, res, () => responsesStream(res, body), () => sseHead(res));
    } else {
      sseHead(res);
      responsesStream(res, body);
    }
    return true;
  }
  if (path.endsWith("/chat/completions")) {
    if (body.stream && hangs(body)) {
      hang(req, res, () => chatStream(res, body), () => sseHead(res));
    } else if (body.stream) {
      sseHead(res);
      chatStream(res, body);
    } else {
      chatJson(res, body);
    }
    return true;
  }
  const gemini = path.match(/\/models\/([^/:]+):(streamGenerateContent|generateContent|countTokens)$/);
  if (gemini) {
    const [, , op] = gemini;
    if (op === "countTokens") {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ totalTokens: 10 }));
    } else if (op === "streamGenerateContent" && hangs(body)) {
      hang(req, res, () => geminiStream(res, body), () => sseHead(res));
    } else if (op === "streamGenerateContent") {
      sseHead(res);
      geminiStream(res, body);
    } else {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify(geminiChunk(geminiAnswer(body), "STOP")));
    }
    return true;
  }
  return false;
}
