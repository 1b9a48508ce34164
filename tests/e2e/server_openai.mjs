// `serval serve` through the official openai npm client (v6): completions and chat, streamed
// and not, usage in streams, n > 1, stop strings, logprobs, echo with logprobs and
// prompt_logprobs, max_tokens, seeds, guided decoding (response_format json_schema,
// guided_choice, guided_regex, guided_grammar, named and required tool_choice), /v1/responses,
// /v1/models.
// Usage: node server_openai.mjs BASE_URL NODE_MODULES EXPECTED_MOE_BACKEND
import assert from 'node:assert/strict';
import { pathToFileURL } from 'node:url';

const [baseURL, nodeModules, wantBackend] = process.argv.slice(2);
const { default: OpenAI } = await import(pathToFileURL(`${nodeModules}/openai/index.mjs`).href);
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });

let passed = 0;
async function check(name, fn) {
  try {
    await fn();
    passed++;
    console.log(`ok   ${name}`);
  } catch (e) {
    console.error(`FAIL ${name}: ${e.stack || e}`);
    process.exitCode = 1;
  }
}

// Extra vLLM fields ride along in the body: the client sends every key it is given.
const greedy = { temperature: 0, ignore_eos: true };

const models = await client.models.list();
const model = models.data[0].id;
const maxModelLen = models.data[0].max_model_len;

await check('/v1/models lists the model with serval metadata', async () => {
  assert.equal(models.data.length, 1);
  const m = models.data[0];
  assert.equal(m.object, 'model');
  assert.equal(m.owned_by, 'serval');
  assert.ok(Number.isInteger(m.max_model_len) && m.max_model_len >= 256, `max_model_len ${m.max_model_len}`);
  assert.equal(m.serval.architecture, 'Qwen3MoeForCausalLM');
  assert.equal(m.serval.device, 'cpu');
  assert.equal(m.serval.moe_backend, wantBackend);
  assert.ok(m.serval.num_parameters > 0);
});

await check('completions: max_tokens → finish_reason length and usage', async () => {
  const r = await client.completions.create({ model, prompt: 'Hello, my name is', max_tokens: 7, ...greedy });
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.object, 'text_completion');
  assert.equal(r.model, model);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].index, 0);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(typeof r.choices[0].text, 'string');
  assert.equal(r.usage.completion_tokens, 7);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 7);
});

await check('completions: streamed text equals the non-streamed text; include_usage', async () => {
  const body = { model, prompt: 'The capital of France is', max_tokens: 12, ...greedy };
  const full = await client.completions.create(body);
  const stream = await client.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let text = '';
  const events = [];
  for await (const ev of stream) events.push(ev);
  const last = events.at(-1);
  assert.deepEqual(last.choices, []);
  assert.deepEqual(last.usage, full.usage);
  let finish = null;
  for (const ev of events.slice(0, -1)) {
    assert.equal(ev.choices.length, 1);
    assert.equal(ev.usage ?? null, null);
    text += ev.choices[0].text;
    if (ev.choices[0].finish_reason) finish = ev.choices[0].finish_reason;
  }
  assert.equal(text, full.choices[0].text);
  assert.equal(finish, 'length');
});

await check('completions: token-id prompt and a batch of prompts', async () => {
  const r = await client.completions.create({ model, prompt: [[5, 6, 7], [8, 9]], max_tokens: 4, ...greedy });
  assert.equal(r.choices.length, 2);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
  assert.equal(r.usage.prompt_tokens, 5);
  assert.equal(r.usage.completion_tokens, 8);
  const single = await client.completions.create({ model, prompt: [8, 9], max_tokens: 4, ...greedy });
  assert.equal(r.choices[1].text, single.choices[0].text);
});

await check('completions: n = 3 (non-streamed and streamed)', async () => {
  const r = await client.completions.create({ model, prompt: 'Once upon a time', n: 3, max_tokens: 6, temperature: 1, seed: 7, ignore_eos: true });
  assert.equal(r.choices.length, 3);
  assert.deepEqual(r.choices.map((c) => c.index).sort(), [0, 1, 2]);
  for (const c of r.choices) assert.equal(c.finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 18);
  const texts = new Map();
  const finishes = new Map();
  const stream = await client.completions.create({ model, prompt: 'Once upon a time', n: 3, max_tokens: 6, ...greedy, stream: true });
  for await (const ev of stream)
    for (const c of ev.choices) {
      texts.set(c.index, (texts.get(c.index) ?? '') + c.text);
      if (c.finish_reason) finishes.set(c.index, c.finish_reason);
    }
  assert.deepEqual([...texts.keys()].sort(), [0, 1, 2]);
  const g = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 6, ...greedy });
  for (let i = 0; i < 3; i++) {
    assert.equal(texts.get(i), g.choices[0].text, `greedy choice ${i}`);
    assert.equal(finishes.get(i), 'length');
  }
});

