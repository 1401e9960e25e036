//! In-process tests of the service over HTTP: each protocol end to end, the scoping a hostile
//! job meets, signed URLs bound to their runner, and the upstream pass-through. Callers are told
//! apart by their loopback source address (127.0.0.2, .3, ...), as runners are by theirs.
//!
//! One test drives the real `@actions/cache` client through Node (v2 with one Put Blob and with
//! blocks, and v1), installing it with npm beside the test binaries; without `node` and `npm` it
//! fails unless `RM_TEST_ALLOW_SKIP` names `node`.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use super::*;
use crate::scope::{RunFacts, scope_of};

const MAIN_A: &str = "127.0.0.2";
const MAIN_B: &str = "127.0.0.3";
const OTHER_REPO: &str = "127.0.0.4";
const FORK_PR: &str = "127.0.0.5";
const BRANCH: &str = "127.0.0.6";
const STRANGER: &str = "127.0.0.9";
/// A runner that reaches the service at a base of its own (its network's host end).
const OWN_BASE: &str = "127.0.0.7";

const TWIRP: &str = "/twirp/github.actions.results.api.v1.CacheService/";

struct FakeCallers(HashMap<IpAddr, Caller>);

impl Callers for FakeCallers {
    fn identify(
        &self,
        peer: IpAddr,
    ) -> Pin<Box<dyn Future<Output = Result<Caller, Refusal>> + Send + '_>> {
        let found = self.0.get(&peer).cloned().ok_or(Refusal::NotARunner);
        Box::pin(async move { found })
    }
}

fn caller(job: i64, repository: &str, event: &str, head_repository: &str, branch: &str) -> Caller {
    Caller {
        job,
        attempt: format!("attempt-{job}"),
        scope: scope_of(&RunFacts {
            repository: repository.into(),
            default_branch: "main".into(),
            head_branch: branch.into(),
            event: event.into(),
            head_repository: head_repository.into(),
        }),
        base: None,
    }
}

fn callers() -> Arc<dyn Callers> {
    let table = [
        (MAIN_A, caller(1, "acme/app", "push", "acme/app", "main")),
        (MAIN_B, caller(2, "acme/app", "push", "acme/app", "main")),
        (
            OTHER_REPO,
            caller(3, "evil/app", "push", "evil/app", "main"),
        ),
        (
            FORK_PR,
            caller(4, "acme/app", "pull_request", "mallory/app", "main"),
        ),
        (BRANCH, caller(5, "acme/app", "push", "acme/app", "feature")),
        (
            OWN_BASE,
            Caller {
                base: Some("http://10.213.0.1:8736/".to_owned()),
                ..caller(6, "acme/app", "push", "acme/app", "main")
            },
        ),
    ];
    Arc::new(FakeCallers(
        table
            .into_iter()
            .map(|(ip, c)| (ip.parse().unwrap(), c))
            .collect(),
    ))
}

struct Harness {
    addr: SocketAddr,
    service: Service,
    dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start_with(max_size: u64, upstream: Option<http::Uri>) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = Service::open(Settings {
        dir: dir.path().to_owned(),
        max_size,
        max_age: Duration::from_secs(7 * 24 * 3600),
        repo_quota: None,
        upstream,
        public_base: format!("http://{addr}/"),
    })
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = service.clone();
    tokio::spawn(async move {
        serving
            .serve(listener, callers(), async move {
                let _ = stopped.await;
            })
            .await;
    });
    Harness {
        addr,
        service,
        dir,
        _stop: stop,
    }
}

