// The OpenAI API of `gptoss serve` on the built-in tiny model, driven by the official client.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import OpenAI from 'openai';
import { startServer, metrics } from './harness.mjs';

const KEY = 'e2e-secret-key';
const MODEL = 'tiny-e2e';
let srv;
let client;

before(async () => {
  srv = await startServer(['--api-key', KEY, '--served-model-name', MODEL, '--max-model-len', '2048',
                           '--max-num-seqs', '8', '--max-body-mb', '1']);
  client = new OpenAI({ apiKey: KEY, baseURL: srv.apiURL, maxRetries: 0, timeout: 120000 });
});

after(async () => {
  const e = await srv.stop();
  assert.equal(e.code, 0, 'the server exits 0 on SIGTERM');
});

const user = (content) => [{ role: 'user', content }];

async function tokenCount(body) {
  const r = await fetch(`${srv.baseURL}/tokenize`, { method: 'POST', body: JSON.stringify(body) });
  assert.equal(r.status, 200);
  return (await r.json()).count;
}

async function expectStatus(promise, status, param) {
  await assert.rejects(promise, (e) => {
    assert.ok(e instanceof OpenAI.APIError, `expected an APIError, got ${e}`);
    assert.equal(e.status, status, e.message);
    assert.ok(e.error && typeof e.error.message === 'string', 'OpenAI error object');
    if (param !== undefined) assert.equal(e.param, param);
    return true;
  });
}

async function rawPost(path, body, headers = {}) {
  const r = await fetch(`${srv.apiURL}${path}`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json', ...headers },
    body,
  });
  return { status: r.status, json: await r.json() };
}

test('models list', async () => {
  const list = await client.models.list();
  const ids = [];
  for await (const m of list) ids.push(m.id);
  assert.deepEqual(ids, [MODEL]);
  const one = await client.models.retrieve(MODEL);
  assert.equal(one.id, MODEL);
});

test('chat completion, usage matches the tokenizer', async () => {
  const messages = [{ role: 'system', content: 'You are terse.' }, ...user('Say hello.')];
  const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 12, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, MODEL);
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.ok(['stop', 'length', 'tool_calls'].includes(c.finish_reason));
  assert.equal(r.usage.prompt_tokens, await tokenCount({ messages }));
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 12);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  if (c.finish_reason === 'length') assert.equal(r.usage.completion_tokens, 12);
});

test('streamed chat equals the plain answer; include_usage', async () => {
  const req = { model: MODEL, messages: user('Count to five.'), max_tokens: 16, temperature: 0, logprobs: true, top_logprobs: 2 };
  const plain = await client.chat.completions.create(req);
  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let content = '';
  let reasoning = '';
  let finish = null;
  let usage = null;
  let lps = [];
  let role = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    if (!chunk.choices.length) continue;
    const ch = chunk.choices[0];
    if (ch.delta.role) role = ch.delta.role;
    if (ch.delta.content) content += ch.delta.content;
    if (ch.delta.reasoning_content) reasoning += ch.delta.reasoning_content;
    if (ch.logprobs?.content) lps.push(...ch.logprobs.content);
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  assert.equal(role, 'assistant');
  assert.deepEqual(usage, plain.usage);
  assert.equal(finish, plain.choices[0].finish_reason);
  assert.equal(content, plain.choices[0].message.content ?? '');
  assert.equal(reasoning, plain.choices[0].message.reasoning_content ?? '');
  assert.equal(lps.length, usage.completion_tokens, 'one logprob entry per generated token');
  assert.deepEqual(lps.map((l) => l.token), plain.choices[0].logprobs.content.map((l) => l.token));
  for (const l of lps) {
    assert.ok(l.logprob <= 0);
    assert.equal(l.top_logprobs.length, 2);
  }
});