await check('completions: stop string removed from the output, finish_reason stop', async () => {
  const prompt = 'To be or not to be';
  const base = await client.completions.create({ model, prompt, max_tokens: 24, ...greedy });
  const text = base.choices[0].text;
  assert.ok(text.length >= 6, `greedy text too short: ${JSON.stringify(text)}`);
  // A stop string from the middle of the greedy output: the answer is the text before its first
  // occurrence.
  const stop = text.slice(3, 5);
  const want = text.slice(0, text.indexOf(stop));
  const r = await client.completions.create({ model, prompt, max_tokens: 24, stop: ['\u0000never', stop], ...greedy });
  assert.equal(r.choices[0].text, want);
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.ok(!r.choices[0].text.includes(stop));
  const stream = await client.completions.create({ model, prompt, max_tokens: 24, stop, ...greedy, stream: true });
  let streamed = '';
  let finish = null;
  for await (const ev of stream) {
    streamed += ev.choices[0]?.text ?? '';
    finish = ev.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(streamed, want);
  assert.equal(finish, 'stop');
});

await check('completions: logprobs 2', async () => {
  const r = await client.completions.create({ model, prompt: 'Logprobs please', max_tokens: 5, logprobs: 2, ...greedy });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, 5);
  assert.equal(lp.token_logprobs.length, 5);
  assert.equal(lp.top_logprobs.length, 5);
  assert.equal(lp.text_offset.length, 5);
  assert.equal(lp.tokens.join(''), r.choices[0].text);
  for (let i = 0; i < 5; i++) {
    assert.ok(lp.token_logprobs[i] <= 0);
    const top = Object.entries(lp.top_logprobs[i]);
    assert.ok(top.length >= 1 && top.length <= 3, `top_logprobs[${i}] has ${top.length}`);
    // Greedy: the sampled token is the most likely one.
    const best = Math.max(...top.map(([, v]) => v));
    assert.ok(Math.abs(best - lp.token_logprobs[i]) < 1e-5);
    if (i > 0) assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1]);
  }
});

await check('completions: echo with logprobs scores the prompt; prompt_logprobs agree', async () => {
  // What loglikelihood evaluations send: echo, logprobs 1, one new token.
  const body = { model, prompt: 'The cat sat on the', max_tokens: 1, ...greedy };
  const r = await client.completions.create({ ...body, echo: true, logprobs: 1 });
  const n = r.usage.prompt_tokens;
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, n + 1);
  assert.ok(r.choices[0].text.startsWith('The cat sat on the'));
  assert.equal(lp.token_logprobs[0], null);
  assert.equal(lp.top_logprobs[0], null);
  for (let i = 1; i <= n; i++) {
    assert.ok(lp.token_logprobs[i] <= 0, `token_logprobs[${i}] = ${lp.token_logprobs[i]}`);
    const top = Object.values(lp.top_logprobs[i]);
    assert.ok(top.length >= 1 && top.length <= 2);
    assert.ok(Math.max(...top) >= lp.token_logprobs[i]);
  }
  const p = await client.completions.create({ ...body, prompt_logprobs: 2 });
  const pl = p.choices[0].prompt_logprobs;
  assert.equal(pl.length, n);
  assert.equal(pl[0], null);
  for (let i = 1; i < n; i++) {
    const entries = Object.values(pl[i]);
    assert.ok(entries.length >= 2 && entries.length <= 3);
    // The echoed prompt token's logprob is among the entries, with its rank.
    const own = entries.find((e) => Math.abs(e.logprob - lp.token_logprobs[i]) < 1e-5);
    assert.ok(own, `prompt token ${i}: ${JSON.stringify(pl[i])} vs ${lp.token_logprobs[i]}`);
    assert.ok(own.rank >= 1);
  }
});

