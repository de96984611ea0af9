#!/usr/bin/env node
// An out-of-process conduit executor in Node.js, no npm dependencies, written from
// docs/wire-protocol.md alone. It runs a shell line as a detached job that outlives this program:
// the launch intent names the job's directory and a marker every process of the job carries in
// its environment, so a restarted program (or daemon) finds the job again.
//
// Declare it in conduit.toml:   [executors.example-node]
//                               command = ["node", "/path/to/executor.js"]
'use strict';

const fs = require('fs');
const path = require('path');
const crypto = require('crypto');
const { spawn } = require('child_process');

const PROTOCOL_VERSION = 1;
const MAX_FRAME = 1024 * 1024;
const MARKER = 'CONDUIT_EXAMPLE_NODE_LAUNCH';
const WRAPPER = 'cd "$0" && sh -c "$1" </dev/null >out 2>&1; echo $? >status.tmp; mv status.tmp status';

const MANIFEST = {
  name: 'example-node',
  generation: 1,
  pool: 'jobs',
  capabilities: ['stop', 'interrupt'],
  description: 'Runs a shell line as a detached job, from a Node.js program (wire protocol).',
  config_schema: {
    type: 'object',
    properties: { command: { type: 'string' } },
    required: ['command'],
    additionalProperties: false,
  },
  result_data_schema: {
    type: 'object',
    properties: { exit_status: { type: 'integer' } },
    required: ['exit_status'],
  },
};

// --- frames ------------------------------------------------------------------------------------

function send(message) {
  const body = Buffer.from(JSON.stringify(message), 'utf8');
  const header = Buffer.alloc(4);
  header.writeUInt32BE(body.length, 0);
  process.stdout.write(Buffer.concat([header, body]));
}

let buffered = Buffer.alloc(0);
process.stdin.on('data', (chunk) => {
  buffered = Buffer.concat([buffered, chunk]);
  while (buffered.length >= 4) {
    const length = buffered.readUInt32BE(0);
    if (length > MAX_FRAME) {
      process.stderr.write(`example-node: frame of ${length} bytes is over the limit\n`);
      process.exit(2);
    }
    if (buffered.length < 4 + length) break;
    const body = buffered.subarray(4, 4 + length);
    buffered = buffered.subarray(4 + length);
    let message;
    try {
      message = JSON.parse(body.toString('utf8'));
    } catch (err) {
      process.stderr.write(`example-node: not JSON: ${err.message}\n`);
      continue;
    }
    dispatch(message);
  }
});
process.stdin.on('end', () => process.exit(0)); // the core is gone; our jobs keep running

// --- callbacks to the core ---------------------------------------------------------------------

let nextCallback = 0;
const callbacks = new Map();

function callback(kind, request, fields) {
  nextCallback += 1;
  const id = nextCallback;
  return new Promise((resolve, reject) => {
    callbacks.set(id, (reply) => {
      if (reply.kind === 'callback_ok') resolve();
      else if (reply.kind === 'lease_lost') reject(codedError('lease_lost', reply.message || 'lease lost'));
      else reject(codedError(reply.error.code, reply.error.message));
    });
    send({ kind, id, request, ...fields });
  });
}

// --- requests from the core --------------------------------------------------------------------

class CodedError extends Error {
  constructor(code, message, permanent = false) {
    super(message);
    this.code = code;
    this.permanent = permanent;
  }
}
const codedError = (code, message, permanent) => new CodedError(code, message, permanent);

const handles = new Map(); // handle id -> launch {dir, marker}
const cancelled = new Set(); // wait request ids the core cancelled

function dispatch(message) {
  const { kind, id } = message;
  if (kind === 'callback_ok' || kind === 'lease_lost' || kind === 'callback_refused') {
    const resolve = callbacks.get(id);
    callbacks.delete(id);
    if (resolve) resolve(message);
    return;
  }
  if (kind === 'shutdown') {
    send({ kind: 'replied', id });
    process.exit(0);
  }
  if (kind === 'cancel') {
    cancelled.add(message.request);
    send({ kind: 'replied', id });
    return;
  }
  const handler = HANDLERS[kind];
  if (!handler) {
    if (Number.isInteger(id) && id >= 1) {
      send({ kind: 'failed', id, error: { code: 'wire_unknown_message', message: `unknown kind ${JSON.stringify(kind)} at $.kind` } });
    }
    return;
  }
  Promise.resolve()
    .then(() => handler(message))
    .then((reply) => { if (reply) send({ ...reply, id }); })
    .catch((err) => {
      const code = err instanceof CodedError ? err.code : 'executor_error';
      const text = err instanceof CodedError ? err.message : `executor raised ${err.name}`;
      send({ kind: 'failed', id, error: { code, message: text.slice(0, 4096), permanent: !!err.permanent } });
    });
}

