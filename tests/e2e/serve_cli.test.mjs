// SIGTERM drains running requests; bench-serve runs against the tiny model (numbers not asserted).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import OpenAI from 'openai';
import { startServer, BIN } from './harness.mjs';

test('bench-serve smoke test', async () => {
  const srv = await startServer(['--max-num-seqs', '8']);
  try {
    const out = await new Promise((resolve, reject) => {
      const p = spawn(BIN, ['bench-serve', '--base-url', srv.apiURL, '--model', 'gpt-oss-tiny', '--requests', '16',
                            '--concurrency', '4', '--max-tokens', '16', '--json', '-'], { stdio: ['ignore', 'pipe', 'inherit'] });
      let s = '';
      p.stdout.on('data', (d) => { s += d; });
      p.on('exit', (code) => (code === 0 ? resolve(s) : reject(new Error(`bench-serve exited ${code}:\n${s}`))));
    });
    process.stdout.write(out);
    const j = JSON.parse(out);  // with --json -, stdout is the JSON alone (the text goes to stderr)
    assert.equal(j.ok, 16);
    assert.equal(j.failed, 0);
    assert.ok(j.completion_tokens > 0);
    for (const k of ['ttft_median_ms', 'ttft_p99_ms', 'decode_tok_s_per_stream_median', 'aggregate_tok_s', 'total_s'])
      assert.equal(typeof j[k], 'number', k);
  } finally {
    await srv.stop();
  }
});

test('bench-serve --depth: llama-benchy\'s pp/tg table at context depths', async () => {
  const srv = await startServer(['--max-num-seqs', '2']);
  try {
    const r = await new Promise((resolve, reject) => {
      const p = spawn(BIN, ['bench-serve', '--base-url', srv.apiURL, '--depth', '0,128', '--pp', '32,64', '--tg', '8',
                            '--runs', '2', '--latency-mode', 'generation', '--json', '-'],
                      { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      let err = '';
      p.stdout.on('data', (d) => { out += d; });
      p.stderr.on('data', (d) => { err += d; });
      p.on('exit', (code) => (code === 0 ? resolve({ out, err }) : reject(new Error(`bench-serve exited ${code}:\n${out}${err}`))));
    });
    process.stdout.write(r.err);
    const j = JSON.parse(r.out);  // the table goes to stderr, the JSON alone to stdout
    assert.equal(j.model, 'gpt-oss-tiny');  // from /v1/models
    assert.equal(j.ok, 8);
    assert.equal(j.failed, 0);
    assert.deepEqual(j.tests.map((t) => t.pp_test), ['pp32', 'pp64', 'pp32 @ d128', 'pp64 @ d128']);
    for (const t of j.tests) {
      assert.equal(t.ok, 2);
      assert.equal(t.tg_test, t.depth ? `tg8 @ d${t.depth}` : 'tg8');
      assert.ok(t.tg_tok_s.mean > 0 && t.ttfr_ms.mean > 0, JSON.stringify(t));
    }
    for (const row of ['| model ', 'pp64 @ d128 |', 'tg8 @ d128 |', 'latency mode: generation'])
      assert.ok(r.err.includes(row), row);
  } finally {
    await srv.stop();
  }
});

test('bench-serve reports the server\'s error message', async () => {
  const srv = await startServer(['--max-num-seqs', '2']);
  try {
    const r = await new Promise((resolve) => {
      const p = spawn(BIN, ['bench-serve', '--base-url', srv.apiURL, '--model', 'no-such-model', '--requests', '2',
                            '--concurrency', '1', '--max-tokens', '4'], { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      p.stdout.on('data', (d) => { out += d; });
      p.stderr.on('data', (d) => { out += d; });
      p.on('exit', (code) => resolve({ code, out }));
    });
    assert.equal(r.code, 1, r.out);
    assert.match(r.out, /first error: HTTP 404: The model `no-such-model` does not exist\./, r.out);
  } finally {
    await srv.stop();
  }
});

test('SIGTERM lets running streams finish, then exits 0', async () => {
  const srv = await startServer(['--max-num-seqs', '4']);
  const client = new OpenAI({ apiKey: 'x', baseURL: srv.apiURL, maxRetries: 0 });
  const s = await client.completions.create({
    model: 'gpt-oss-tiny', prompt: 'Once upon a time', max_tokens: 300, stream: true, ignore_eos: true,
    stream_options: { include_usage: true },
  });
  let usage = null;
  let finish = null;
  let n = 0;
  for await (const ch of s) {
    if (n++ === 2) srv.proc.kill('SIGTERM');
    if (ch.usage) usage = ch.usage;
    if (ch.choices.length && ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 300);
  const e = await srv.wait();
  assert.equal(e.code, 0);
});

test('a second SIGINT exits at once, without waiting for the drain', async () => {
  const srv = await startServer(['--max-num-seqs', '2', '--drain-timeout', '600']);
  const client = new OpenAI({ apiKey: 'x', baseURL: srv.apiURL, maxRetries: 0 });
  const s = await client.completions.create({
    model: 'gpt-oss-tiny', prompt: 'Once upon a time', max_tokens: 3000, stream: true, ignore_eos: true,
  });
  const it = s[Symbol.asyncIterator]();
  await it.next();
  srv.proc.kill('SIGINT');
  for (let i = 0; i < 300 && !srv.log().includes('draining'); i++) await new Promise((r) => setTimeout(r, 100));
  assert.match(srv.log(), /SIGINT, draining 1 request/);
  srv.proc.kill('SIGINT');
  // The drain would take minutes (3000 tokens, --drain-timeout 600): the exit must not wait for it.
  const e = await Promise.race([srv.wait(), new Promise((r) => setTimeout(() => r('still running'), 60000))]);
  assert.deepEqual(e, { code: 130, signal: null });
  assert.match(srv.log(), /second SIGINT, exiting now/);
  await it.return?.().catch(() => {});
});