test('reasoning fields, tools, tool results and earlier reasoning are accepted', async () => {
  const tools = [{
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Current weather in a city',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    },
  }];
  const r1 = await client.chat.completions.create({
    model: MODEL, messages: user('Weather in Paris?'), tools, tool_choice: 'auto', reasoning_effort: 'low', max_tokens: 8,
  });
  const m = r1.choices[0].message;
  assert.ok(['stop', 'length', 'tool_calls'].includes(r1.choices[0].finish_reason));
  if (m.reasoning_content !== undefined) assert.equal(m.reasoning, m.reasoning_content);
  if (r1.choices[0].finish_reason === 'tool_calls') assert.ok(m.tool_calls.length >= 1);
  // A whole tool round trip sent back: reasoning, a tool call, its result.
  const messages = [
    ...user('Weather in Paris?'),
    {
      role: 'assistant', content: null, reasoning_content: 'I should call get_weather.',
      tool_calls: [{ id: 'call_abc', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }],
    },
    { role: 'tool', tool_call_id: 'call_abc', content: '{"temperature_c": 21}' },
  ];
  const r2 = await client.chat.completions.create({ model: MODEL, messages, tools, max_tokens: 8, reasoning_effort: 'high' });
  assert.equal(r2.object, 'chat.completion');
  const withTools = await tokenCount({ messages, tools });
  assert.equal(r2.usage.prompt_tokens, withTools);
  // tool_choice none and required are accepted too
  for (const tool_choice of ['none', 'required', { type: 'function', function: { name: 'get_weather' } }]) {
    const r = await client.chat.completions.create({ model: MODEL, messages: user('hi'), tools, tool_choice, max_tokens: 2 });
    assert.equal(r.choices.length, 1);
  }
});

test('completions: text and token-id prompts, logprobs, streaming', async () => {
  const r = await client.completions.create({ model: MODEL, prompt: 'Hello world', max_tokens: 6, temperature: 0, logprobs: 3 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.usage.prompt_tokens, 2); // "Hello" " world" in o200k
  assert.equal(r.choices[0].logprobs.tokens.length, r.usage.completion_tokens);
  assert.equal(r.choices[0].logprobs.top_logprobs[0] && Object.keys(r.choices[0].logprobs.top_logprobs[0]).length, 3);
  const ids = [13225, 2375, 0, 1, 2, 3];
  const t = await client.completions.create({ model: MODEL, prompt: ids, max_tokens: 4, temperature: 0 });
  assert.equal(t.usage.prompt_tokens, ids.length);
  const s = await client.completions.create({
    model: MODEL, prompt: 'Hello world', max_tokens: 6, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let usage = null;
  for await (const ch of s) {
    if (ch.usage) usage = ch.usage;
    if (ch.choices.length) text += ch.choices[0].text;
  }
  assert.equal(text, r.choices[0].text);
  assert.deepEqual(usage, r.usage);
  assert.equal(await tokenCount({ prompt: 'Hello world' }), 2);
});

test('every field is honoured or refused by name (logit_bias, reasoning object, response_format, legacy fields)', async () => {
  const base = { model: MODEL, messages: user('hi'), max_tokens: 4, temperature: 0 };
  const tk = await fetch(`${srv.baseURL}/tokenize`, { method: 'POST', body: JSON.stringify({ prompt: ' cat' }) });
  const [cat] = (await tk.json()).tokens;
  const biased = await client.chat.completions.create({ ...base, logit_bias: { [cat]: 100 } });
  assert.equal(biased.choices[0].message.content, ' cat cat cat cat');
  const c = await client.completions.create({ model: MODEL, prompt: 'Once', max_tokens: 3, logit_bias: { [cat]: 100 } });
  assert.equal(c.choices[0].text, ' cat cat cat');
  const tokens = async (body) => {
    const r = await fetch(`${srv.baseURL}/tokenize`, { method: 'POST', body: JSON.stringify(body) });
    assert.equal(r.status, 200);
    return (await r.json()).tokens;
  };
  assert.deepEqual(await tokens({ messages: base.messages, reasoning: { effort: 'high' } }),
                   await tokens({ messages: base.messages, reasoning_effort: 'high' }));
  const r = await client.chat.completions.create({ ...base, reasoning: { effort: 'high' } });
  assert.equal(r.usage.prompt_tokens, (await tokens({ messages: base.messages, reasoning_effort: 'high' })).length);
  const refused = async (promise, param) => {
    await assert.rejects(promise, (e) => {
      assert.equal(e.status, 400, e.message);
      assert.equal(e.param, param);
      assert.equal(e.code, 'unsupported_value');
      assert.equal(e.type, 'invalid_request_error');
      return true;
    });
  };
  // response_format is honoured (structured.test.mjs); keys it does not know are refused by name.
  await refused(client.chat.completions.create({
    ...base, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object' }, extra: 1 } },
  }), 'response_format.json_schema.extra');
  await refused(client.chat.completions.create({ ...base, functions: [{ name: 'f', parameters: {} }] }), 'functions');
  await refused(client.chat.completions.create({ ...base, function_call: 'auto' }), 'function_call');
  await refused(client.chat.completions.create({ ...base, repetition_penalty: 1.2 }), 'repetition_penalty');
  await refused(client.chat.completions.create({ ...base, made_up_field: 1 }), 'made_up_field');
  await refused(client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 2, best_of: 2 }), 'best_of');
  await refused(client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 2, suffix: 'y' }), 'suffix');
  // known harmless fields pass
  const ok = await client.chat.completions.create({ ...base, user: 'u-1', n: 1, metadata: { a: 'b' }, parallel_tool_calls: true });
  assert.equal(ok.choices.length, 1);
});