await check('chat: non-streamed and streamed agree; include_usage; logprobs with top_logprobs 2', async () => {
  const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say hi.' }];
  const body = { model, messages, max_tokens: 9, ...greedy };
  const r = await client.chat.completions.create({ ...body, logprobs: true, top_logprobs: 2 });
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 9);
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, 9);
  for (const t of content) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 2);
    assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob);
    assert.ok(Math.abs(t.top_logprobs[0].logprob - t.logprob) < 1e-5);
    assert.deepEqual(t.bytes, [...Buffer.from(t.token, 'utf8')]);
  }
  const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let role = null;
  let finish = null;
  const events = [];
  for await (const ev of stream) events.push(ev);
  for (const ev of events.slice(0, -1)) {
    assert.equal(ev.object, 'chat.completion.chunk');
    const d = ev.choices[0].delta;
    role = d.role ?? role;
    text += d.content ?? '';
    finish = ev.choices[0].finish_reason ?? finish;
  }
  assert.equal(role, 'assistant');
  assert.equal(text, r.choices[0].message.content);
  assert.equal(finish, 'length');
  assert.deepEqual(events.at(-1).choices, []);
  assert.deepEqual(events.at(-1).usage, r.usage);
});

await check('chat: max_completion_tokens, n = 2, stop', async () => {
  const messages = [{ role: 'user', content: 'Count to ten.' }];
  const base = await client.chat.completions.create({ model, messages, max_completion_tokens: 20, ...greedy });
  assert.equal(base.usage.completion_tokens, 20);
  const text = base.choices[0].message.content;
  assert.ok(text.length >= 5);
  const stop = text.slice(2, 4);
  const r = await client.chat.completions.create({ model, messages, max_completion_tokens: 20, n: 2, stop, ...greedy });
  assert.equal(r.choices.length, 2);
  for (const c of r.choices) {
    assert.equal(c.message.content, text.slice(0, text.indexOf(stop)));
    assert.equal(c.finish_reason, 'stop');
  }
});

await check('seed: temperature 1 is reproducible with a seed', async () => {
  const body = { model, prompt: 'Random walk:', max_tokens: 16, temperature: 1, ignore_eos: true };
  const a = await client.completions.create({ ...body, seed: 1234 });
  const b = await client.completions.create({ ...body, seed: 1234 });
  assert.equal(a.choices[0].text, b.choices[0].text);
  const others = [];
  for (const seed of [1, 2, 3]) others.push((await client.completions.create({ ...body, seed })).choices[0].text);
  assert.ok(others.some((t) => t !== a.choices[0].text), 'different seeds all gave the same text');
  const chatBody = { model, messages: [{ role: 'user', content: 'Pick a word.' }], max_tokens: 12, temperature: 1, seed: 99, ignore_eos: true };
  const c1 = await client.chat.completions.create(chatBody);
  const c2 = await client.chat.completions.create(chatBody);
  assert.equal(c1.choices[0].message.content, c2.choices[0].message.content);
});

await check('chat: response_format json_schema gives JSON of the schema, streamed or not', async () => {
  const schema = {
    type: 'object',
    properties: { color: { enum: ['red', 'green'] }, n: { type: 'integer' }, ok: { type: 'boolean' } },
    required: ['color', 'n', 'ok'],
  };
  const body = {
    model,
    messages: [{ role: 'user', content: 'Describe it in JSON.' }],
    max_tokens: maxModelLen - 64,
    temperature: 0,
    response_format: { type: 'json_schema', json_schema: { name: 'pick', schema } },
  };
  const r = await client.chat.completions.create(body);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const v = JSON.parse(r.choices[0].message.content);
  assert.deepEqual(Object.keys(v).sort(), ['color', 'n', 'ok']);
  assert.ok(['red', 'green'].includes(v.color));
  assert.ok(Number.isInteger(v.n));
  assert.equal(typeof v.ok, 'boolean');
  let streamed = '';
  for await (const chunk of await client.chat.completions.create({ ...body, stream: true }))
    streamed += chunk.choices[0]?.delta?.content ?? '';
  assert.equal(streamed, r.choices[0].message.content);
  await assert.rejects(
    client.chat.completions.create({ ...body, response_format: { type: 'json_schema', json_schema: { name: 'p', schema: { type: 'string', format: 'ipv6' } } } }),
    (e) => e.status === 400 && e.param === 'response_format',
  );
});

await check('completions and chat: guided_choice and guided_regex', async () => {
  const choices = ['positive', 'negative', 'neutral'];
  const c = await client.completions.create({ model, prompt: 'Sentiment:', max_tokens: 30, temperature: 1, seed: 5, guided_choice: choices });
  assert.ok(choices.includes(c.choices[0].text), c.choices[0].text);
  assert.equal(c.choices[0].finish_reason, 'stop');
  const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Sentiment?' }], max_tokens: 30, temperature: 0, structured_outputs: { choice: choices } });
  assert.ok(choices.includes(r.choices[0].message.content), r.choices[0].message.content);
  const g = await client.completions.create({ model, prompt: 'Code:', max_tokens: 30, temperature: 1, seed: 6, guided_regex: '[A-Z]{2}-\\d{3}' });
  assert.match(g.choices[0].text, /^[A-Z]{2}-\d{3}$/);
  assert.equal(g.choices[0].finish_reason, 'stop');
});