const HANDLERS = {
  handshake(m) {
    if (m.min_version > PROTOCOL_VERSION || m.max_version < PROTOCOL_VERSION) {
      throw codedError('unsupported_protocol',
        `this program speaks protocol version ${PROTOCOL_VERSION}; the core offered ${m.min_version}..${m.max_version}`);
    }
    return { kind: 'handshake_ok', version: PROTOCOL_VERSION, manifest: MANIFEST };
  },
  async run(m) {
    const ctx = checkGeneration(m.context);
    const config = ctx.config || {};
    for (const key of Object.keys(config)) {
      if (key !== 'command') throw codedError('invalid_config', `Object contains unknown field \`${key}\` - at \`$\``, true);
    }
    if (typeof config.command !== 'string') {
      throw codedError('invalid_config', 'Expected `str` - at `$.command`', true);
    }
    const marker = `${key(ctx.execution_id)}/${ctx.epoch}`;
    const launch = { dir: path.join(ctx.state_dir || '/tmp', 'node', marker), marker };
    await callback('launch_intent', m.id, { intent: launch }); // durable before anything starts
    fs.mkdirSync(launch.dir, { recursive: true });
    const env = {
      ...(ctx.env || {}), PATH: process.env.PATH || '/usr/bin:/bin', CONDUIT_WORK_ID: ctx.work_id, [MARKER]: marker,
    };
    const child = spawn('sh', ['-c', WRAPPER, launch.dir, config.command], { detached: true, stdio: 'ignore', env });
    child.unref();
    await callback('persist_recovery', m.id, { metadata: launch });
    return launched(launch);
  },
  async recover(m) {
    const ctx = checkGeneration(m.context);
    const launch = ctx.recovery || ctx.launch_intent;
    if (!launch || !(marked(launch.marker).length || exitStatus(launch.dir) !== null)) {
      if (!ctx.recovery) throw codedError('not_started', 'no process carries the launch marker');
      throw codedError('resources_gone', 'the job left no process and no exit status');
    }
    await callback('persist_recovery', m.id, { metadata: launch });
    return launched(launch);
  },
  async wait(m) {
    const launch = handles.get(m.handle);
    if (!launch) throw codedError('unknown_handle', `no handle ${m.handle} in this program`);
    for (;;) {
      if (cancelled.delete(m.id)) return null; // stop observing; the job keeps running
      let status = exitStatus(launch.dir);
      if (status === null && marked(launch.marker).length === 0) {
        status = exitStatus(launch.dir); // it may have finished since the first look
        if (status === null) throw codedError('job_vanished', 'the job ended without an exit status');
      }
      if (status !== null) {
        // The handle stays valid: the core may have cancelled this wait and ask again.
        return {
          kind: 'finished',
          result: {
            outcome: status === 0 ? 'completed' : 'failed',
            summary: `exit status ${status}`,
            data: { exit_status: status },
          },
        };
      }
      await sleep(50);
    }
  },
  stop: (m) => killAll(m.target),
  interrupt: (m) => killAll(m.target),
  inject() {
    throw codedError('not_accepting', 'this executor takes no input while a job runs');
  },
};

function checkGeneration(ctx) {
  if (ctx.generation !== MANIFEST.generation) {
    throw codedError('unsupported_generation', `example-node serves generation ${MANIFEST.generation}, not ${ctx.generation}`);
  }
  return ctx;
}

function launched(launch) {
  const handle = crypto.randomUUID();
  handles.set(handle, launch);
  return { kind: 'launched', handle };
}

async function killAll(target) {
  const prefix = `${key(target.execution_id)}/`;
  const deadline = Date.now() + 10000;
  while (Date.now() < deadline) {
    const pids = marked(prefix);
    if (pids.length === 0) return { kind: 'stopped', verified: true, detail: 'no process carries the launch marker' };
    for (const pid of pids) {
      try { process.kill(pid, 'SIGKILL'); } catch (err) { /* already gone */ }
    }
    await sleep(50);
  }
  return { kind: 'stopped', verified: false, detail: 'marked processes survived SIGKILL for 10 s' };
}

// --- finding jobs again ------------------------------------------------------------------------

function key(executionId) {
  return crypto.createHash('sha256').update(executionId).digest('hex').slice(0, 24);
}

function exitStatus(dir) {
  try {
    return parseInt(fs.readFileSync(path.join(dir, 'status'), 'utf8'), 10);
  } catch (err) {
    return null;
  }
}

// Live (not zombie) processes whose launch marker starts with prefix.
function marked(prefix) {
  const needle = `${MARKER}=${prefix}`;
  const found = [];
  for (const name of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const env = fs.readFileSync(`/proc/${name}/environ`, 'latin1').split('\0');
      const stat = fs.readFileSync(`/proc/${name}/stat`, 'latin1');
      const state = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0];
      if (state !== 'Z' && env.some((v) => v.startsWith(needle))) found.push(Number(name));
    } catch (err) {
      // the process ended, or is not ours to read
    }
  }
  return found;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