test('completions: harmony specials in a text prompt; echo with prompt logprobs; text_offset in characters', async () => {
  const h = await client.completions.create({
    model: MODEL, prompt: '<|start|>user<|message|>Hi<|end|><|start|>assistant', max_tokens: 1,
  });
  assert.equal(h.usage.prompt_tokens, 7);
  const prompt = 'Grüße aus Köln';
  const r = await client.completions.create({ model: MODEL, prompt, max_tokens: 3, temperature: 0, logprobs: 1, echo: true });
  const lp = r.choices[0].logprobs;
  assert.ok(r.choices[0].text.startsWith(prompt));
  assert.equal(lp.tokens.length, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(lp.token_logprobs[0], null);
  assert.ok(lp.token_logprobs.slice(1).every((v) => typeof v === 'number' && v <= 0));
  let chars = 0;
  for (let i = 0; i < r.usage.prompt_tokens; ++i) {
    assert.equal(lp.text_offset[i], chars);
    chars += [...lp.tokens[i]].length;
  }
  assert.equal(lp.text_offset[r.usage.prompt_tokens], [...prompt].length);
});

test('streamed logprobs ride with their text; the random model streams at once; /tokenize options', async () => {
  const req = { model: MODEL, messages: user('Tell me a story.'), max_tokens: 40, temperature: 0, logprobs: true, ignore_eos: true };
  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { continuous_usage_stats: true } });
  let firstTextAt = null;
  let n = 0;
  for await (const chunk of stream) {
    if (!chunk.choices.length) continue;
    const ch = chunk.choices[0];
    const hasText = !!(ch.delta.content || ch.delta.reasoning_content || ch.delta.tool_calls);
    if (ch.logprobs?.content?.length) {
      assert.ok(hasText || ch.finish_reason, `logprobs without text: ${JSON.stringify(chunk)}`);
      n += ch.logprobs.content.length;
    }
    if (firstTextAt === null && ch.delta.content && chunk.usage) firstTextAt = chunk.usage.completion_tokens;
  }
  assert.equal(n, 40);
  assert.ok(firstTextAt !== null && firstTextAt <= 4, `first text after ${firstTextAt} tokens (was 48)`);
  const tokenize = async (body) => {
    const r = await fetch(`${srv.baseURL}/tokenize`, { method: 'POST', body: JSON.stringify(body) });
    assert.equal(r.status, 200);
    return r.json();
  };
  const t = await tokenize({ prompt: 'Hello world', return_token_strs: true });
  assert.deepEqual(t.token_strs, ['Hello', 'Ġworld']);
  const withGen = await tokenize({ messages: user('hi') });
  const noGen = await tokenize({ messages: user('hi'), add_generation_prompt: false });
  assert.equal(withGen.count, noGen.count + 2);
  const d = await fetch(`${srv.baseURL}/detokenize`, { method: 'POST', body: JSON.stringify({ tokens: t.tokens }) });
  assert.equal((await d.json()).prompt, 'Hello world');
});

test('seeded sampling is reproducible', async () => {
  const req = { model: MODEL, prompt: 'The', max_tokens: 10, temperature: 1.0, top_p: 0.9, top_k: 50, seed: 1234 };
  const a = await client.completions.create(req);
  const b = await client.completions.create(req);
  assert.equal(a.choices[0].text, b.choices[0].text);
});

test('401 without or with a wrong key; /health and /metrics stay open', async () => {
  const anon = new OpenAI({ apiKey: 'wrong', baseURL: srv.apiURL, maxRetries: 0 });
  await expectStatus(anon.chat.completions.create({ model: MODEL, messages: user('hi') }), 401);
  await expectStatus(anon.models.list(), 401);
  const r = await fetch(`${srv.apiURL}/models`);
  assert.equal(r.status, 401);
  assert.equal((await r.json()).error.code, 'invalid_api_key');
  assert.equal((await fetch(`${srv.baseURL}/health`)).status, 200);
  assert.equal((await fetch(`${srv.baseURL}/metrics`)).status, 200);
});

