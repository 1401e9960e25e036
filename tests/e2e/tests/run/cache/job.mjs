// A job's step for the e2e cache test (tests/e2e/tests/run/cache.rs): run by the fake runner's
// worker with `node`, in the job's workspace, with the environment a node action step gets.
// It does what its plan (`$PLAN`, JSON: a list of operations) says with the real
// `@actions/cache` (`$CACHE_LIB`: its lib/ directory) and raw HTTP, and writes what happened
// to `$REPORT` (JSON). No credential is written: only the SHA-256 of an Authorization header.
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const lib = process.env.CACHE_LIB;
const cache = await import(pathToFileURL(path.join(lib, 'cache.js')).href);
const utils = await import(pathToFileURL(path.join(lib, 'internal', 'cacheUtils.js')).href);

const plan = JSON.parse(fs.readFileSync(process.env.PLAN, 'utf8'));
const report = {
  job: process.env.GITHUB_JOB,
  repository: process.env.GITHUB_REPOSITORY,
  ref: process.env.GITHUB_REF,
  uid: process.getuid(),
  results_url: process.env.ACTIONS_RESULTS_URL || null,
  cache_url: process.env.ACTIONS_CACHE_URL || null,
  archive_cache: process.env.ACTIONS_RUNNER_ACTION_ARCHIVE_CACHE || null,
  // What only a runner given the cache has in its own environment (the worker's, which a host
  // step inherits): the hook's URL and the hook itself.
  rm_cache_url: process.env.RM_CACHE_URL || null,
  job_started_hook: process.env.ACTIONS_RUNNER_HOOK_JOB_STARTED || null,
  // What the worker's "Set up job" wrote (where the job's actions came from): the fake
  // runner's `_diag/setup.done`, three levels above the workspace (`_work/<repo>/<repo>`).
  setup: readOrNull(path.resolve('..', '..', '..', '_diag', 'setup.done')),
  ops: [],
};
const DIR = 'data';

function readOrNull(file) {
  try { return fs.readFileSync(file, 'utf8'); } catch { return null; }
}
const SERVICE = 'twirp/github.actions.results.api.v1.CacheService/';

// The SHA-256 of every file under `dir`, by sorted relative name: what "byte for byte" means.
function digest(dir) {
  if (!fs.existsSync(dir)) return null;
  const hash = createHash('sha256');
  const walk = (d) => {
    for (const name of fs.readdirSync(d).sort()) {
      const p = path.join(d, name);
      if (fs.statSync(p).isDirectory()) walk(p);
      else {
        hash.update(path.relative(dir, p) + '\0');
        hash.update(fs.readFileSync(p));
      }
    }
  };
  walk(dir);
  return hash.digest('hex');
}

// `bytes` of random data in `dir`, in files of at most 16 MiB.
function fill(dir, bytes) {
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  const chunk = 16 << 20;
  for (let i = 0, left = bytes; left > 0; i++, left -= chunk) {
    fs.writeFileSync(path.join(dir, `part-${i}.bin`), randomBytes(Math.min(chunk, left)));
  }
}

// A runtime token as GitHub's are shaped, claiming `repository` and `ref`: forged (the
// signature is random), as a hostile job can make one.
function forge(repository, ref) {
  const b64 = (v) => Buffer.from(JSON.stringify(v)).toString('base64url');
  const claims = {
    scp: 'Actions.GenericRead:00000000-0000-0000-0000-000000000000 Actions.Results:x:y',
    ac: JSON.stringify([{ Scope: ref, Permission: 3 }]),
    repository,
  };
  return `${b64({ typ: 'JWT', alg: 'RS256' })}.${b64(claims)}.${randomBytes(32).toString('base64url')}`;
}

// One Twirp call through the results URL; the answer's status and JSON (or text).
async function twirp(method, body, token) {
  const url = `${process.env.ACTIONS_RESULTS_URL}${SERVICE}${method}`;
  const answer = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
    body: JSON.stringify(body),
  });
  const text = await answer.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: answer.status, json, text: json ? undefined : text.slice(0, 200) };
}

async function version() {
  return utils.getCacheVersion([DIR], await utils.getCompressionMethod(), false);
}

