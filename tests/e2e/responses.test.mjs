// /v1/responses of `gptoss serve` on the built-in tiny model through the official client:
// create, stream (the SDK's own event accumulation), retrieve, delete, previous_response_id,
// and a store that outlives the server (SQLite file given by --response-store).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer } from './harness.mjs';

const KEY = 'e2e-responses-key';
const MODEL = 'tiny-responses';
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gptoss-responses-'));
const storePath = path.join(dir, 'store', 'responses.sqlite');
const args = ['--api-key', KEY, '--served-model-name', MODEL, '--max-model-len', '1024', '--response-store', storePath];
let srv;
let client;

before(async () => {
  srv = await startServer(args);
  client = new OpenAI({ apiKey: KEY, baseURL: srv.apiURL, maxRetries: 0, timeout: 120000 });
});

after(async () => {
  if (srv) await srv.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

// The text of a response's items of one kind (message: output_text parts; reasoning: reasoning_text).
const textOf = (r, type) => r.output.filter((i) => i.type === type).flatMap((i) => i.content).map((p) => p.text).join('');

async function expectStatus(promise, status, param) {
  await assert.rejects(promise, (e) => {
    assert.ok(e instanceof OpenAI.APIError, `expected an APIError, got ${e}`);
    assert.equal(e.status, status, e.message);
    if (param !== undefined) assert.equal(e.param, param);
    return true;
  });
}

test('responses.create, retrieve, delete', async () => {
  const r = await client.responses.create({ model: MODEL, input: 'Say hello.', instructions: 'Be brief.',
                                            max_output_tokens: 12, temperature: 0, metadata: { run: 'e2e' } });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
  assert.equal(r.model, MODEL);
  assert.equal(r.instructions, 'Be brief.');
  assert.deepEqual(r.metadata, { run: 'e2e' });
  assert.ok(r.output.length >= 1);
  for (const item of r.output) assert.ok(['reasoning', 'message', 'function_call'].includes(item.type), item.type);
  assert.equal(r.output_text, textOf(r, 'message'), 'the SDK joins output_text from the message items');
  assert.ok(r.usage.output_tokens <= 12 && r.usage.output_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.equal(typeof r.usage.output_tokens_details.reasoning_tokens, 'number');

  const got = await client.responses.retrieve(r.id);
  assert.deepEqual(got.output, r.output);
  await client.responses.delete(r.id);
  await expectStatus(client.responses.retrieve(r.id), 404);
  await expectStatus(client.responses.delete(r.id), 404);
});

test('responses.stream: the SDK accumulates the events into the final response', async () => {
  const stream = client.responses.stream({ model: MODEL, input: 'Tell me a story.', max_output_tokens: 10 });
  const seen = [];
  let text = '';
  let reasoning = '';
  for await (const ev of stream) {
    seen.push(ev);
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.reasoning_text.delta') reasoning += ev.delta;
  }
  const final = await stream.finalResponse();
  assert.equal(seen[0].type, 'response.created');
  assert.equal(seen[1].type, 'response.in_progress');
  seen.forEach((e, i) => assert.equal(e.sequence_number, i));
  assert.ok(['response.completed', 'response.incomplete'].includes(seen.at(-1).type));
  assert.ok(seen.some((e) => e.type === 'response.output_item.added'));
  assert.ok(seen.some((e) => e.type === 'response.output_item.done'));
  assert.equal(textOf(final, 'message'), text);
  assert.equal(textOf(final, 'reasoning'), reasoning);
  assert.ok(text.length + reasoning.length > 0);
  // a streamed response is stored as well
  // (the SDK keeps its own snapshot unless the stream ends in response.completed: compare texts)
  const got = await client.responses.retrieve(final.id);
  assert.deepEqual(got.output.map((i) => i.id), final.output.map((i) => i.id));
  assert.equal(textOf(got, 'message'), text);
  assert.equal(textOf(got, 'reasoning'), reasoning);
});

test('previous_response_id continues the stored conversation; function_call items round-trip', async () => {
  const first = await client.responses.create({ model: MODEL, input: 'Remember the number 7.', max_output_tokens: 6 });
  const alone = await client.responses.create({ model: MODEL, input: 'Which number?', max_output_tokens: 4, store: false });
  const next = await client.responses.create({ model: MODEL, input: 'Which number?', max_output_tokens: 4,
                                               previous_response_id: first.id });
  assert.equal(next.previous_response_id, first.id);
  assert.ok(next.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens - 1,
            `${next.usage.input_tokens} vs ${alone.usage.input_tokens}`);
  await expectStatus(client.responses.retrieve(alone.id), 404);  // store: false
  // A client-side tool loop: the call and its output go back as items.
  const tools = [{ type: 'function', name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } }];
  const r = await client.responses.create({
    model: MODEL, tools, max_output_tokens: 4, input: [
      { role: 'user', content: 'Weather in Paris?' },
      { type: 'reasoning', id: 'rs_1', summary: [], content: [{ type: 'reasoning_text', text: 'I should call the tool.' }] },
      { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
      { type: 'function_call_output', call_id: 'call_1', output: '{"temp":21}' },
    ] });
  assert.ok(r.usage.input_tokens > 0);
  await expectStatus(client.responses.create({ model: MODEL, input: 'x', previous_response_id: 'resp_missing' }), 404,
                     'previous_response_id');
});

test('fields it cannot honour are refused by name', async () => {
  // (text.format itself is honoured: tests/e2e/structured.test.mjs; a bad one names its field.)
  await expectStatus(client.responses.create({ model: MODEL, input: 'x',
    text: { format: { type: 'json_schema', name: 'n' } } }), 400, 'text.format.schema');
  await expectStatus(client.responses.create({ model: MODEL, input: 'x', text: { verbosity: 'low' } }), 400,
                     'text.verbosity');
  await expectStatus(client.responses.create({ model: MODEL, input: 'x', reasoning: { summary: 'auto' } }), 400,
                     'reasoning.summary');
  await expectStatus(client.responses.create({ model: MODEL, input: 'x', tools: [{ type: 'web_search' }] }), 400,
                     'tools[0].type');
  const noKey = new OpenAI({ apiKey: 'wrong', baseURL: srv.apiURL, maxRetries: 0 });
  await expectStatus(noKey.responses.create({ model: MODEL, input: 'x' }), 401);
});

test('stored responses outlive the server', async () => {
  const r = await client.responses.create({ model: MODEL, input: 'Keep this.', max_output_tokens: 3 });
  const e = await srv.stop();
  assert.equal(e.code, 0);
  assert.ok(fs.existsSync(storePath), 'the store file is where --response-store says');
  srv = await startServer(args);
  client = new OpenAI({ apiKey: KEY, baseURL: srv.apiURL, maxRetries: 0, timeout: 120000 });
  const got = await client.responses.retrieve(r.id);
  assert.deepEqual(got.output, r.output);
});
