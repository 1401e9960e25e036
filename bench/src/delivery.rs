//! The deliveries the load generator sends: `workflow_job` bodies built from the real fixtures,
//! one unique job per queued → in_progress → completed lifecycle, signed as GitHub signs them.

use std::path::Path;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use hmac::{Hmac, Mac};
use http::{HeaderValue, Method, Request, header};
use http_body_util::Full;
use serde_json::{Value, json};
use sha2::Sha256;
use uuid::Uuid;

/// The event every delivery carries: the one the receiver's hot path is built for.
pub const EVENT: &str = "workflow_job";
/// The lifecycle each job goes through, in the order GitHub sends it; one delivery per stage.
pub const ACTIONS: [&str; 3] = ["queued", "in_progress", "completed"];
/// The webhook (hook) id GitHub puts in `X-GitHub-Hook-ID`; any stable number will do.
pub const HOOK_ID: &str = "491538213";
/// The GitHub App id GitHub puts in `X-GitHub-Hook-Installation-Target-ID`.
pub const APP_ID: &str = "123456";
/// The installation every delivery comes from: an App delivery always names one.
pub const INSTALLATION_ID: u64 = 55_667_788;
/// GitHub's webhook user agent is `GitHub-Hookshot/<short commit>`.
pub const USER_AGENT: &str = "GitHub-Hookshot/5d4f2a1";

/// One pre-built, pre-signed body. The delivery GUID is not part of it: each send gets a fresh one.
#[derive(Clone, Debug)]
pub struct Delivery {
    /// The exact body bytes that were signed.
    pub body: Bytes,
    /// `sha256=` + hex HMAC-SHA256(secret, body), ready to send.
    pub signature: HeaderValue,
    /// The `workflow_job.id` written into the body.
    pub job_id: u64,
    /// The `action` of the body (one of [`ACTIONS`]).
    pub action: &'static str,
}

/// A job id stand-in written into each template once, so that a body is two copies and a number
/// rather than a JSON round trip: building 300 000 bodies takes a second, not half a minute.
const JOB_ID_SLOT: &str = "__rm_bench_job_id__";

/// The fixture payloads, grouped by action, each serialised once around its job id slot.
#[derive(Clone, Debug)]
pub struct Templates {
    by_action: [Vec<Template>; 3],
}

/// A serialised payload split where `workflow_job.id` goes.
#[derive(Clone, Debug)]
struct Template {
    before: Vec<u8>,
    after: Vec<u8>,
}

impl Templates {
    /// Reads every `workflow_job.<action>.<n>.json` in `dir` for the actions in [`ACTIONS`].
    pub fn load(dir: &Path) -> Result<Self> {
        let mut by_action: [Vec<Template>; 3] = Default::default();
        let entries = std::fs::read_dir(dir)
            .with_context(|| format!("reading the webhook fixtures in {}", dir.display()))?;
        let mut paths: Vec<_> = entries
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<_>>()
            .with_context(|| format!("listing {}", dir.display()))?;
        // Sorted, so that job N is made from the same fixture on every run.
        paths.sort();
        for path in paths {
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let mut parts = name.split('.');
            let (Some(EVENT), Some(action), Some(_), Some("json"), None) = (
                parts.next(),
                parts.next(),
                parts.next(),
                parts.next(),
                parts.next(),
            ) else {
                continue;
            };
            let Some(slot) = ACTIONS.iter().position(|a| *a == action) else {
                continue;
            };
            let text = std::fs::read(&path)
                .with_context(|| format!("reading the fixture {}", path.display()))?;
            let template = Template::new(&text)
                .with_context(|| format!("preparing the fixture {}", path.display()))?;
            by_action[slot].push(template);
        }
        for (action, found) in ACTIONS.iter().zip(&by_action) {
            if found.is_empty() {
                bail!(
                    "no workflow_job.{action}.*.json fixture in {}",
                    dir.display()
                );
            }
        }
        Ok(Self { by_action })
    }

