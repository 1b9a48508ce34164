// Load and disconnect checks of `serval serve` with the openai npm client.
//   node server_load.mjs BASE_URL NODE_MODULES concurrent   200 streaming clients at once
//   node server_load.mjs BASE_URL NODE_MODULES disconnect   100 clients that drop mid-stream or
//                                                           during prefill
// The caller checks /metrics afterwards (nothing running or waiting, every KV block free).
import assert from 'node:assert/strict';
import http from 'node:http';
import { pathToFileURL } from 'node:url';

const [baseURL, nodeModules, mode] = process.argv.slice(2);
const { default: OpenAI } = await import(pathToFileURL(`${nodeModules}/openai/index.mjs`).href);
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120_000 });
const model = (await client.models.list()).data[0];

const prompts = [
  'The quick brown fox',
  'In the beginning',
  [3, 1, 4, 1, 5, 9, 2, 6],
  'def fibonacci(n):',
  'Roses are red, violets are',
];
const body = (prompt) => ({ model: model.id, prompt, max_tokens: 8, temperature: 0, ignore_eos: true });

async function streamText(prompt, signal) {
  const stream = await client.completions.create({ ...body(prompt), stream: true }, { signal });
  let text = '';
  let finish = null;
  for await (const ev of stream) {
    text += ev.choices[0].text;
    finish = ev.choices[0].finish_reason ?? finish;
  }
  return { text, finish };
}

if (mode === 'concurrent') {
  const want = [];
  for (const p of prompts) want.push((await client.completions.create(body(p))).choices[0].text);
  const t0 = Date.now();
  const results = await Promise.allSettled(
    Array.from({ length: 200 }, (_, i) => streamText(prompts[i % prompts.length])),
  );
  let ok = 0;
  results.forEach((r, i) => {
    assert.equal(r.status, 'fulfilled', `client ${i}: ${r.reason}`);
    assert.equal(r.value.finish, 'length', `client ${i}`);
    assert.equal(r.value.text, want[i % prompts.length], `client ${i} (prompt ${i % prompts.length})`);
    ok++;
  });
  console.log(`ok   ${ok} concurrent streaming clients, each equal to its single-request output (${Date.now() - t0} ms)`);
} else if (mode === 'disconnect') {
  // Long prompts (most of max_model_len) so that prefill takes a while, as token ids.
  const longLen = Math.max(16, model.max_model_len - 16);
  const longPrompt = (i) => Array.from({ length: longLen }, (_, k) => 1 + ((k * 7 + i) % 500));
  const midStream = Array.from({ length: 50 }, async (_, i) => {
    const ac = new AbortController();
    const stream = await client.completions.create(
      // logprobs: every token makes a chunk, also while the detokenizer holds back bytes of
      // an unfinished UTF-8 character (the random model produces long runs of those).
      { ...body(prompts[i % prompts.length]), max_tokens: model.max_model_len - 32, logprobs: 1, stream: true },
      { signal: ac.signal },
    );
    let chunks = 0;
    try {
      for await (const ev of stream) {
        chunks++;
        ac.abort();
        break;
      }
    } catch (e) {
      if (!(e instanceof OpenAI.APIUserAbortError) && e.name !== 'AbortError') throw e;
    }
    assert.ok(chunks >= 1, `mid-stream client ${i} got no chunk`);
    return 'mid';
  });
  // Plain node:http here: the client must drop a few ms after the whole body has left, which
  // the openai client cannot time (it may still be preparing the request when its signal fires).
  const url = new URL(`${baseURL}/completions`);
  const duringPrefill = Array.from({ length: 50 }, (_, i) => new Promise((resolve, reject) => {
    const payload = JSON.stringify({ ...body(longPrompt(i)), max_tokens: 16, stream: i % 2 === 0 });
    const req = http.request(url, { method: 'POST', headers: { 'Content-Type': 'application/json' } });
    req.on('response', (res) => {
      res.resume();
      res.on('end', () => resolve('finished'));  // faster than the drop: it must still clean up
      res.on('error', () => resolve('aborted'));
    });
    req.on('error', (e) => (e.code === 'ECONNRESET' || req.destroyed ? resolve('aborted') : reject(e)));
    req.on('close', () => resolve('aborted'));
    req.on('finish', () => setTimeout(() => req.destroy(), 1 + (i % 5)));
    req.end(payload);
  }));
  const all = await Promise.allSettled([...midStream, ...duringPrefill]);
  const bad = all.filter((r) => r.status === 'rejected');
  assert.equal(bad.length, 0, `${bad.length} clients failed: ${bad.slice(0, 3).map((r) => r.reason).join('; ')}`);
  const aborted = all.filter((r) => r.value === 'aborted').length;
  console.log(`ok   50 clients dropped mid-stream, 50 during prefill of ${longLen}-token prompts (${aborted} aborted before a reply)`);
  // A normal request still works.
  const r = await client.completions.create(body(prompts[0]));
  assert.equal(r.usage.completion_tokens, 8);
  console.log('ok   a normal request after the disconnects');
} else {
  throw new Error(`unknown mode ${mode}`);
}
