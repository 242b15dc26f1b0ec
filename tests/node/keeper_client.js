// A host in another language: drives tether-keeper by docs/protocol.md alone
// (no tether code). Node can neither pass fds nor make SOCK_SEQPACKET
// sockets: the control socket is a spawn 'pipe' (a SOCK_STREAM socketpair),
// and the child's stdout is another pipe the keeper was given (keep=).
//
//   node keeper_client.js KEEPER basic      open a job, spawn with stdio, signal,
//                                           exit statuses, end the job: JSON lines
//   node keeper_client.js KEEPER owner      spawn `sleep 300` in a job, print its
//                                           pid, wait to be SIGKILLed
//   node keeper_client.js - control         the same child, no keeper (the control)
'use strict';
const { spawn } = require('child_process');

// -- CBOR (RFC 8949), the subset of docs/protocol.md ---------------------------
function head(major, n) {
  if (n < 24) return Buffer.from([major << 5 | n]);
  if (n < 0x100) return Buffer.from([major << 5 | 24, n]);
  if (n < 0x10000) { const b = Buffer.alloc(3); b[0] = major << 5 | 25; b.writeUInt16BE(n, 1); return b; }
  if (n < 0x100000000) { const b = Buffer.alloc(5); b[0] = major << 5 | 26; b.writeUInt32BE(n, 1); return b; }
  const b = Buffer.alloc(9); b[0] = major << 5 | 27; b.writeBigUInt64BE(BigInt(n), 1); return b;
}
function encode(v) {
  if (v === null || v === undefined) return Buffer.from([0xf6]);
  if (v === true) return Buffer.from([0xf5]);
  if (v === false) return Buffer.from([0xf4]);
  if (typeof v === 'number') {
    if (Number.isInteger(v)) return v >= 0 ? head(0, v) : head(1, -1 - v);
    const b = Buffer.alloc(9); b[0] = 0xfb; b.writeDoubleBE(v, 1); return b;
  }
  if (typeof v === 'string') { const s = Buffer.from(v, 'utf8'); return Buffer.concat([head(3, s.length), s]); }
  if (Buffer.isBuffer(v)) return Buffer.concat([head(2, v.length), v]);
  if (Array.isArray(v)) return Buffer.concat([head(4, v.length), ...v.map(encode)]);
  const entries = v instanceof Map ? [...v.entries()] : Object.entries(v);
  return Buffer.concat([head(5, entries.length), ...entries.flatMap(([k, x]) => [encode(k), encode(x)])]);
}
function decode(buf) {
  let i = 0;
  function arg(ai) {
    if (ai < 24) return ai;
    const n = 1 << (ai - 24);
    if (ai > 27 || i + n > buf.length) throw new Error('malformed');
    let u = 0;
    for (let k = 0; k < n; k++) u = u * 256 + buf[i + k];
    i += n;
    return u;
  }
  function item() {
    if (i >= buf.length) throw new Error('truncated');
    const b = buf[i++], major = b >> 5, ai = b & 31;
    if (major === 7) {
      if (ai === 20) return false;
      if (ai === 21) return true;
      if (ai === 22) return null;
      if (ai === 25) { const x = buf.readUInt16BE(i); i += 2; return halfToNumber(x); }
      if (ai === 26) { const x = buf.readFloatBE(i); i += 4; return x; }
      if (ai === 27) { const x = buf.readDoubleBE(i); i += 8; return x; }
      throw new Error('unsupported simple value');
    }
    if (ai === 31 && (major === 4 || major === 5)) { // indefinite: items up to a break
      const items = [];
      while (buf[i] !== 0xff) items.push(item());
      i++;
      return major === 4 ? items : pairs(items);
    }
    const n = arg(ai);
    if (major === 0) return n;
    if (major === 1) return -1 - n;
    if (major === 2 || major === 3) {
      const s = buf.subarray(i, i + n); i += n;
      return major === 2 ? Buffer.from(s) : s.toString('utf8');
    }
    const items = [];
    for (let k = 0; k < (major === 5 ? 2 * n : n); k++) items.push(item());
    if (major === 4) return items;
    if (major === 5) return pairs(items);
    throw new Error('unsupported major type ' + major);
  }
  function pairs(items) {
    const o = {};
    for (let k = 0; k < items.length; k += 2) o[String(items[k])] = items[k + 1];
    return o;
  }
  const v = item();
  if (i !== buf.length) throw new Error('bytes after the message');
  return v;
}
function halfToNumber(h) {
  const e = (h >> 10) & 0x1f, m = h & 0x3ff, s = h & 0x8000 ? -1 : 1;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? NaN : s * Infinity;
  return s * (m + 1024) * 2 ** (e - 25);
}

