// `serval serve --runner pooling` through the official openai npm client: client.embeddings.create
// (the client asks for base64 and decodes it) equals the float form fetched directly, every
// vector has unit length, `dimensions` cuts and renormalizes, usage counts the prompt tokens;
// /score gives the cosine of two of those embeddings.
// Usage: node embeddings_openai.mjs BASE_URL NODE_MODULES
import assert from 'node:assert/strict';
import { pathToFileURL } from 'node:url';

const [baseURL, nodeModules] = process.argv.slice(2);
const { default: OpenAI } = await import(pathToFileURL(`${nodeModules}/openai/index.mjs`).href);
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
const model = (await client.models.list()).data[0].id;

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
const input = ['The capital of France is', 'Question: Tom has 3 apples.'];

const viaClient = await client.embeddings.create({ model, input });
const direct = await (await fetch(`${baseURL}/embeddings`, {
  method: 'POST',
  headers: { 'Content-Type': 'application/json' },
  body: JSON.stringify({ model, input, encoding_format: 'float' }),
})).json();
assert.equal(viaClient.data.length, 2);
for (let i = 0; i < 2; i++) {
  const a = viaClient.data[i].embedding, b = direct.data[i].embedding;
  assert.equal(viaClient.data[i].index, i);
  assert.equal(a.length, b.length);
  assert.ok(a.length > 0);
  assert.ok(Math.abs(norm(a) - 1) < 1e-5, `norm ${norm(a)}`);
  for (let k = 0; k < a.length; k++) assert.ok(Math.abs(a[k] - b[k]) < 1e-6, `input ${i} value ${k}`);
}
assert.notDeepEqual(viaClient.data[0].embedding, viaClient.data[1].embedding);
assert.ok(viaClient.usage.prompt_tokens > 5 && viaClient.usage.total_tokens === viaClient.usage.prompt_tokens);

const cut = await client.embeddings.create({ model, input: input[0], dimensions: 8 });
assert.equal(cut.data[0].embedding.length, 8);
assert.ok(Math.abs(norm(cut.data[0].embedding) - 1) < 1e-5);
const head = viaClient.data[0].embedding.slice(0, 8), n = norm(head);
for (let k = 0; k < 8; k++) assert.ok(Math.abs(cut.data[0].embedding[k] - head[k] / n) < 1e-5);

// /score: the cosine of the two embeddings the client got; a text with itself scores 1.
const score = await (await fetch(`${baseURL.replace(/\/v1$/, '')}/score`, {
  method: 'POST',
  headers: { 'Content-Type': 'application/json' },
  body: JSON.stringify({ model, text_1: input[0], text_2: [input[0], input[1]] }),
})).json();
const [e0, e1] = viaClient.data.map((d) => d.embedding);
const dot = e0.reduce((s, x, k) => s + x * e1[k], 0);
assert.ok(Math.abs(score.data[0].score - 1) < 1e-5, `self score ${score.data[0].score}`);
assert.ok(Math.abs(score.data[1].score - dot) < 1e-5, `score ${score.data[1].score} vs ${dot}`);

await assert.rejects(client.completions.create({ model, prompt: 'hi', max_tokens: 2 }),
                     (e) => e.status === 400 && /Completions API/.test(e.message));
console.log('ok   openai client embeddings (base64 and float agree, unit length, dimensions, usage); /score');
