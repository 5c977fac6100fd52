// Structured output through the official client: `gptoss serve` on the built-in tiny model
// (random weights, so the whole answer is constrained) must answer JSON valid under the schema,
// for several schemas and many seeds, streamed or not; bad schemas are 400s. The same through
// /v1/responses' text.format (responses.create, responses.stream, retrieve).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer } from './harness.mjs';

const MODEL = 'tiny-structured';
let srv;
let client;

before(async () => {
  srv = await startServer(['--served-model-name', MODEL, '--max-model-len', '1024', '--max-num-seqs', '8']);
  client = new OpenAI({ apiKey: 'none', baseURL: srv.apiURL, maxRetries: 0, timeout: 300000 });
});

after(async () => {
  const e = await srv.stop();
  assert.equal(e.code, 0);
});

const isDate = (s) => /^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$/.test(s);

const schemas = [
  {
    name: 'pet',
    schema: {
      type: 'object',
      properties: {
        kind: { enum: ['cat', 'dog', 'fish'] },
        legs: { type: 'integer' },
        vaccinated: { type: 'boolean' },
        born: { type: 'string', format: 'date' },
      },
      required: ['kind', 'legs', 'vaccinated', 'born'],
      additionalProperties: false,
    },
    check(v) {
      assert.deepEqual(Object.keys(v).sort(), ['born', 'kind', 'legs', 'vaccinated']);
      assert.ok(['cat', 'dog', 'fish'].includes(v.kind));
      assert.ok(Number.isInteger(v.legs));
      assert.equal(typeof v.vaccinated, 'boolean');
      assert.ok(isDate(v.born), v.born);
    },
  },
  {
    name: 'points',
    schema: {
      type: 'object',
      properties: {
        points: {
          type: 'array', minItems: 1, maxItems: 3,
          items: { type: 'object', properties: { x: { type: 'number' }, y: { type: ['number', 'null'] } },
                   required: ['x', 'y'], additionalProperties: false },
        },
      },
      required: ['points'],
      additionalProperties: false,
    },
    check(v) {
      assert.deepEqual(Object.keys(v), ['points']);
      assert.ok(v.points.length >= 1 && v.points.length <= 3);
      for (const p of v.points) {
        assert.deepEqual(Object.keys(p).sort(), ['x', 'y']);
        assert.equal(typeof p.x, 'number');
        assert.ok(p.y === null || typeof p.y === 'number');
      }
    },
  },
];

for (const s of schemas) {
  test(`json_schema '${s.name}': valid for every seed, streamed or not`, async () => {
    for (let seed = 1; seed <= 4; seed++) {
      const req = {
        model: MODEL, seed, max_tokens: 300,
        messages: [{ role: 'user', content: 'Describe one in JSON.' }],
        response_format: { type: 'json_schema', json_schema: { name: s.name, strict: true, schema: s.schema } },
      };
      let content = '';
      let finish = null;
      if (seed % 2) {
        const r = await client.chat.completions.create(req);
        content = r.choices[0].message.content;
        finish = r.choices[0].finish_reason;
      } else {
        const stream = await client.chat.completions.create({ ...req, stream: true });
        for await (const chunk of stream) {
          const c = chunk.choices[0];
          if (c?.delta?.content) content += c.delta.content;
          if (c?.finish_reason) finish = c.finish_reason;
        }
      }
      assert.equal(finish, 'stop', `seed ${seed}: ${content}`);
      s.check(JSON.parse(content));
    }
  });
}

test('response_format errors are 400s naming response_format', async () => {
  const base = { model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: 'x' }] };
  for (const response_format of [
    { type: 'json_schema', json_schema: { name: 'x', strict: true, schema: { type: 'string', pattern: 'a+' } } },
    { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'nope' } } },
    { type: 'yaml' },
  ]) {
    await assert.rejects(client.chat.completions.create({ ...base, response_format }), (e) => {
      assert.equal(e.status, 400, e.message);
      assert.equal(e.param, 'response_format');
      return true;
    });
  }
});

// The message items' text (the SDK's output_text helper is set by create() only, not by a stream).
const messageText = (r) => r.output.filter((i) => i.type === 'message').flatMap((i) => i.content)
  .filter((c) => c.type === 'output_text').map((c) => c.text).join('');

for (const s of schemas) {
  test(`responses text.format json_schema '${s.name}': valid for every run, streamed or not, stored`, async () => {
    for (let run = 1; run <= 4; run++) {
      const req = {
        model: MODEL, max_output_tokens: 300, input: 'Describe one in JSON.',
        text: { format: { type: 'json_schema', name: s.name, strict: true, schema: s.schema } },
      };
      let r;
      if (run % 2) {
        r = await client.responses.create(req);
      } else {
        const stream = client.responses.stream(req);
        let deltas = '';
        for await (const ev of stream) if (ev.type === 'response.output_text.delta') deltas += ev.delta;
        r = await stream.finalResponse();
        assert.equal(deltas, messageText(r));
      }
      const text = messageText(r);
      assert.equal(r.status, 'completed', `run ${run}: ${text}`);
      s.check(JSON.parse(text));
      assert.equal(r.text.format.type, 'json_schema');
      assert.equal(r.text.format.name, s.name);
      const got = await client.responses.retrieve(r.id);
      assert.deepEqual(got.text.format, r.text.format);
      assert.equal(messageText(got), text);
    }
  });
}

test('responses text.format errors are 400s naming text.format', async () => {
  const base = { model: MODEL, max_output_tokens: 4, input: 'x' };
  for (const [format, param] of [
    [{ type: 'json_schema', name: 'x', strict: true, schema: { type: 'string', pattern: 'a+' } }, 'text.format'],
    [{ type: 'json_schema', name: 'x', schema: { type: 'nope' } }, 'text.format'],
    [{ type: 'json_schema', name: 'x' }, 'text.format.schema'],
    [{ type: 'yaml' }, 'text.format.type'],
  ]) {
    await assert.rejects(client.responses.create({ ...base, text: { format } }), (e) => {
      assert.equal(e.status, 400, e.message);
      assert.equal(e.param, param);
      return true;
    });
  }
});
