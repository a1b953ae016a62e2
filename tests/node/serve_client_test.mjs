// A Node.js client against a real `tandem serve` (ctest `serve_node_client`, through run.sh): the official
// `openai` npm package when it is installed in tests/node/node_modules (scripts/setup.sh runs `npm ci` here),
// else a small fetch-based stand-in with the same calls, so the HTTP shapes are still checked offline.
//
//   node serve_client_test.mjs /path/to/tandem
//
// Starts the server on a free port (--port 0, the port is read from its first line), runs the checks, stops
// it. Exits 0 when every check passed, 1 otherwise (each failure is printed).
import { spawn } from "node:child_process";
import assert from "node:assert/strict";

const tandem = process.argv[2];
if (!tandem) {
  console.error("usage: node serve_client_test.mjs TANDEM_BIN");
  process.exit(2);
}

// Every step has a bound: a hung server fails the test instead of hanging ctest.
const deadline = setTimeout(() => {
  console.error("FAIL: the test did not finish within 240 s");
  process.exit(1);
}, 240_000);

function startServer() {
  const args = ["serve", "--port", "0", "--parallel", "4", "--ctx", "4096", "--kv-unified",
                "--chat-template", "chatml", "--api-key", "node-key"];
  const proc = spawn(tandem, args, { stdio: ["ignore", "pipe", "inherit"] });
  return new Promise((resolve, reject) => {
    let out = "";
    proc.stdout.on("data", (d) => {
      out += d.toString();
      const m = out.match(/listening on http:\/\/([^:]+):(\d+)/);
      if (m) resolve({ proc, base: `http://127.0.0.1:${m[2]}` });
    });
    proc.on("exit", (code) => reject(new Error(`tandem serve exited with ${code} before listening`)));
  });
}

// The subset of the openai client this test calls, over fetch: used only when the package is not installed.
function fetchClient(baseURL, apiKey) {
  const post = async (path, body) => {
    const r = await fetch(baseURL + path, {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${apiKey}` },
      body: JSON.stringify(body),
    });
    if (!r.ok) {
      const e = new Error(`HTTP ${r.status}`);
      e.status = r.status;
      e.error = (await r.json()).error;
      throw e;
    }
    if (!body.stream) return r.json();
    // Server-sent events: an async iterator over the `data:` chunks.
    const text = await r.text();
    const chunks = text.split("\n\n").filter((b) => b.startsWith("data: ") && b !== "data: [DONE]")
      .map((b) => JSON.parse(b.slice(6)));
    return { async *[Symbol.asyncIterator]() { yield* chunks; } };
  };
  return {
    completions: { create: (b) => post("/completions", b) },
    chat: { completions: { create: (b) => post("/chat/completions", b) } },
    models: { list: async () => {
      const r = await fetch(baseURL + "/models", { headers: { Authorization: `Bearer ${apiKey}` } });
      return r.json();
    } },
  };
}

async function makeClient(baseURL, apiKey) {
  try {
    const { default: OpenAI } = await import("openai");
    console.log("client: the openai npm package");
    return new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120_000 });
  } catch {
    console.log("client: fetch (the openai npm package is not installed: npm ci --prefix tests/node)");
    return fetchClient(baseURL, apiKey);
  }
}

const { proc, base } = await startServer();
let failed = 0;
async function check(name, fn) {
  try {
    await fn();
    console.log(`ok   ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}

try {
  const client = await makeClient(`${base}/v1`, "node-key");

  await check("models lists the shipped model", async () => {
    const m = await client.models.list();
    const ids = (m.data || []).map((x) => x.id);
    assert.ok(ids.includes("tandem-small-q8_0"), JSON.stringify(ids));
  });

  let greedy = "";
  await check("completion (greedy, not streamed)", async () => {
    const r = await client.completions.create({ model: "tandem-small-q8_0", prompt: "Once upon a time",
                                                max_tokens: 16, temperature: 0 });
    greedy = r.choices[0].text;
    assert.ok(greedy.length > 0);
    assert.equal(r.choices[0].finish_reason, "length");
    assert.equal(r.usage.completion_tokens, 16);
    assert.ok(r.usage.prompt_tokens > 0);
  });

  await check("completion streamed equals not streamed", async () => {
    const s = await client.completions.create({ model: "tandem-small-q8_0", prompt: "Once upon a time",
                                                max_tokens: 16, temperature: 0, stream: true });
    let text = "", finish = null;
    for await (const c of s) {
      text += c.choices[0]?.text ?? "";
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(text, greedy);
    assert.equal(finish, "length");
  });

  await check("chat completion (chatml), streamed and not", async () => {
    const messages = [{ role: "system", content: "You tell stories." },
                      { role: "user", content: "Tell me about a cat." }];
    const r = await client.chat.completions.create({ model: "tandem-small-q8_0", messages, max_tokens: 12,
                                                     temperature: 0 });
    assert.equal(r.object, "chat.completion");
    assert.equal(r.choices[0].message.role, "assistant");
    const text = r.choices[0].message.content;
    assert.ok(typeof text === "string");
    const s = await client.chat.completions.create({ model: "tandem-small-q8_0", messages, max_tokens: 12,
                                                     temperature: 0, stream: true });
    let streamed = "";
    for await (const c of s) streamed += c.choices[0]?.delta?.content ?? "";
    assert.equal(streamed, text);
  });

  await check("unknown model is a 404 with an OpenAI error body", async () => {
    await assert.rejects(
      client.completions.create({ model: "gpt-17", prompt: "x", max_tokens: 1 }),
      (e) => e.status === 404 && /does not exist/.test(e.error?.message ?? e.message));
  });

  await check("a wrong API key is a 401", async () => {
    const bad = await makeClient(`${base}/v1`, "wrong");
    await assert.rejects(bad.completions.create({ prompt: "x", max_tokens: 1 }), (e) => e.status === 401);
  });
} finally {
  proc.kill("SIGTERM");
  clearTimeout(deadline);
}
console.log(failed ? `${failed} check(s) failed` : "all checks passed");
process.exit(failed ? 1 : 0);
