// Starts `gptoss serve` on a free loopback port and waits until /health answers.
import { spawn } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';

export const BIN = process.env.GPTOSS_BIN || new URL('../../build/gptoss', import.meta.url).pathname;

export async function startServer(args = []) {
  const proc = spawn(BIN, ['serve', '--host', '127.0.0.1', '--port', '0', ...args], {
    stdio: ['ignore', 'inherit', 'pipe'],
  });
  let log = '';
  let exited = null;
  const exitPromise = new Promise((resolve) => proc.on('exit', (code, signal) => { exited = { code, signal }; resolve(exited); }));
  const port = await new Promise((resolve, reject) => {
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    proc.on('exit', () => reject(new Error('gptoss serve exited early:\n' + log)));
  });
  proc.stderr.on('data', (d) => { log += d.toString(); });
  const baseURL = `http://127.0.0.1:${port}`;
  let healthy = false;
  for (let i = 0; i < 600 && !healthy && !exited; i++) {
    try {
      const r = await fetch(`${baseURL}/health`);
      healthy = r.status === 200;
    } catch { /* not yet */ }
    if (!healthy) await sleep(100);
  }
  if (!healthy) {
    proc.kill('SIGKILL');
    throw new Error('gptoss serve never became healthy:\n' + log);
  }
  return {
    port,
    baseURL,
    apiURL: `${baseURL}/v1`,
    proc,
    log: () => log,
    exited: () => exited,
    wait: () => exitPromise,
    async stop() {
      if (!exited) {
        proc.kill('SIGTERM');
        const t = setTimeout(() => proc.kill('SIGKILL'), 60000);
        await exitPromise;
        clearTimeout(t);
      }
      return exited;
    },
  };
}

// Parses the Prometheus text of /metrics into {name: value} (labels dropped).
export async function metrics(baseURL) {
  const text = await (await fetch(`${baseURL}/metrics`)).text();
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = line.match(/^([^{\s]+)(\{[^}]*\})?\s+(\S+)$/);
    if (m && !(m[1] in out)) out[m[1]] = Number(m[3]);
  }
  return out;
}