async function run(op) {
  switch (op.op) {
    case 'save': {
      if (op.bytes) fill(DIR, op.bytes);
      const sha256 = digest(DIR);
      const id = await cache.saveCache([DIR], op.key);
      return { sha256, id };
    }
    case 'restore': {
      fs.rmSync(DIR, { recursive: true, force: true });
      const hit = await cache.restoreCache([DIR], op.key, op.restore_keys || []);
      return { hit: hit ?? null, sha256: digest(DIR) };
    }
    case 'artifact': {
      // An artifact call (not the cache's): the local service passes it on to GitHub.
      const auth = `Bearer ${process.env.ACTIONS_RUNTIME_TOKEN}`;
      const url = `${process.env.ACTIONS_RESULTS_URL}twirp/github.actions.results.api.v1.ArtifactService/CreateArtifact`;
      const answer = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: auth },
        body: JSON.stringify({ name: 'e2e', version: 4 }),
      });
      const text = await answer.text();
      return {
        status: answer.status,
        body: text.slice(0, 300),
        authorization_sha256: createHash('sha256').update(auth).digest('hex'),
      };
    }
    case 'forged_restore': {
      // The client itself, with a forged token naming the victim's repository and ref.
      process.env.ACTIONS_RUNTIME_TOKEN = forge(op.forge_repository, op.forge_ref);
      fs.rmSync(DIR, { recursive: true, force: true });
      const hit = await cache.restoreCache([DIR], op.key, op.restore_keys || []);
      return { hit: hit ?? null, sha256: digest(DIR) };
    }
    case 'forged_save': {
      process.env.ACTIONS_RUNTIME_TOKEN = forge(op.forge_repository, op.forge_ref);
      fill(DIR, op.bytes);
      let id = null;
      let error = null;
      try { id = await cache.saveCache([DIR], op.key); } catch (e) { error = String(e); }
      return { id, error, sha256: digest(DIR) };
    }
    case 'raw': {
      // Raw Twirp calls for the victim's key and version, with a forged token: look it up,
      // then try to write over it (create, upload, finalize).
      const token = forge(op.forge_repository, op.forge_ref);
      const v = await version();
      const lookup = await twirp('GetCacheEntryDownloadURL', { key: op.key, restore_keys: [op.key], version: v }, token);
      let fetched = null;
      const download = lookup.json && (lookup.json.signed_download_url || lookup.json.signedDownloadUrl);
      if (download) {
        const answer = await fetch(download);
        const bytes = Buffer.from(await answer.arrayBuffer());
        fetched = { status: answer.status, bytes: bytes.length };
      }
      const create = await twirp('CreateCacheEntry', { key: op.key, version: v }, token);
      let upload = null;
      const target = create.json && (create.json.signed_upload_url || create.json.signedUploadUrl);
      const poison = randomBytes(1 << 20);
      if (target) {
        const answer = await fetch(target, {
          method: 'PUT',
          headers: { 'x-ms-blob-type': 'BlockBlob', 'content-type': 'application/octet-stream' },
          body: poison,
        });
        upload = answer.status;
      }
      const finalize = await twirp('FinalizeCacheEntryUpload', { key: op.key, version: v, size_bytes: String(poison.length) }, token);
      return { lookup, fetched, create, upload, finalize };
    }
    case 'raw_save': {
      // A save by raw Twirp calls with the job's own token, under the plan's key and version
      // (`op.version`, any string: what a step in a container looks the entry up by): create,
      // Put Blob to the signed URL, finalize. Reports the bytes' SHA-256 and the signed URL's
      // origin (never its token).
      const token = process.env.ACTIONS_RUNTIME_TOKEN;
      const bytes = randomBytes(op.bytes);
      const create = await twirp('CreateCacheEntry', { key: op.key, version: op.version }, token);
      const target = create.json && (create.json.signed_upload_url || create.json.signedUploadUrl);
      if (!target) throw new Error(`CreateCacheEntry answered ${create.status}: ${JSON.stringify(create.json)}`);
      const put = await fetch(target, {
        method: 'PUT',
        headers: { 'x-ms-blob-type': 'BlockBlob', 'content-type': 'application/octet-stream' },
        body: bytes,
      });
      const finalize = await twirp('FinalizeCacheEntryUpload', { key: op.key, version: op.version, size_bytes: String(bytes.length) }, token);
      return {
        create: create.status,
        upload_origin: new URL(target).origin,
        upload: put.status,
        finalize: finalize.status,
        finalized: finalize.json,
        sha256: createHash('sha256').update(bytes).digest('hex'),
      };
    }
    case 'change_file': {
      // Tries to change `op.path` (a file the runner is lent): each attempt's error code, or
      // "done".
      const tries = {};
      const attempt = (name, change) => {
        try { change(); tries[name] = 'done'; } catch (e) { tries[name] = e.code || String(e); }
      };
      attempt('append', () => fs.appendFileSync(op.path, '\necho planted\n'));
      attempt('overwrite', () => fs.writeFileSync(op.path, 'echo planted\n'));
      attempt('chmod', () => fs.chmodSync(op.path, 0o777));
      attempt('rename', () => fs.renameSync(op.path, `${op.path}.moved`));
      attempt('remove', () => fs.unlinkSync(op.path));
      return { tries };
    }
    case 'env': {
      // The step's values of `op.names` (null where unset).
      return { values: Object.fromEntries(op.names.map((n) => [n, process.env[n] ?? null])) };
    }
    case 'archives': {
      // Tries to change the host's action archives through the directory the runner is lent
      // (`op.archive`: one archive's path below it): each attempt's error code, or "done".
      const dir = process.env.ACTIONS_RUNNER_ACTION_ARCHIVE_CACHE;
      if (!dir) throw new Error('no ACTIONS_RUNNER_ACTION_ARCHIVE_CACHE');
      const archive = path.join(dir, op.archive);
      const tries = {};
      const attempt = (name, change) => {
        try { change(); tries[name] = 'done'; } catch (e) { tries[name] = e.code || String(e); }
      };
      attempt('create', () => fs.writeFileSync(path.join(dir, 'planted.tar.gz'), 'planted'));
      attempt('mkdir', () => fs.mkdirSync(path.join(dir, 'evil_action')));
      attempt('overwrite', () => fs.writeFileSync(archive, 'replaced'));
      attempt('append', () => fs.appendFileSync(archive, 'appended'));
      attempt('rename', () => fs.renameSync(archive, `${archive}.moved`));
      attempt('remove', () => fs.unlinkSync(archive));
      attempt('chmod', () => fs.chmodSync(archive, 0o777));
      attempt('remove_dir', () => fs.rmSync(path.dirname(archive), { recursive: true }));
      return { tries, readable: fs.existsSync(archive) ? fs.readFileSync(archive).length : null };
    }
    case 'stall_upload': {
      // A save that dies midway: raw CreateCacheEntry with the job's own token, then a Put Blob
      // whose body sends `op.mib` MiB, writes `op.marker`, and then sends nothing for
      // `op.stall_ms` (the test kills the agent meanwhile, which ends the request).
      const v = await version();
      const create = await twirp('CreateCacheEntry', { key: op.key, version: v }, process.env.ACTIONS_RUNTIME_TOKEN);
      const target = create.json && (create.json.signed_upload_url || create.json.signedUploadUrl);
      if (!target) throw new Error(`CreateCacheEntry answered ${create.status}: ${JSON.stringify(create.json)}`);
      const chunk = randomBytes(1 << 20);
      let sent = 0;
      const body = new ReadableStream({
        async pull(controller) {
          if (sent < op.mib) {
            controller.enqueue(new Uint8Array(chunk));
            sent += 1;
            return;
          }
          fs.writeFileSync(op.marker, `${sent}\n`);
          await new Promise((resolve) => setTimeout(resolve, op.stall_ms));
          controller.close();
        },
      });
      let upload;
      try {
        const answer = await fetch(target, {
          method: 'PUT',
          headers: { 'x-ms-blob-type': 'BlockBlob', 'content-type': 'application/octet-stream' },
          body,
          duplex: 'half',
        });
        upload = { status: answer.status };
      } catch (e) {
        upload = { failed: String((e && e.cause && (e.cause.code || e.cause.message)) || e) };
      }
      return { create: create.status, sent_mib: sent, upload };
    }
    default:
      throw new Error(`unknown op ${op.op}`);
  }
}

let failed = false;
for (const op of plan) {
  try {
    report.ops.push({ op: op.op, key: op.key ?? null, ...(await run(op)) });
  } catch (e) {
    failed = true;
    report.ops.push({ op: op.op, key: op.key ?? null, error: String(e && e.stack || e) });
  }
}
fs.writeFileSync(process.env.REPORT, JSON.stringify(report, null, 1));
process.exit(failed ? 1 : 0);
