#!/usr/bin/env node
// A client of the kilo-rules sidecar: post a Session v1 file, print what came back.
//
//   node build.mjs --url http://127.0.0.1:8080 --model anthropic/claude-sonnet-4-5 \
//       --session session.json [--step 3] [--provider anthropic] [--timeout 30] [--body]
//
// Node 20 or later, no dependencies: the global fetch, ES modules. Exit codes: 0 success,
// 1 the sidecar refused the request (its typed error is printed on stderr), 2 a bad option,
// an unreadable file, or no answer from the sidecar.

import { realpathSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

const USAGE =
  "usage: node build.mjs --url URL --model ID|MODEL.json --session FILE.json " +
  "[--step N] [--provider API] [--timeout SECONDS] [--body]\n" +
  "the bearer token comes from $KILO_RULES_TOKEN, or from the file --token-file names";

/** The options, or exit 2 with the usage line. */
function options(argv) {
  try {
    const { values } = parseArgs({
      args: argv,
      options: {
        url: { type: "string" },
        model: { type: "string" },
        session: { type: "string" },
        step: { type: "string" },
        provider: { type: "string" },
        timeout: { type: "string", default: "30" },
        body: { type: "boolean", default: false },
        "token-file": { type: "string" },
        help: { type: "boolean", short: "h", default: false },
      },
      strict: true,
    });
    if (values.help) {
      console.log(USAGE);
      process.exit(0);
    }
    for (const name of ["url", "model", "session"]) {
      if (!values[name]) throw new Error(`--${name} is required`);
    }
    return values;
  } catch (err) {
    fail(2, `${err.message}\n${USAGE}`);
  }
}

function fail(code, message) {
  console.error(`build.mjs: ${message}`);
  process.exit(code);
}

async function readJson(path, what) {
  let text;
  try {
    text = await readFile(path, "utf8");
  } catch (err) {
    fail(2, `cannot read ${what} ${path}: ${err.code ?? err.message}`);
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    fail(2, `${path} is not JSON (${err.message}); a recorded agent log needs ` +
      "`kilo-rules import` first");
  }
}

/** The messages of a wire request, whatever the provider calls them. */
export function messageCount(request) {
  for (const key of ["messages", "contents", "input"]) {
    if (Array.isArray(request?.[key])) return request[key].length;
  }
  return 0;
}

/** Post the build; resolve to the parsed answer, or exit with the sidecar's error. */
export async function build(url, payload, timeoutSeconds, token) {
  const headers = { "content-type": "application/json", accept: "application/json" };
  if (token) headers.authorization = `Bearer ${token}`;
  let response;
  try {
    response = await fetch(new URL("/v1/build", url), {
      method: "POST",
      headers,
      body: JSON.stringify(payload),
      signal: AbortSignal.timeout(timeoutSeconds * 1000),
    });
  } catch (err) {
    fail(2, `no answer from ${url}: ${err.cause?.code ?? err.name}: ${err.message}`);
  }
  const text = await response.text();
  let answer;
  try {
    answer = JSON.parse(text);
  } catch {
    fail(1, `HTTP ${response.status}: the answer is not JSON: ${text.slice(0, 200)}`);
  }
  if (!response.ok) {
    const error = answer?.error ?? {};
    const lines = [`HTTP ${response.status} ${error.code ?? "error"}: ${error.message ?? text}`];
    for (const d of error.diagnostics ?? []) {
      const at = d.location ? `${d.location.file}:${d.location.line}:${d.location.col}: ` : "";
      lines.push(`  ${at}${d.severity ?? "error"}[${d.code}]: ${d.message}`);
      if (d.hint) lines.push(`    hint: ${d.hint}`);
    }
    fail(1, lines.join("\n"));
  }
  return answer;
}

async function main() {
  const opts = options(process.argv.slice(2));
  const timeout = Number(opts.timeout);
  if (!(timeout > 0)) fail(2, `--timeout: not a positive number: ${opts.timeout}`);
  const session = await readJson(opts.session, "session");
  const model = opts.model.endsWith(".json") ? await readJson(opts.model, "model") : opts.model;
  const step = {};
  if (opts.step !== undefined) {
    step.step = Number.parseInt(opts.step, 10);
    if (!(step.step >= 1)) fail(2, `--step: not a step number: ${opts.step}`);
  }
  if (opts.provider !== undefined) step.provider = opts.provider;
  // The token never goes on the command line, where other users of the machine see it.
  let token = process.env.KILO_RULES_TOKEN;
  if (opts["token-file"] !== undefined) {
    try {
      token = (await readFile(opts["token-file"], "utf8")).trim();
    } catch (err) {
      fail(2, `cannot read the token file ${opts["token-file"]}: ${err.code ?? err.message}`);
    }
  }
  const answer = await build(opts.url, { session, model, step }, timeout, token);
  console.log(`provider: ${answer.provider}`);
  console.log(`revision: ${answer.revision}`);
  console.log(`messages: ${messageCount(answer.request)}`);
  console.log(`input tokens: ${answer.input_tokens} of ${answer.context || "unknown"}` +
    (answer.compaction_needed ? ` (compaction needed: ${answer.compaction_needed})` : ""));
  if (opts.body) console.log(JSON.stringify(answer.request));
}

// Run only as a script, so that the helpers above can be imported by another module.
if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  await main();
}
