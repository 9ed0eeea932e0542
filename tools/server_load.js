#!/usr/bin/env node
// Load test for dpl-server (or any OpenAI-compatible server): N concurrent
// streaming /v1/chat/completions requests, each a prompt of about
// PROMPT tokens and exactly GEN generated tokens (ignore_eos), then every
// stream's time to first token and decode t/s, and the aggregate.
//
//   node tools/server_load.js [--url http://127.0.0.1:8080] [-n 16] [--prompt 128] [--gen 128]
//                             [--api-key KEY] [--model NAME]
//
// Plain Node (v18+: fetch), no packages. The prompt is made of repeated words
// and trimmed to PROMPT tokens with the server's /tokenize + /detokenize, so
// its length is exact in the model's tokenizer (plus the chat template's).
'use strict';

const args = process.argv.slice(2);
const opt = { url: 'http://127.0.0.1:8080', n: 16, prompt: 128, gen: 128, apiKey: '', model: '' };
for (let i = 0; i < args.length; i++) {
  const a = args[i], v = args[i + 1];
  if (a === '--url') opt.url = v, i++;
  else if (a === '-n') opt.n = Number(v), i++;
  else if (a === '--prompt') opt.prompt = Number(v), i++;
  else if (a === '--gen') opt.gen = Number(v), i++;
  else if (a === '--api-key') opt.apiKey = v, i++;
  else if (a === '--model') opt.model = v, i++;
  else { console.error(`server_load: unknown argument ${a}`); process.exit(1); }
}
const headers = { 'Content-Type': 'application/json' };
if (opt.apiKey) headers.Authorization = `Bearer ${opt.apiKey}`;

async function post(path, body) {
  const r = await fetch(opt.url + path, { method: 'POST', headers, body: JSON.stringify(body) });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}: ${await r.text()}`);
  return r;
}

async function promptOf(tokens, salt) {
  const words = `Request ${salt}: the quick brown fox jumps over the lazy dog near the river bank. `.repeat(
    Math.ceil(tokens / 8) + 4);
  const ids = (await (await post('/tokenize', { content: words })).json()).tokens.slice(0, tokens);
  return (await (await post('/detokenize', { tokens: ids })).json()).content;
}

// One stream: times of the first content chunk and of the end, tokens from usage.
async function stream(i, content) {
  const t0 = performance.now();
  const body = {
    messages: [{ role: 'user', content }], max_tokens: opt.gen, ignore_eos: true, temperature: 0.8,
    seed: i, stream: true, stream_options: { include_usage: true },
  };
  if (opt.model) body.model = opt.model;
  const r = await post('/v1/chat/completions', body);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = '', first = null, usage = null, error = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
      const j = JSON.parse(line.slice(6));
      if (j.error) error = j.error.message;
      if (j.usage) usage = j.usage;
      if (first === null && j.choices && j.choices.some((c) => c.delta && c.delta.content)) first = performance.now();
    }
  }
  const end = performance.now();
  if (error) throw new Error(`stream ${i}: ${error}`);
  const n = usage ? usage.completion_tokens : 0;
  const ttft = (first ?? end) - t0;
  // Decode rate after the first token: (n - 1) tokens over the time since it.
  const tps = n > 1 && first !== null ? (n - 1) / ((end - first) / 1000) : 0;
  return { i, n, prompt: usage ? usage.prompt_tokens : 0, ttft, tps, seconds: (end - t0) / 1000 };
}

async function main() {
  const prompts = await Promise.all([...Array(opt.n).keys()].map((i) => promptOf(opt.prompt, i)));
  const t0 = performance.now();
  const results = await Promise.all(prompts.map((p, i) => stream(i, p)));
  const wall = (performance.now() - t0) / 1000;
  console.log('stream  prompt  tokens  ttft_ms   t/s');
  for (const r of results) {
    console.log(`${String(r.i).padStart(6)}  ${String(r.prompt).padStart(6)}  ${String(r.n).padStart(6)}  ` +
                `${r.ttft.toFixed(0).padStart(7)}  ${r.tps.toFixed(1).padStart(6)}`);
  }
  const total = results.reduce((s, r) => s + r.n, 0);
  const ttfts = results.map((r) => r.ttft).sort((a, b) => a - b);
  console.log(`streams ${opt.n}, ${total} tokens generated in ${wall.toFixed(2)} s: aggregate ${(total / wall).toFixed(1)} t/s ` +
              `(including prompts); per stream mean ${(results.reduce((s, r) => s + r.tps, 0) / opt.n).toFixed(1)} t/s; ` +
              `ttft median ${ttfts[Math.floor(opt.n / 2)].toFixed(0)} ms, max ${ttfts[opt.n - 1].toFixed(0)} ms`);
}

main().catch((e) => { console.error(`server_load: ${e.message}`); process.exit(1); });
