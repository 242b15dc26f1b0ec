// The control for tests/test_hosts.py: the same spawn as docs/hosts.md's
// app.js, without tether. node bare.js CMD [ARG...]
const { spawn } = require('node:child_process');

const [cmd, ...args] = process.argv.slice(2);
const agent = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'inherit'] });
agent.stdout.pipe(process.stdout);
agent.stdin.end('hello\n');