async fn start() -> Harness {
    start_with(u64::MAX, None).await
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// One request from source address `from` to `addr`; `target` is a path or a full URL.
async fn call(
    addr: SocketAddr,
    from: &str,
    method: Method,
    target: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Answer {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(from.parse().unwrap(), 0))
        .unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let uri: http::Uri = target.parse().unwrap();
    let path = uri.path_and_query().unwrap().as_str().to_owned();
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let answer = sender
        .send_request(request.body(Full::new(body.into())).unwrap())
        .await
        .unwrap();
    let (parts, body) = answer.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

async fn twirp(addr: SocketAddr, from: &str, method: &str, body: Value) -> Answer {
    call(
        addr,
        from,
        Method::POST,
        &format!("{TWIRP}{method}"),
        &[
            ("content-type", "application/json"),
            ("authorization", "Bearer forged"),
        ],
        body.to_string(),
    )
    .await
}

fn bytes_of(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Saves `data` under `key` through v2 with one Put Blob; the finalize answer.
async fn save_v2(addr: SocketAddr, from: &str, key: &str, data: &[u8]) -> Answer {
    let created = twirp(
        addr,
        from,
        "CreateCacheEntry",
        json!({"key": key, "version": "v1"}),
    )
    .await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.body);
    let url = created.json()["signed_upload_url"]
        .as_str()
        .unwrap()
        .to_owned();
    let put = call(
        addr,
        from,
        Method::PUT,
        &url,
        &[("x-ms-blob-type", "BlockBlob")],
        data.to_vec(),
    )
    .await;
    assert_eq!(put.status, StatusCode::CREATED);
    twirp(
        addr,
        from,
        "FinalizeCacheEntryUpload",
        json!({"key": key, "version": "v1", "size_bytes": data.len().to_string()}),
    )
    .await
}

/// Restores `key` through v2: the matched key and the bytes, or `None` on a miss.
async fn restore_v2(
    addr: SocketAddr,
    from: &str,
    key: &str,
    restore_keys: &[&str],
) -> Option<(String, Bytes)> {
    let found = twirp(
        addr,
        from,
        "GetCacheEntryDownloadURL",
        json!({"key": key, "restore_keys": restore_keys, "version": "v1"}),
    )
    .await;
    assert_eq!(found.status, StatusCode::OK);
    let found = found.json();
    if found["ok"] != json!(true) {
        return None;
    }
    let url = found["signed_download_url"].as_str().unwrap();
    let got = call(addr, from, Method::GET, url, &[], Bytes::new()).await;
    assert_eq!(got.status, StatusCode::OK);
    Some((found["matched_key"].as_str().unwrap().to_owned(), got.body))
}

#[tokio::test]
async fn v2_put_blob_finalize_lookup_and_ranged_download_are_byte_exact() {
    let h = start().await;
    let data = bytes_of(3 * 1024 * 1024 + 17, 1);
    let finalized = save_v2(h.addr, MAIN_A, "deps-linux-abc", &data).await;
    assert_eq!(finalized.status, StatusCode::OK);
    let finalized = finalized.json();
    assert_eq!(finalized["ok"], json!(true));
    assert!(
        finalized["entry_id"]
            .as_str()
            .unwrap()
            .parse::<i64>()
            .is_ok()
    );

    // Another runner of the same branch restores it by a restore key.
    let found = twirp(
        h.addr,
        MAIN_B,
        "GetCacheEntryDownloadURL",
        json!({"key": "deps-linux-zzz", "restore_keys": ["deps-linux-"], "version": "v1"}),
    )
    .await
    .json();
    assert_eq!(found["ok"], json!(true));
    assert_eq!(found["matched_key"], json!("deps-linux-abc"));
    let url = found["signed_download_url"].as_str().unwrap();
    let whole = call(h.addr, MAIN_B, Method::GET, url, &[], Bytes::new()).await;
    assert_eq!(whole.status, StatusCode::OK);
    assert_eq!(whole.body.as_ref(), data.as_slice());
    assert_eq!(
        whole.headers["content-length"].to_str().unwrap(),
        data.len().to_string()
    );
    let head = call(h.addr, MAIN_B, Method::HEAD, url, &[], Bytes::new()).await;
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(
        head.headers["content-length"].to_str().unwrap(),
        data.len().to_string()
    );
    assert!(head.body.is_empty());
    let part = call(
        h.addr,
        MAIN_B,
        Method::GET,
        url,
        &[("range", "bytes=1000-2999999")],
        Bytes::new(),
    )
    .await;
    assert_eq!(part.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(part.body.as_ref(), &data[1000..3_000_000]);
    assert_eq!(
        part.headers["content-range"].to_str().unwrap(),
        format!("bytes 1000-2999999/{}", data.len())
    );
    let azure = call(
        h.addr,
        MAIN_B,
        Method::GET,
        url,
        &[("x-ms-range", "bytes=-5")],
        Bytes::new(),
    )
    .await;
    assert_eq!(azure.body.as_ref(), &data[data.len() - 5..]);
    let past = call(
        h.addr,
        MAIN_B,
        Method::GET,
        url,
        &[("range", "bytes=99999999-")],
        Bytes::new(),
    )
    .await;
    assert_eq!(past.status, StatusCode::RANGE_NOT_SATISFIABLE);

    // A second create of the same key and version in the same scope: already exists.
    let again = twirp(
        h.addr,
        MAIN_B,
        "CreateCacheEntry",
        json!({"key": "deps-linux-abc", "version": "v1"}),
    )
    .await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert_eq!(again.json()["code"], json!("already_exists"));

    // Counters: job 1 saved, job 2 hit and downloaded.
    let dir = h.dir.path();
    let saver = job_counters(dir, 1).unwrap().unwrap();
    assert_eq!(saver.bytes_up, data.len() as u64);
    let restorer = job_counters(dir, 2).unwrap().unwrap();
    assert_eq!(restorer.hits, 1);
    // Downloads are counted when their body has been sent.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let restorer = job_counters(dir, 2).unwrap().unwrap();
    // One whole body, one range, five bytes; HEAD and 416 send none.
    let sent = data.len() as u64 + (3_000_000 - 1000) + 5;
    assert_eq!(restorer.bytes_down, sent);
    let totals = h.service.totals().unwrap();
    assert_eq!(
        (totals.entries, totals.bytes_stored),
        (1, data.len() as u64)
    );
    assert_eq!(totals.counters.hits, 1);
}

#[tokio::test]
async fn v2_blocks_and_block_list_assemble_the_entry() {
    let h = start().await;
    let data = bytes_of(700_001, 7);
    let created = twirp(
        h.addr,
        MAIN_A,
        "CreateCacheEntry",
        json!({"key": "blocks", "version": "v1"}),
    )
    .await
    .json();
    let url = created["signed_upload_url"].as_str().unwrap().to_owned();
    // Block ids as the SDK makes them: base64, percent-encoded in the query; sent out of order.
    let ids = ["QUFBQQ==", "QUFBQg==", "QUFBQw=="];
    let chunks: Vec<&[u8]> = data.chunks(300_000).collect();
    for i in [2, 0, 1] {
        let encoded = ids[i].replace('=', "%3D");
        let put = call(
            h.addr,
            MAIN_A,
            Method::PUT,
            &format!("{url}?comp=block&blockid={encoded}"),
            &[],
            chunks[i].to_vec(),
        )
        .await;
        assert_eq!(put.status, StatusCode::CREATED);
        assert!(put.headers.contains_key("x-ms-request-id"));
    }
    let unknown = call(
        h.addr,
        MAIN_A,
        Method::PUT,
        &format!("{url}?comp=blocklist"),
        &[],
        "<BlockList><Latest>bm9wZQ==</Latest></BlockList>",
    )
    .await;
    assert_eq!(unknown.status, StatusCode::BAD_REQUEST);
    let xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?><BlockList>{}</BlockList>",
        ids.iter()
            .map(|id| format!("<Latest>{id}</Latest>"))
            .collect::<String>()
    );
    let listed = call(
        h.addr,
        MAIN_A,
        Method::PUT,
        &format!("{url}?comp=blocklist"),
        &[],
        xml,
    )
    .await;
    assert_eq!(listed.status, StatusCode::CREATED);
    // Not visible before finalize.
    assert!(restore_v2(h.addr, MAIN_A, "blocks", &[]).await.is_none());
    // A size that does not match is refused.
    let wrong = twirp(
        h.addr,
        MAIN_A,
        "FinalizeCacheEntryUpload",
        json!({"key": "blocks", "version": "v1", "size_bytes": "5"}),
    )
    .await;
    assert_eq!(wrong.status, StatusCode::BAD_REQUEST);
    let done = twirp(
        h.addr,
        MAIN_A,
        "FinalizeCacheEntryUpload",
        json!({"key": "blocks", "version": "v1", "sizeBytes": 700_001}),
    )
    .await;
    assert_eq!(done.status, StatusCode::OK);
    let (key, bytes) = restore_v2(h.addr, MAIN_A, "blocks", &[]).await.unwrap();
    assert_eq!(key, "blocks");
    assert_eq!(bytes.as_ref(), data.as_slice());
    // The upload's staged files are gone, the blob is in place.
    let report = disk_report(h.dir.path()).unwrap();
    assert_eq!(
        (report.entries, report.blob_files, report.staged_files),
        (1, 1, 0)
    );
}

#[tokio::test]
async fn v1_reserve_patch_commit_get() {
    let h = start().await;
    let data = bytes_of(100_000, 3);
    let base = "/_apis/artifactcache/";
    let json_headers = [
        ("content-type", "application/json"),
        ("accept", "application/json;api-version=6.0-preview.1"),
    ];
    let miss = call(
        h.addr,
        MAIN_A,
        Method::GET,
        &format!("{base}cache?keys=v1-key%2Cv1-&version=v9"),
        &json_headers,
        Bytes::new(),
    )
    .await;
    assert_eq!(miss.status, StatusCode::NO_CONTENT);
    let reserved = call(
        h.addr,
        MAIN_A,
        Method::POST,
        &format!("{base}caches"),
        &json_headers,
        json!({"key": "v1-key", "version": "v9", "cacheSize": data.len()}).to_string(),
    )
    .await;
    assert_eq!(reserved.status, StatusCode::CREATED);
    let id = reserved.json()["cacheId"].as_i64().unwrap();
    // Another runner cannot write to this reservation.
    let foreign = call(
        h.addr,
        MAIN_B,
        Method::PATCH,
        &format!("{base}caches/{id}"),
        &[("content-range", "bytes 0-9/*")],
        vec![0u8; 10],
    )
    .await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND);
    for (start, end) in [(60_000usize, 99_999usize), (0, 59_999)] {
        let patched = call(
            h.addr,
            MAIN_A,
            Method::PATCH,
            &format!("{base}caches/{id}"),
            &[
                ("content-type", "application/octet-stream"),
                ("content-range", &format!("bytes {start}-{end}/*")),
            ],
            data[start..=end].to_vec(),
        )
        .await;
        assert_eq!(patched.status, StatusCode::NO_CONTENT);
    }
    let short = call(
        h.addr,
        MAIN_A,
        Method::POST,
        &format!("{base}caches/{id}"),
        &json_headers,
        json!({"size": data.len() + 1}).to_string(),
    )
    .await;
    assert_eq!(short.status, StatusCode::BAD_REQUEST);
    let committed = call(
        h.addr,
        MAIN_A,
        Method::POST,
        &format!("{base}caches/{id}"),
        &json_headers,
        json!({"size": data.len()}).to_string(),
    )
    .await;
    assert_eq!(committed.status, StatusCode::NO_CONTENT);
    let found = call(
        h.addr,
        MAIN_B,
        Method::GET,
        &format!("{base}cache?keys=v1-other%2Cv1-&version=v9"),
        &json_headers,
        Bytes::new(),
    )
    .await;
    assert_eq!(found.status, StatusCode::OK);
    let found = found.json();
    assert_eq!(found["cacheKey"], json!("v1-key"));
    assert_eq!(found["scope"], json!("refs/heads/main"));
    let got = call(
        h.addr,
        MAIN_B,
        Method::GET,
        found["archiveLocation"].as_str().unwrap(),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(got.body.as_ref(), data.as_slice());
    let listed = call(
        h.addr,
        MAIN_B,
        Method::GET,
        &format!("{base}caches?key=v1-key"),
        &json_headers,
        Bytes::new(),
    )
    .await
    .json();
    assert_eq!(listed["totalCount"], json!(1));
    // Reserving it again: 409, which the client reports as "another job may be creating this".
    let again = call(
        h.addr,
        MAIN_B,
        Method::POST,
        &format!("{base}caches"),
        &json_headers,
        json!({"key": "v1-key", "version": "v9"}).to_string(),
    )
    .await;
    assert_eq!(again.status, StatusCode::CONFLICT);
}

#[tokio::test]
async fn another_repository_reads_and_overwrites_nothing() {
    let h = start().await;
    let data = bytes_of(1000, 9);
    assert_eq!(
        save_v2(h.addr, MAIN_A, "secret", &data).await.status,
        StatusCode::OK
    );
    // The hostile job's forged token and body name nothing it can use: its own scope decides.
    assert!(
        restore_v2(h.addr, OTHER_REPO, "secret", &["s"])
            .await
            .is_none()
    );
    // Its save of the same key lands in its own repository's scope and changes nothing of A's.
    let evil = bytes_of(1000, 99);
    assert_eq!(
        save_v2(h.addr, OTHER_REPO, "secret", &evil).await.status,
        StatusCode::OK
    );
    let (_, bytes) = restore_v2(h.addr, MAIN_B, "secret", &[]).await.unwrap();
    assert_eq!(bytes.as_ref(), data.as_slice());
    let (_, bytes) = restore_v2(h.addr, OTHER_REPO, "secret", &[]).await.unwrap();
    assert_eq!(bytes.as_ref(), evil.as_slice());
    // Not a runner at all: refused before anything is read.
    let stranger = twirp(
        h.addr,
        STRANGER,
        "GetCacheEntryDownloadURL",
        json!({"key": "secret", "version": "v1"}),
    )
    .await;
    assert_eq!(stranger.status, StatusCode::FORBIDDEN);
    assert_eq!(stranger.json()["code"], json!("permission_denied"));
}

#[tokio::test]
async fn a_pull_requests_save_is_invisible_to_the_default_branch() {
    let h = start().await;
    let base = bytes_of(500, 1);
    let poison = bytes_of(500, 2);
    save_v2(h.addr, MAIN_A, "deps", &base).await;
    // The fork's PR (from its own `main`) restores the default branch's entry...
    let (_, bytes) = restore_v2(h.addr, FORK_PR, "deps", &[]).await.unwrap();
    assert_eq!(bytes.as_ref(), base.as_slice());
    // ...and its save of a new key goes to its own scope.
    assert_eq!(
        save_v2(h.addr, FORK_PR, "deps-poisoned", &poison)
            .await
            .status,
        StatusCode::OK
    );
    assert!(
        restore_v2(h.addr, MAIN_B, "deps-poisoned", &[])
            .await
            .is_none()
    );
    assert!(
        restore_v2(h.addr, BRANCH, "deps-poisoned", &[])
            .await
            .is_none()
    );
    // The default branch's "deps" still restores its own bytes.
    let (_, bytes) = restore_v2(h.addr, MAIN_B, "deps", &["deps-"])
        .await
        .unwrap();
    assert_eq!(bytes.as_ref(), base.as_slice());
    let (_, bytes) = restore_v2(h.addr, FORK_PR, "deps-poisoned", &[])
        .await
        .unwrap();
    assert_eq!(bytes.as_ref(), poison.as_slice());
}

#[tokio::test]
async fn a_signed_url_replayed_by_another_runner_is_refused() {
    let h = start().await;
    let data = bytes_of(2000, 4);
    save_v2(h.addr, MAIN_A, "k", &data).await;
    let found = twirp(
        h.addr,
        MAIN_A,
        "GetCacheEntryDownloadURL",
        json!({"key": "k", "version": "v1"}),
    )
    .await
    .json();
    let url = found["signed_download_url"].as_str().unwrap();
    let replayed = call(h.addr, MAIN_B, Method::GET, url, &[], Bytes::new()).await;
    assert_eq!(replayed.status, StatusCode::FORBIDDEN);
    let other = call(h.addr, OTHER_REPO, Method::GET, url, &[], Bytes::new()).await;
    assert_eq!(other.status, StatusCode::FORBIDDEN);
    // An upload URL likewise.
    let created = twirp(
        h.addr,
        MAIN_A,
        "CreateCacheEntry",
        json!({"key": "k2", "version": "v1"}),
    )
    .await
    .json();
    let upload = created["signed_upload_url"].as_str().unwrap();
    let hijack = call(h.addr, MAIN_B, Method::PUT, upload, &[], vec![1u8; 10]).await;
    assert_eq!(hijack.status, StatusCode::FORBIDDEN);
    // A made-up token is unknown.
    let guessed = call(
        h.addr,
        MAIN_A,
        Method::GET,
        &format!("/blob/{}", "0".repeat(64)),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(guessed.status, StatusCode::NOT_FOUND);
    // Another runner cannot finalize the reservation either.
    let finalize = twirp(
        h.addr,
        MAIN_B,
        "FinalizeCacheEntryUpload",
        json!({"key": "k2", "version": "v1", "size_bytes": "0"}),
    )
    .await;
    assert_eq!(finalize.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn saves_past_max_size_evict_the_least_recently_used() {
    let h = start_with(2500, None).await;
    save_v2(h.addr, MAIN_A, "one", &bytes_of(1000, 1)).await;
    save_v2(h.addr, MAIN_A, "two", &bytes_of(1000, 2)).await;
    // Using "one" makes "two" the least recently used.
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(restore_v2(h.addr, MAIN_A, "one", &[]).await.is_some());
    tokio::time::sleep(Duration::from_millis(5)).await;
    save_v2(h.addr, MAIN_A, "three", &bytes_of(1000, 3)).await;
    // Eviction after a finalize runs in the background; run it again to wait for it.
    h.service.evict().unwrap();
    assert!(restore_v2(h.addr, MAIN_A, "two", &[]).await.is_none());
    assert!(restore_v2(h.addr, MAIN_A, "one", &[]).await.is_some());
    assert!(restore_v2(h.addr, MAIN_A, "three", &[]).await.is_some());
    let report = disk_report(h.dir.path()).unwrap();
    assert_eq!(
        (report.entries, report.blob_files, report.orphaned_blobs),
        (2, 2, 0)
    );
}

/// The bytes of the files in the cache's `blobs/`: what the disk holds, whatever the index says.
fn blob_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir.join("blobs"))
        .unwrap()
        .map(|item| item.unwrap().metadata().unwrap().len())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_size_holds_under_a_stream_of_saves_and_the_least_recently_used_go() {
    /// Each entry's size, the bound, how many saves (three times what the bound holds).
    const ENTRY: usize = 1 << 20;
    const MAX_SIZE: u64 = 8 << 20;
    const SAVES: usize = 24;
    /// How long the eviction a finalize starts in the background may take to show.
    const SETTLE: Duration = Duration::from_secs(10);
    let h = start_with(MAX_SIZE, None).await;
    // Two digits: no key is a prefix of another (a lookup matches prefixes too).
    let key = |i: usize| format!("stream-{i:02}");
    let data = |i: usize| bytes_of(ENTRY, u8::try_from(i).unwrap());
    let scope = caller(1, "acme/app", "push", "acme/app", "main").scope;
    // Which saves have an entry, read from the index without using (touching) any.
    let present = || -> Vec<usize> {
        (0..SAVES)
            .filter(|i| {
                !h.service
                    .inner
                    .store
                    .list(&scope.repository, &scope.read, &key(*i))
                    .unwrap()
                    .is_empty()
            })
            .collect()
    };
    for i in 0..SAVES {
        let saved = save_v2(h.addr, MAIN_A, &key(i), &data(i)).await;
        assert_eq!(saved.status, StatusCode::OK, "save {i}");
        // Kept: the first entry (restored after every save, so never the least recently used)
        // and the newest saves the rest of the bound holds; every other went, oldest first.
        let newest = (i + 2).saturating_sub(MAX_SIZE as usize / ENTRY).max(1);
        let expected: Vec<usize> = std::iter::once(0).chain(newest..=i).collect();
        let deadline = std::time::Instant::now() + SETTLE;
        loop {
            let stored = h.service.totals().unwrap().bytes_stored;
            // Until the finalize's eviction has run, at most the entry just saved is over.
            assert!(
                stored <= MAX_SIZE + ENTRY as u64,
                "after save {i}: {stored} bytes stored"
            );
            if stored <= MAX_SIZE && present() == expected {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "after save {i}: {stored} bytes stored (max_size {MAX_SIZE}), entries {:?}, expected {expected:?}",
                present()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let disk = disk_report(h.dir.path()).unwrap();
        assert_eq!(
            (disk.blob_files, disk.orphaned_blobs, disk.staged_files),
            (expected.len() as u64, 0, 0),
            "after save {i}"
        );
        assert!(blob_bytes(h.dir.path()) <= MAX_SIZE, "after save {i}");
        // The first entry, restored between saves, survives byte for byte.
        tokio::time::sleep(Duration::from_millis(2)).await;
        let (matched, first) = restore_v2(h.addr, MAIN_A, &key(0), &[])
            .await
            .unwrap_or_else(|| panic!("the restored entry went after save {i}"));
        assert_eq!(
            (matched, first.as_ref()),
            (key(0), data(0).as_slice()),
            "after save {i}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Through the protocol: the evicted miss, the kept restore their own bytes.
    let kept = present();
    assert_eq!(kept.len(), MAX_SIZE as usize / ENTRY);
    for i in 0..SAVES {
        let restored = restore_v2(h.addr, MAIN_B, &key(i), &[]).await;
        match restored {
            Some((matched, bytes)) => {
                assert!(kept.contains(&i), "evicted entry {i} restored");
                assert_eq!((matched, bytes.as_ref()), (key(i), data(i).as_slice()));
            }
            None => assert!(!kept.contains(&i), "kept entry {i} missed"),
        }
    }
}

#[tokio::test]
async fn unknown_services_are_proxied_upstream_with_the_authorization_intact() {
    // A tiny upstream recording what it got.
    /// Method, URI, Authorization, body.
    type Seen = (String, String, Option<String>, Bytes);
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_addr = upstream.local_addr().unwrap();
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let (stream, _) = upstream.accept().await.unwrap();
            let record = Arc::clone(&record);
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let record = Arc::clone(&record);
                async move {
                    let method = req.method().to_string();
                    let uri = req.uri().to_string();
                    let auth = req
                        .headers()
                        .get("authorization")
                        .map(|v| v.to_str().unwrap().to_owned());
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    record.lock().unwrap().push((method, uri, auth, body));
                    Ok::<_, std::convert::Infallible>(
                        http::Response::builder()
                            .status(202)
                            .header("x-upstream", "yes")
                            .body(Full::new(Bytes::from_static(b"{\"ok\":true}")))
                            .unwrap(),
                    )
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    let h = start_with(
        u64::MAX,
        Some(format!("http://{upstream_addr}/").parse().unwrap()),
    )
    .await;
    let path = "/twirp/github.actions.results.api.v1.ArtifactService/CreateArtifact?x=1";
    let answer = call(
        h.addr,
        MAIN_A,
        Method::POST,
        path,
        &[
            ("content-type", "application/json"),
            ("authorization", "Bearer the-jobs-token"),
        ],
        "{\"name\":\"a\"}",
    )
    .await;
    assert_eq!(answer.status, StatusCode::ACCEPTED);
    assert_eq!(answer.headers["x-upstream"], "yes");
    assert_eq!(answer.body.as_ref(), b"{\"ok\":true}");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![(
            "POST".to_owned(),
            path.to_owned(),
            Some("Bearer the-jobs-token".to_owned()),
            Bytes::from_static(b"{\"name\":\"a\"}")
        )]
    );
    // Cache methods are never proxied, even unknown ones.
    let listed = twirp(h.addr, MAIN_A, "ListCacheEntries", json!({})).await;
    assert_eq!(listed.status, StatusCode::NOT_FOUND);
    assert_eq!(listed.json()["code"], json!("bad_route"));
    // A stranger's call is not proxied.
    let stranger = call(h.addr, STRANGER, Method::POST, path, &[], "{}").await;
    assert_eq!(stranger.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn without_upstream_unknown_paths_are_404() {
    let h = start().await;
    let answer = call(h.addr, MAIN_A, Method::GET, "/elsewhere", &[], Bytes::new()).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_killed_upload_leaves_nothing_after_reopen() {
    let h = start().await;
    let created = twirp(
        h.addr,
        MAIN_A,
        "CreateCacheEntry",
        json!({"key": "half", "version": "v1"}),
    )
    .await
    .json();
    let url = created["signed_upload_url"].as_str().unwrap().to_owned();
    let put = call(
        h.addr,
        MAIN_A,
        Method::PUT,
        &format!("{url}?comp=block&blockid=QQ%3D%3D"),
        &[],
        vec![5u8; 4096],
    )
    .await;
    assert_eq!(put.status, StatusCode::CREATED);
    assert!(disk_report(h.dir.path()).unwrap().staged_files > 0);
    let dir = h.dir.path().to_owned();
    // The service is opened again on the same directory, as after a SIGKILL and restart.
    let reopened = Service::open(Settings {
        dir: dir.clone(),
        max_size: u64::MAX,
        max_age: Duration::from_secs(3600),
        repo_quota: None,
        upstream: None,
        public_base: "http://127.0.0.1:1/".into(),
    })
    .unwrap();
    assert_eq!(
        disk_report(&dir).unwrap(),
        DiskReport {
            entries: 0,
            blob_files: 0,
            orphaned_blobs: 0,
            staged_files: 0
        }
    );
    assert_eq!(reopened.totals().unwrap().entries, 0);
}

/// The `@actions/cache` release the real-client test installs: the one the e2e cache tests
/// drive (tests/e2e/tests/run/cache.rs), its current release when written.
const ACTIONS_CACHE_VERSION: &str = "6.3.0";

/// The real `@actions/cache` client (its `restoreCache`/`saveCache`, through Node) against this
/// server, installed with npm beside the test binaries once. Node connects from 127.0.0.1,
/// attributed here to a default-branch job.
const NODE_SCRIPT: &str = r#"
const [mode, client, key, ...paths] = process.argv.slice(2);
const cache = await import(`${client}/node_modules/@actions/cache/lib/cache.js`);
if (mode === 'save') {
  const id = await cache.saveCache(paths, key);
  console.log(JSON.stringify({ saved: id }));
} else {
  const hit = await cache.restoreCache(paths, key, [key.slice(0, 4)]);
  console.log(JSON.stringify({ restored: hit ?? null }));
}
"#;

/// Runs the script in `cwd` with the runner's cache environment for `protocol` (`v1`/`v2`).
fn node(addr: SocketAddr, protocol: &str, cwd: &std::path::Path, args: &[&str]) -> Value {
    let script = cwd.join("client.mjs");
    std::fs::write(&script, NODE_SCRIPT).unwrap();
    let temp = cwd.join("runner-temp");
    std::fs::create_dir_all(&temp).unwrap();
    let mut command = std::process::Command::new("node");
    command
        .arg(&script)
        .args(args)
        .current_dir(cwd)
        .env("RUNNER_TEMP", &temp)
        .env("GITHUB_WORKSPACE", cwd)
        .env("ACTIONS_RUNTIME_TOKEN", "forged-token")
        .env("GITHUB_SERVER_URL", "https://github.com")
        .env_remove("ACTIONS_CACHE_SERVICE_V2")
        .env_remove("ACTIONS_RESULTS_URL")
        .env_remove("ACTIONS_CACHE_URL");
    let base = format!("http://{addr}/");
    if protocol == "v2" {
        command
            .env("ACTIONS_CACHE_SERVICE_V2", "1")
            .env("ACTIONS_RESULTS_URL", &base);
    } else {
        command.env("ACTIONS_CACHE_URL", &base);
    }
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "node failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().rev().find(|l| l.starts_with('{')).unwrap();
    serde_json::from_str(last).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_real_actions_cache_client_saves_and_restores_through_v2_and_v1() {
    if let Err(why) = crate::test_npm::node_and_npm() {
        crate::test_skip::cannot_run("rm-cache real @actions/cache client", "node", &why);
        return;
    }
    // Beside the test binaries (`<target>/<profile>/rm-npm`), wherever the checkout is.
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(std::path::Path::parent).unwrap();
    let client = tokio::task::spawn_blocking({
        let base = profile.join("rm-npm");
        move || crate::test_npm::npm_package(&base, "@actions/cache", ACTIONS_CACHE_VERSION)
    })
    .await
    .unwrap()
    .display()
    .to_string();
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = Service::open(Settings {
        dir: dir.path().join("cache"),
        max_size: u64::MAX,
        max_age: Duration::from_secs(3600),
        repo_quota: None,
        upstream: None,
        public_base: format!("http://{addr}/"),
    })
    .unwrap();
    let main = caller(1, "acme/app", "push", "acme/app", "main");
    let callers: Arc<dyn Callers> = Arc::new(FakeCallers(
        [("127.0.0.1".parse().unwrap(), main)].into_iter().collect(),
    ));
    let serving = service.clone();
    tokio::spawn(async move {
        serving
            .serve(listener, callers, std::future::pending())
            .await;
    });
    // Sizes: one Put Blob (under the SDK's 128 MiB single shot) and blocks (over it); random
    // bytes so the archive stays that large.
    let sizes: &[(&str, usize)] = &[("v2", 5 << 20), ("v2", 150 << 20), ("v1", 40 << 20)];
    for (n, (protocol, size)) in sizes.iter().enumerate() {
        let work = dir.path().join(format!("work{n}"));
        let data_dir = work.join("data");
        std::fs::create_dir_all(&data_dir).unwrap();
        let mut bytes = vec![0u8; *size];
        getrandom::fill(&mut bytes).unwrap();
        std::fs::write(data_dir.join("blob.bin"), &bytes).unwrap();
        let key = format!("key-{n}-{protocol}");
        let run = |mode: &'static str| {
            let (work, client, key) = (work.clone(), client.clone(), key.clone());
            let protocol = (*protocol).to_owned();
            tokio::task::spawn_blocking(move || {
                node(addr, &protocol, &work, &[mode, &client, &key, "data"])
            })
        };
        let saved = run("save").await.unwrap();
        assert!(saved["saved"].as_i64().unwrap() > 0, "{saved}");
        std::fs::remove_dir_all(&data_dir).unwrap();
        let restored = run("restore").await.unwrap();
        assert_eq!(restored["restored"], json!(key));
        assert_eq!(std::fs::read(data_dir.join("blob.bin")).unwrap(), bytes);
    }
    let report = disk_report(&dir.path().join("cache")).unwrap();
    assert_eq!((report.entries, report.staged_files), (3, 0));
}

#[tokio::test]
async fn signed_urls_are_on_the_base_the_caller_reaches() {
    let h = start().await;
    let created = twirp(
        h.addr,
        OWN_BASE,
        "CreateCacheEntry",
        json!({"key": "k-base", "version": "v"}),
    )
    .await;
    assert_eq!(created.status, StatusCode::OK);
    let url = created.json()["signed_upload_url"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(url.starts_with("http://10.213.0.1:8736/blob/"), "{url}");
    // Another caller's URLs stay on the service's own base.
    let other = twirp(
        h.addr,
        MAIN_A,
        "CreateCacheEntry",
        json!({"key": "k-other", "version": "v"}),
    )
    .await;
    let url = other.json()["signed_upload_url"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        url.starts_with(&format!("http://{}/blob/", h.addr)),
        "{url}"
    );
}

/// A job holds at most [`MAX_UPLOADS_PER_ATTEMPT`] uploads open, and declares no entry over
/// [`MAX_ENTRY_SIZE`]; another job is not held back by the first one's uploads.
#[tokio::test]
async fn a_job_s_open_uploads_and_entry_size_are_bounded() {
    let h = start().await;
    for n in 0..MAX_UPLOADS_PER_ATTEMPT {
        let created = twirp(
            h.addr,
            MAIN_A,
            "CreateCacheEntry",
            json!({"key": format!("open-{n:02}"), "version": "v"}),
        )
        .await;
        assert_eq!(created.status, StatusCode::OK, "upload {n}");
    }
    let one_more = twirp(
        h.addr,
        MAIN_A,
        "CreateCacheEntry",
        json!({"key": "open-more", "version": "v"}),
    )
    .await;
    assert_eq!(one_more.status, StatusCode::TOO_MANY_REQUESTS);
    let other_job = twirp(
        h.addr,
        MAIN_B,
        "CreateCacheEntry",
        json!({"key": "open-other", "version": "v"}),
    )
    .await;
    assert_eq!(other_job.status, StatusCode::OK);
    let too_large = call(
        h.addr,
        BRANCH,
        Method::POST,
        "/_apis/artifactcache/caches",
        &[("content-type", "application/json")],
        json!({"key": "huge", "version": "v", "cacheSize": MAX_ENTRY_SIZE + 1}).to_string(),
    )
    .await;
    assert_eq!(too_large.status, StatusCode::BAD_REQUEST);
    assert!(
        String::from_utf8_lossy(&too_large.body).contains("over the"),
        "{:?}",
        too_large.body
    );
}