    /// The body of `action` (an index into [`ACTIONS`]) for job `job_id`, the `n`th job of the pool.
    fn body(&self, action: usize, n: usize, job_id: u64) -> Vec<u8> {
        let candidates = &self.by_action[action];
        let Template { before, after } = &candidates[n % candidates.len()];
        let id = job_id.to_string();
        let mut body = Vec::with_capacity(before.len() + id.len() + after.len());
        body.extend_from_slice(before);
        body.extend_from_slice(id.as_bytes());
        body.extend_from_slice(after);
        body
    }
}

impl Template {
    fn new(fixture: &[u8]) -> Result<Self> {
        let mut payload: Value = serde_json::from_slice(fixture).context("not JSON")?;
        let object = payload.as_object_mut().context("not a JSON object")?;
        let job = object
            .get_mut("workflow_job")
            .and_then(Value::as_object_mut)
            .context("no workflow_job object")?;
        job.insert("id".into(), JOB_ID_SLOT.into());
        // Dated now, as GitHub would send it today: the examples are years old, and a body
        // older than a day is journalled as stale (no job written), which would flatter rm.
        let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        for key in ["created_at", "started_at", "completed_at"] {
            if job.get(key).is_some_and(Value::is_string) {
                job.insert(key.into(), json!(now));
            }
        }
        // GitHub App deliveries carry the installation; the repository-hook examples do not.
        object.insert(
            "installation".into(),
            json!({ "id": INSTALLATION_ID, "node_id": "MDIzOkludGVncmF0aW9uSW5zdGFsbGF0aW9uNTU2Njc3ODg=" }),
        );
        let text = serde_json::to_string(&payload).context("serialising")?;
        let slot = format!("\"{JOB_ID_SLOT}\"");
        let (before, after) = text
            .split_once(&slot)
            .context("the job id slot went missing")?;
        anyhow::ensure!(!after.contains(&slot), "the job id slot appears twice");
        Ok(Self {
            before: before.into(),
            after: after.into(),
        })
    }
}

/// `sha256=` + hex HMAC-SHA256(secret, body): the `X-Hub-Signature-256` value.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Builds and signs the bodies of `jobs` jobs (three deliveries each, in lifecycle order), with job
/// ids `first_job_id..first_job_id + jobs`. Spread over every core: this runs before measuring.
pub fn build_pool(
    templates: &Templates,
    secret: &[u8],
    jobs: usize,
    first_job_id: u64,
) -> Result<Vec<Delivery>> {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let chunk = jobs.div_ceil(threads).max(1);
    let parts: Vec<Result<Vec<Delivery>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..jobs)
            .step_by(chunk)
            .map(|start| {
                let end = (start + chunk).min(jobs);
                scope.spawn(move || build_range(templates, secret, start..end, first_job_id))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a pool builder panicked")))
            })
            .collect()
    });
    let mut pool = Vec::with_capacity(jobs * ACTIONS.len());
    for part in parts {
        pool.extend(part?);
    }
    Ok(pool)
}

fn build_range(
    templates: &Templates,
    secret: &[u8],
    jobs: std::ops::Range<usize>,
    first_job_id: u64,
) -> Result<Vec<Delivery>> {
    let mut out = Vec::with_capacity(jobs.len() * ACTIONS.len());
    for n in jobs {
        let job_id = first_job_id + n as u64;
        for (slot, action) in ACTIONS.iter().enumerate() {
            let body = templates.body(slot, n, job_id);
            let signature = HeaderValue::try_from(sign(secret, &body))
                .context("a signature is not a valid header value")?;
            out.push(Delivery {
                body: body.into(),
                signature,
                job_id,
                action,
            });
        }
    }
    Ok(out)
}