await check('completions and chat: guided_grammar (GBNF)', async () => {
  const grammar = 'root ::= item ("," item){0,2} "."\nitem ::= [a-z]{1,4} | "(" [0-9]+ ")"';
  const want = /^([a-z]{1,4}|\([0-9]+\))(,([a-z]{1,4}|\([0-9]+\))){0,2}\.$/;
  const c = await client.completions.create({ model, prompt: 'List:', max_tokens: 40, temperature: 1, seed: 8, guided_grammar: grammar });
  assert.match(c.choices[0].text, want);
  assert.equal(c.choices[0].finish_reason, 'stop');
  const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'List?' }], max_tokens: 40, temperature: 0, structured_outputs: { grammar } });
  assert.match(r.choices[0].message.content, want);
  await assert.rejects(
    client.completions.create({ model, prompt: 'x', max_tokens: 4, guided_grammar: 'root ::= expr\nexpr ::= expr "+" "1" | "1"' }),
    (e) => e.status === 400 && e.param === 'guided_grammar' && /left-recursive/.test(e.message),
  );
});

await check('chat: a named tool_choice calls the function with arguments of its schema; streamed, in pieces the client merges', async () => {
  const tools = [{
    type: 'function',
    function: {
      name: 'get_weather',
      parameters: { type: 'object', properties: { city: { enum: ['Paris', 'Oslo'] }, days: { type: 'integer' } }, required: ['city', 'days'] },
    },
  }];
  const body = {
    model,
    messages: [{ role: 'user', content: 'Weather?' }],
    max_tokens: maxModelLen - 64,
    temperature: 0,
    tools,
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  };
  const msg = (await client.chat.completions.create(body)).choices[0].message;
  assert.equal(msg.content, null);
  assert.equal(msg.tool_calls.length, 1);
  assert.equal(msg.tool_calls[0].function.name, 'get_weather');
  const args = JSON.parse(msg.tool_calls[0].function.arguments);
  assert.ok(['Paris', 'Oslo'].includes(args.city));
  assert.ok(Number.isInteger(args.days));

  const stream = client.chat.completions.stream(body);
  let pieces = 0;
  stream.on('tool_calls.function.arguments.delta', () => { pieces += 1; });
  const done = await stream.finalChatCompletion(); // the client checks each call's id, type, name
  const streamed = done.choices[0].message.tool_calls;
  assert.equal(streamed.length, 1);
  assert.equal(streamed[0].function.name, 'get_weather');
  assert.equal(streamed[0].function.arguments, msg.tool_calls[0].function.arguments, 'greedy: streamed equals non-streamed');
  assert.ok(pieces > 1, `arguments in ${pieces} piece(s)`);
});

await check('chat: tool_choice required (parallel_tool_calls false) calls one tool with arguments of its schema', async () => {
  const tools = [
    { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { enum: ['Paris', 'Oslo'] } }, required: ['city'] } } },
    { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: { utc: { type: 'boolean' } }, required: ['utc'] } } },
  ];
  const r = await client.chat.completions.create({
    model,
    messages: [{ role: 'user', content: 'Weather or time?' }],
    max_tokens: maxModelLen - 64,
    temperature: 0,
    tools,
    tool_choice: 'required',
    parallel_tool_calls: false, // one call: the random fixture would otherwise rarely close the list
  });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.content, null);
  assert.equal(c.message.tool_calls.length, 1);
  for (const call of c.message.tool_calls) {
    const args = JSON.parse(call.function.arguments);
    if (call.function.name === 'get_weather') assert.ok(['Paris', 'Oslo'].includes(args.city));
    else {
      assert.equal(call.function.name, 'get_time');
      assert.equal(typeof args.utc, 'boolean');
    }
  }
});