test('bad requests get OpenAI errors with the right status', async () => {
  const base = { model: MODEL, messages: user('hi'), max_tokens: 4 };
  await expectStatus(client.chat.completions.create({ ...base, model: 'nope' }), 404, 'model');
  await expectStatus(client.chat.completions.create({ ...base, messages: [] }), 400, 'messages');
  await expectStatus(client.chat.completions.create({ ...base, max_tokens: 0 }), 400, 'max_tokens');
  await expectStatus(client.chat.completions.create({ ...base, max_tokens: -5 }), 400, 'max_tokens');
  await expectStatus(client.chat.completions.create({ ...base, max_tokens: 'many' }), 400, 'max_tokens');
  await expectStatus(client.chat.completions.create({ ...base, temperature: 'hot' }), 400, 'temperature');
  await expectStatus(client.chat.completions.create({ ...base, messages: 'hi' }), 400, 'messages');
  await expectStatus(client.chat.completions.create({ ...base, messages: [{ role: 'user' }] }), 400);
  await expectStatus(client.chat.completions.create({ ...base, messages: [{ role: 'alien', content: 'x' }] }), 400);
  await expectStatus(client.chat.completions.create({ ...base, top_p: 7 }), 400, 'top_p');
  await expectStatus(client.chat.completions.create({ ...base, n: 3 }), 400, 'n');
  // prompt longer than --max-model-len (2048)
  const long = 'hello '.repeat(2500);
  await expectStatus(client.chat.completions.create({ ...base, messages: user(long) }), 400, 'messages');
  await expectStatus(client.completions.create({ model: MODEL, prompt: long, max_tokens: 1 }), 400, 'prompt');
  // prompt + max_tokens past the context
  await expectStatus(client.chat.completions.create({ ...base, max_tokens: 5000 }), 400, 'max_tokens');
  await expectStatus(client.completions.create({ model: MODEL, prompt: [1, 999999999], max_tokens: 1 }), 400, 'prompt');
  await expectStatus(client.completions.create({ model: MODEL, prompt: '', max_tokens: 1 }), 400, 'prompt');
  // malformed JSON and a non-object body
  let r = await rawPost('/chat/completions', '{"model": "x", "messages": [');
  assert.equal(r.status, 400);
  assert.equal(r.json.error.type, 'invalid_request_error');
  r = await rawPost('/chat/completions', '"just a string"');
  assert.equal(r.status, 400);
  // a body over --max-body-mb (1 MiB)
  r = await rawPost('/chat/completions', JSON.stringify({ ...base, messages: user('x'.repeat(2 * 1024 * 1024)) }));
  assert.equal(r.status, 413);
  assert.ok(r.json.error.message);
  // unknown route
  const nf = await fetch(`${srv.apiURL}/engines`, { headers: { Authorization: `Bearer ${KEY}` } });
  assert.equal(nf.status, 404);
  assert.ok((await nf.json()).error);
  // and everyone else is still served
  const ok = await client.chat.completions.create(base);
  assert.equal(ok.choices.length, 1);
});

test('slow and vanishing clients do not hurt others', async () => {
  // A client that sends half its headers and stalls, one that sends half a body and vanishes,
  // and one that sends garbage.
  const stall = net.connect(srv.port, '127.0.0.1', () => stall.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n'));
  await new Promise((res) => {
    const v = net.connect(srv.port, '127.0.0.1', () => {
      v.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\nAuthorization: Bearer ' + KEY + '\r\n\r\n{"mess');
      v.destroy();
      res();
    });
  });
  await new Promise((res) => {
    const g = net.connect(srv.port, '127.0.0.1', () => g.write('\x00\x01garbage\r\n\r\n'));
    g.on('data', () => {});
    g.on('close', res);
    g.on('error', res);
    setTimeout(() => { g.destroy(); res(); }, 2000);
  });
  const results = await Promise.all([1, 2, 3].map(() =>
    client.chat.completions.create({ model: MODEL, messages: user('still there?'), max_tokens: 4 })));
  for (const r of results) assert.equal(r.choices.length, 1);
  stall.destroy();
  const m = await metrics(srv.baseURL);
  assert.ok(m['gptoss:generation_tokens_total'] > 0);
  assert.ok('gptoss:time_to_first_token_seconds_count' in m);
  assert.ok('gptoss:kv_cache_usage_perc' in m);
});