/// The request GitHub would send for `delivery` with delivery GUID `guid`, to `path` on `host`.
pub fn request(
    delivery: &Delivery,
    guid: Uuid,
    host: &HeaderValue,
    path: &str,
) -> Result<Request<Full<Bytes>>> {
    let mut buf = Uuid::encode_buffer();
    Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(header::HOST, host)
        .header(header::ACCEPT, "*/*")
        .header(header::USER_AGENT, USER_AGENT)
        .header(header::CONTENT_TYPE, "application/json")
        .header(
            "X-GitHub-Delivery",
            guid.hyphenated().encode_lower(&mut buf) as &str,
        )
        .header("X-GitHub-Event", EVENT)
        .header("X-GitHub-Hook-ID", HOOK_ID)
        .header("X-GitHub-Hook-Installation-Target-ID", APP_ID)
        .header("X-GitHub-Hook-Installation-Target-Type", "integration")
        .header("X-Hub-Signature-256", delivery.signature.clone())
        .body(Full::new(delivery.body.clone()))
        .context("building a delivery request")
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;
    use std::collections::HashSet;

    const SECRET: &[u8] = b"bench-secret";

    fn fixtures() -> Templates {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/webhooks");
        Templates::load(&dir).expect("the repository's fixtures load")
    }

    /// HMAC-SHA256 written out from RFC 2104 over plain SHA-256, so the check does not share code
    /// with [`sign`].
    fn independent_hmac(key: &[u8], message: &[u8]) -> String {
        let mut block = [0u8; 64];
        if key.len() > 64 {
            block[..32].copy_from_slice(&Sha256::digest(key));
        } else {
            block[..key.len()].copy_from_slice(key);
        }
        let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
        let inner = Sha256::new()
            .chain_update(pad(0x36))
            .chain_update(message)
            .finalize();
        let outer = Sha256::new()
            .chain_update(pad(0x5c))
            .chain_update(inner)
            .finalize();
        format!("sha256={}", hex::encode(outer))
    }

    #[test]
    fn signs_githubs_documented_test_vector() {
        let expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(
            sign(b"It's a Secret to Everybody", b"Hello, World!"),
            expected
        );
        assert_eq!(
            independent_hmac(b"It's a Secret to Everybody", b"Hello, World!"),
            expected
        );
    }

    #[test]
    fn every_body_verifies_and_carries_its_unique_job() {
        let pool = build_pool(&fixtures(), SECRET, 50, 7_000_000).expect("pool builds");
        assert_eq!(pool.len(), 150);
        let mut jobs = HashSet::new();
        for (i, d) in pool.iter().enumerate() {
            assert_eq!(
                d.signature.to_str().expect("ascii"),
                independent_hmac(SECRET, &d.body)
            );
            let v: Value = serde_json::from_slice(&d.body).expect("body is JSON");
            assert_eq!(v["action"], d.action);
            assert_eq!(d.action, ACTIONS[i % 3], "lifecycle order");
            assert_eq!(v["workflow_job"]["id"], d.job_id);
            assert_eq!(v["installation"]["id"], INSTALLATION_ID);
            jobs.insert((d.job_id, d.action));
        }
        // 50 distinct jobs, each with exactly one delivery per stage.
        assert_eq!(jobs.len(), 150);
        assert_eq!(
            pool.iter().map(|d| d.job_id).collect::<HashSet<_>>().len(),
            50
        );
    }

    #[test]
    fn requests_carry_githubs_headers() {
        let pool = build_pool(&fixtures(), SECRET, 1, 1).expect("pool builds");
        let guid = Uuid::new_v4();
        let host = HeaderValue::from_static("127.0.0.1:8080");
        let req = request(&pool[0], guid, &host, "/webhook").expect("request builds");
        let h = req.headers();
        assert_eq!(req.uri(), "/webhook");
        assert_eq!(h["content-type"], "application/json");
        assert_eq!(h["x-github-event"], "workflow_job");
        assert_eq!(h["x-github-delivery"], guid.to_string().as_str());
        assert_eq!(h["x-hub-signature-256"], pool[0].signature);
        assert!(
            h["user-agent"]
                .to_str()
                .expect("ascii")
                .starts_with("GitHub-Hookshot/")
        );
        assert_eq!(h["x-github-hook-id"], HOOK_ID);
    }
}