// -- frames: a 4-byte big-endian length, then the CBOR map ----------------------
class Channel {
  constructor(stream) {
    this.stream = stream;
    this.buf = Buffer.alloc(0);
    this.queue = [];
    this.waiters = [];
    stream.on('data', (d) => {
      this.buf = Buffer.concat([this.buf, d]);
      while (this.buf.length >= 4) {
        const len = this.buf.readUInt32BE(0);
        if (this.buf.length < 4 + len) break;
        const msg = decode(this.buf.subarray(4, 4 + len));
        this.buf = this.buf.subarray(4 + len);
        const w = this.waiters.shift();
        if (w) w(msg); else this.queue.push(msg);
      }
    });
  }
  next() {
    return this.queue.length ? Promise.resolve(this.queue.shift())
      : new Promise((resolve) => this.waiters.push(resolve));
  }
  send(msg) {
    const body = encode(msg), len = Buffer.alloc(4);
    len.writeUInt32BE(body.length, 0);
    this.stream.write(Buffer.concat([len, body]));
  }
  // A request's reply; exit reports that come first are kept aside.
  async request(msg, exits) {
    this.send(msg);
    for (;;) {
      const m = await this.next();
      if ('exit' in m) exits.set(m.exit, m.status); else return m;
    }
  }
}

function out(obj) { process.stdout.write(JSON.stringify(obj) + '\n'); }

function startKeeper(keeper) {
  // fd 3: the control socket; fd 4: a pipe whose write end children get (keep=4)
  const k = spawn(keeper, ['serve', 'subreaper', '3', String(process.pid), '-1', 'keep=4'],
    { stdio: ['ignore', 'ignore', 'inherit', 'pipe', 'pipe'] });
  return { proc: k, ctl: new Channel(k.stdio[3]), childOut: k.stdio[4] };
}

function spawnRequest(argv, extra) {
  return Object.assign({
    op: 'spawn', executable: argv[0], argv,
    env: { PATH: '/usr/bin:/bin', TETHER_TEST_MARK: process.env.TETHER_TEST_MARK || '' },
    cwd: '/', path: ['/usr/bin', '/bin'], fdmap: new Map(), pgroup: 0, setsid: false,
    umask: 0o22, ignored: [], sigmask: [], rlimits: [], ident: true,
  }, extra);
}

async function basic(keeper) {
  const { proc, ctl, childOut } = startKeeper(keeper);
  const exits = new Map();
  const hello = await ctl.next();
  out({ hello });
  let text = '';
  childOut.on('data', (d) => { text += d.toString(); });
  // sources: inherit's first (0: the kept pipe), then open's (1: /dev/null);
  // the child's stdin is /dev/null, its stdout and stderr the pipe
  const r = await ctl.request(spawnRequest(['/bin/sh', '-c', 'echo hello from $$; exec sleep 300'],
    { inherit: [4], open: [['/dev/null', 'r']], fdmap: new Map([[0, 1], [1, 0], [2, 0]]) }), exits);
  out({ spawned: r });
  while (!text.includes('\n')) await new Promise((res) => setTimeout(res, 10));
  out({ stdout: text.trim() });
  process.kill(r.pid, 'SIGTERM');
  while (!exits.has(r.pid)) exits.set(...await waitExit(ctl));
  out({ signalled: r.pid, status: exits.get(r.pid) });
  const r2 = await ctl.request(spawnRequest(['/bin/sh', '-c', 'exit 3']), exits);
  const w = await ctl.request({ op: 'wait', pid: r2.pid }, exits);
  out({ waited: r2.pid, status: exits.has(r2.pid) ? exits.get(r2.pid) : w.status });
  const bad = await ctl.request({ op: 'spawn', argv: [] }, exits);
  out({ bad });
  const nofile = await ctl.request(spawnRequest(['/bin/true'], { open: [['/nonexistent/x', 'r']] }), exits);
  out({ nofile });
  const closed = await ctl.request({ op: 'close', timeout: 1.0 }, exits);
  out({ closed });
  const code = await new Promise((res) => proc.on('exit', (c, s) => res([c, s])));
  out({ keeper_exit: code });
}

async function waitExit(ctl) {
  const m = await ctl.next();
  if (!('exit' in m)) throw new Error('expected an exit report: ' + JSON.stringify(m));
  return [m.exit, m.status];
}

async function owner(keeper) {
  const { ctl } = startKeeper(keeper);
  const exits = new Map();
  const hello = await ctl.next();
  const r = await ctl.request(spawnRequest(['/bin/sleep', '300'], { setsid: true, pgroup: -1 }), exits);
  out({ keeper: hello.keeper, child: r.pid, ident: r.ident });
  setInterval(() => {}, 1000); // until SIGKILLed
}

function control() {
  const c = spawn('/bin/sleep', ['300'], { detached: true, stdio: 'ignore' });
  out({ child: c.pid });
  setInterval(() => {}, 1000);
}

const [keeper, mode] = process.argv.slice(2);
const run = { basic, owner, control }[mode];
if (!run) { process.stderr.write('usage: keeper_client.js KEEPER basic|owner|control\n'); process.exit(2); }
Promise.resolve(run(keeper)).catch((e) => { process.stderr.write(String(e.stack || e) + '\n'); process.exit(1); });