await check('responses: create, stream (the SDK assembles the events), text.format json_schema', async () => {
  const body = { model, input: 'Say something.', instructions: 'Be brief.', max_output_tokens: 12, temperature: 0 };
  const r = await client.responses.create(body);
  assert.equal(r.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
  assert.equal(typeof r.output_text, 'string');
  assert.ok(r.usage.output_tokens > 0 && r.usage.output_tokens <= 12);
  const stream = client.responses.stream(body);
  let deltas = '';
  for await (const event of stream) if (event.type === 'response.output_text.delta') deltas += event.delta;
  const final = await stream.finalResponse();  // (the SDK sets no output_text on it)
  const finalText = final.output.filter((o) => o.type === 'message')
    .flatMap((o) => o.content).filter((c) => c.type === 'output_text').map((c) => c.text).join('');
  assert.equal(finalText, r.output_text, 'greedy: streamed equals non-streamed');
  assert.equal(deltas, r.output_text);
  const schema = { type: 'object', properties: { n: { type: 'integer', minimum: 1, maximum: 5 } }, required: ['n'], additionalProperties: false };
  const j = await client.responses.create({
    model, input: 'A number?', max_output_tokens: maxModelLen - 64, temperature: 0,
    text: { format: { type: 'json_schema', name: 'pick', schema, strict: true } },
  });
  const parsed = JSON.parse(j.output_text);
  assert.ok(Number.isInteger(parsed.n) && parsed.n >= 1 && parsed.n <= 5, j.output_text);
  await assert.rejects(
    client.responses.create({ model, input: 'x', previous_response_id: 'resp_1' }),
    (e) => e.status === 404 && e.param === 'previous_response_id',
  );
});

await check('responses: a named function tool gives a function_call item, streamed in pieces; its output feeds the next turn, also through previous_response_id', async () => {
  const tools = [{
    type: 'function', name: 'get_weather',
    parameters: { type: 'object', properties: { city: { enum: ['Paris', 'Oslo'] } }, required: ['city'], additionalProperties: false },
  }];
  const r = await client.responses.create({
    model, input: 'Weather?', tools, tool_choice: { type: 'function', name: 'get_weather' },
    max_output_tokens: maxModelLen - 64, temperature: 0,
  });
  const calls = r.output.filter((o) => o.type === 'function_call');
  assert.equal(calls.length, 1, JSON.stringify(r.output));
  assert.equal(calls[0].name, 'get_weather');
  assert.ok(['Paris', 'Oslo'].includes(JSON.parse(calls[0].arguments).city), calls[0].arguments);
  // Streamed: the SDK assembles the call from its item and argument deltas.
  const stream = client.responses.stream({
    model, input: 'Weather?', tools, tool_choice: { type: 'function', name: 'get_weather' },
    max_output_tokens: maxModelLen - 64, temperature: 0,
  });
  let pieces = 0;
  for await (const event of stream) if (event.type === 'response.function_call_arguments.delta') pieces += 1;
  const streamedCalls = (await stream.finalResponse()).output.filter((o) => o.type === 'function_call');
  assert.equal(streamedCalls.length, 1);
  assert.equal(streamedCalls[0].arguments, calls[0].arguments, 'greedy: streamed equals non-streamed');
  assert.ok(pieces > 1, `arguments in ${pieces} piece(s)`);
  const next = await client.responses.create({
    model, tools, tool_choice: 'none', max_output_tokens: 8, temperature: 0,
    input: [
      { role: 'user', content: 'Weather?' },
      { type: 'function_call', call_id: calls[0].call_id, name: 'get_weather', arguments: calls[0].arguments },
      { type: 'function_call_output', call_id: calls[0].call_id, output: 'sunny' },
    ],
  });
  assert.equal(typeof next.output_text, 'string');
  assert.ok(next.usage.input_tokens > r.usage.input_tokens);
  // The same turn through the stored response: previous_response_id and only the call's output.
  const chained = await client.responses.create({
    model, tools, tool_choice: 'none', max_output_tokens: 8, temperature: 0, previous_response_id: r.id,
    input: [{ type: 'function_call_output', call_id: calls[0].call_id, output: 'sunny' }],
  });
  assert.equal(chained.previous_response_id, r.id);
  assert.equal(chained.usage.input_tokens, next.usage.input_tokens, 'the same conversation');
  assert.equal(chained.output_text, next.output_text);
  assert.equal((await client.responses.retrieve(r.id)).id, r.id);
  await client.responses.delete(r.id);
  await assert.rejects(client.responses.retrieve(r.id), (e) => e.status === 404);
});

await check('errors surface as openai.APIError with status and body', async () => {
  await assert.rejects(client.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 1 }), (e) => {
    assert.equal(e.status, 404);
    assert.equal(e.type, 'NotFoundError');
    return true;
  });
  await assert.rejects(client.completions.create({ model, prompt: 'x', max_tokens: maxModelLen + 1 }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.param, 'max_tokens');
    return true;
  });
});

console.log(`${passed} checks passed`);
