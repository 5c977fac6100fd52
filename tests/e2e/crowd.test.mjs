// The HTTP layer under a crowd (issue 19): 2,000 idle connections plus 300 slowloris clients
// while 32 streams generate: /health still answers (its latency is printed, not asserted),
// the streams give the same tokens as without the crowd, and the server's thread count stays
// flat. Then 1,000 concurrent SSE streams complete. The figures go to docs/BENCHMARKS.md
// (scripts/bench/http_crowd.mjs runs the same scenario against any build, the old one too).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startServer } from './harness.mjs';
import { crowdScenario, procStatus, streamCompletion } from './crowd.mjs';

test('2,000 idle + 300 slowloris connections: /health answers, 32 streams unchanged, threads flat', async () => {
  // Timeouts longer than the test, so that the server holds the whole crowd throughout.
  const srv = await startServer(['--max-num-seqs', '32', '--keep-alive-timeout', '600', '--read-timeout', '600']);
  try {
    const r = await crowdScenario(srv, { idle: 2000, slow: 300, streams: 32, maxTokens: 16 });
    for (let i = 0; i < 32; i++) {
      assert.equal(r.alone[i].finish, 'length', `request ${i} alone: ${r.alone[i].error ?? ''}`);
      assert.equal(r.alone[i].toks.length, 16);
      assert.ok(r.crowded[i].done, `request ${i} with the crowd finished: ${r.crowded[i].error ?? ''}`);
      assert.deepEqual(r.crowded[i].toks, r.alone[i].toks, `request ${i} differs with the crowd`);
    }
    assert.ok(r.healthSamples.length > 0);
    assert.equal(r.healthAnswered, r.healthSamples.length, '/health answered every probe (within 30 s)');
    assert.ok(r.healthSamples.every((h) => h.status === 200));
    assert.equal(r.slowAnswered, 0, 'no slowloris request completed');
    assert.equal(r.idleClosedDuring, 0, 'the server held the idle connections');
    assert.equal(r.threadsWithIdle, r.threadsBefore, 'no thread per connection');
    for (const t of r.threadSamples) assert.equal(t, r.threadsBefore, 'thread count flat');
  } finally {
    const e = await srv.stop();
    assert.equal(e.code, 0);
  }
});

test('1,000 concurrent SSE streams complete', async () => {
  const srv = await startServer(['--max-num-seqs', '1000', '--max-model-len', '64', '--max-num-batched-tokens', '4096']);
  try {
    await streamCompletion(srv.baseURL, 0, 2);  // warm-up: the CPU backend starts its threads
    const t0 = Date.now();
    const threads0 = procStatus(srv.proc.pid).threads;
    let maxThreads = threads0;
    const timer = setInterval(() => { maxThreads = Math.max(maxThreads, procStatus(srv.proc.pid).threads); }, 100);
    const rs = await Promise.all(Array.from({ length: 1000 }, (_, i) => streamCompletion(srv.baseURL, i, 2, 300000)
      .catch((e) => ({ error: String(e) }))));
    clearInterval(timer);
    const complete = rs.filter((r) => r.done && r.finish === 'length' && r.usage?.completion_tokens === 2).length;
    console.log(`1000 concurrent streams: ${complete} complete in ${((Date.now() - t0) / 1000).toFixed(1)} s; ` +
                `threads ${threads0} -> at most ${maxThreads}`);
    assert.equal(complete, 1000, rs.find((r) => !r.done)?.error);
    assert.equal(maxThreads, threads0);
  } finally {
    const e = await srv.stop();
    assert.equal(e.code, 0);
  }
});
