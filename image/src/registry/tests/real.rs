//! Against Docker's own registry (distribution, Debian's `docker-registry`), started on a free
//! loopback port with its storage in a temporary directory, and filled by a real client
//! (`skopeo copy --all` of an OCI layout made here): what the client reads is what another
//! implementation wrote. The registry's access log says which requests reached it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::image::{self, TestIndex};
use super::{PASSWORD, clean_message, credentials, registry_with};
use crate::registry::RegistryError;
use crate::skip;

/// How long a registry may take to listen (polled; a bound, not a measurement).
const START_WAIT: Duration = Duration::from_secs(20);

/// A registry process, killed on drop.
struct Running {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    /// Starts `docker-registry serve` with filesystem storage, and htpasswd basic auth for
    /// `user` when given (bcrypt, as the registry requires).
    fn start(user: Option<(&str, &str)>) -> Running {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let auth = match user {
            None => String::new(),
            Some((user, password)) => {
                let htpasswd = dir.path().join("htpasswd");
                let out = Command::new("htpasswd")
                    .args(["-Bbn", user, password])
                    .output()
                    .expect("htpasswd runs");
                assert!(out.status.success(), "htpasswd: {out:?}");
                std::fs::write(&htpasswd, &out.stdout).expect("htpasswd file");
                format!(
                    "auth:\n  htpasswd:\n    realm: basic-realm\n    path: {}\n",
                    htpasswd.display()
                )
            }
        };
        let config = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: 127.0.0.1:{port}\n  secret: test-only\n{auth}",
            dir.path().join("data").display()
        );
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).expect("config");
        let log = dir.path().join("registry.log");
        let log_file = std::fs::File::create(&log).expect("log file");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log file"))
            .stderr(log_file)
            .spawn()
            .expect("docker-registry starts");
        let mut running = Running {
            child,
            port,
            log,
            _dir: dir,
        };
        let deadline = std::time::Instant::now() + START_WAIT;
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return running;
            }
            if let Ok(Some(status)) = running.child.try_wait() {
                panic!("docker-registry exited ({status}): {}", running.log_text());
            }
            assert!(
                std::time::Instant::now() < deadline,
                "docker-registry did not listen: {}",
                running.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn registry(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The requests in the access log whose request line starts with `prefix` (`GET /v2/...`).
    fn requests(&self, prefix: &str) -> usize {
        let needle = format!("\"{prefix}");
        self.log_text()
            .lines()
            .filter(|l| l.contains(&needle))
            .count()
    }

    /// Waits until the access log holds `n` requests starting with `prefix` (the registry
    /// writes a line once a response is done, which may trail the client a little), and
    /// returns the count then.
    fn settle(&self, prefix: &str, n: usize) -> usize {
        let deadline = std::time::Instant::now() + START_WAIT;
        while self.requests(prefix) < n && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.requests(prefix)
    }

    /// Pushes `images` as `acme/img:<tag>` with skopeo (both platforms: `--all`).
    fn push(&self, images: &TestIndex, tag: &str, creds: Option<(&str, &str)>) {
        let layout = tempfile::tempdir().expect("tempdir");
        images.write_layout(layout.path(), tag);
        let mut skopeo = Command::new("skopeo");
        skopeo.args([
            "--insecure-policy",
            "copy",
            "--all",
            "--dest-tls-verify=false",
        ]);
        if let Some((user, password)) = creds {
            skopeo.arg(format!("--dest-creds={user}:{password}"));
        }
        let out = skopeo
            .arg(format!("oci:{}:{tag}", layout.path().display()))
            .arg(format!("docker://{}/acme/img:{tag}", self.registry()))
            .output()
            .expect("skopeo runs");
        assert!(
            out.status.success(),
            "skopeo copy: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log_text()
        );
    }
}

/// Whether the tools are here; when one is not, the test fails unless the skip rule names it.
fn tools(test: &str, need: &[&str]) -> bool {
    for tool in need {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            skip::cannot_run(
                test,
                tool,
                &format!(
                    "{tool} is not installed (apt-get install docker-registry skopeo apache2-utils)"
                ),
            );
            return false;
        }
    }
    true
}

fn blobs_of(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("blobs/sha256"))
        .expect("blobs")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread")]
async fn a_real_registry_resolves_and_downloads_what_skopeo_pushed() {
    if !tools(
        "registry::real::a_real_registry_resolves_and_downloads_what_skopeo_pushed",
        &["docker-registry", "skopeo"],
    ) {
        return;
    }
    let registry_process = Running::start(None);
    let images = image::multi_arch("pushed by skopeo");
    registry_process.push(&images, "t", None);
    let before = registry_process.settle("PUT /v2/acme/img/manifests/t", 1);
    assert_eq!(
        before,
        1,
        "skopeo pushed the tag: {}",
        registry_process.log_text()
    );

    let client = registry_with(None, None);
    let resolved = client
        .resolve(&registry_process.registry(), "acme/img", "t")
        .await
        .expect("resolve");
    assert_eq!(
        resolved,
        images.index.digest(),
        "the tag names the index skopeo pushed, byte for byte"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = client
        .download(&registry_process.registry(), "acme/img", "t", dir.path())
        .await
        .expect("download");
    assert_eq!(manifest, images.ours.manifest.digest());
    image::assert_layout(dir.path(), &images.ours);
    for blob in images.other.blobs() {
        assert!(
            !blobs_of(dir.path()).contains(&blob.digest().hex()),
            "the other platform's blobs are not fetched"
        );
    }
    let blob_gets = registry_process.settle("GET /v2/acme/img/blobs/", images.ours.blobs().len());
    assert_eq!(blob_gets, images.ours.blobs().len(), "one GET per blob");

    // Again, by the digest resolve gave: everything is in the layout, nothing is asked. (The
    // first download's three manifest requests, HEAD included, are in the log first.)
    let manifest_requests = registry_process.settle("GET /v2/acme/img/manifests/", 2)
        + registry_process.settle("HEAD /v2/acme/img/manifests/", 1);
    assert_eq!(manifest_requests, 3, "{}", registry_process.log_text());
    let all_before = registry_process.requests("GET /v2/") + registry_process.requests("HEAD /v2/");
    let sent_before = client.requests_sent();
    let listing = blobs_of(dir.path());
    let again = client
        .download(
            &registry_process.registry(),
            "acme/img",
            &resolved.to_string(),
            dir.path(),
        )
        .await
        .expect("second download");
    assert_eq!(again, manifest);
    assert_eq!(client.requests_sent(), sent_before, "no request sent");
    assert_eq!(
        registry_process.requests("GET /v2/") + registry_process.requests("HEAD /v2/"),
        all_before,
        "the registry saw no request"
    );
    assert_eq!(blobs_of(dir.path()), listing);
    image::assert_layout(dir.path(), &images.ours);

    // By tag again: the tag is asked (it may have moved), no blob is.
    let blob_gets = registry_process.requests("GET /v2/acme/img/blobs/");
    client
        .download(&registry_process.registry(), "acme/img", "t", dir.path())
        .await
        .expect("third download");
    assert_eq!(
        registry_process.settle("GET /v2/acme/img/manifests/", 3),
        3,
        "the tag alone was asked again"
    );
    assert_eq!(
        registry_process.requests("GET /v2/acme/img/blobs/"),
        blob_gets
    );

    let e = client
        .download(
            &registry_process.registry(),
            "acme/img",
            "absent",
            dir.path(),
        )
        .await
        .expect_err("no such tag");
    assert!(matches!(e, RegistryError::NotFound { .. }), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_real_registry_with_basic_auth_takes_the_right_credentials_only() {
    if !tools(
        "registry::real::a_real_registry_with_basic_auth_takes_the_right_credentials_only",
        &["docker-registry", "skopeo", "htpasswd"],
    ) {
        return;
    }
    let registry_process = Running::start(Some(("alice", PASSWORD)));
    let images = image::multi_arch("behind basic auth");
    registry_process.push(&images, "t", Some(("alice", PASSWORD)));

    let right = registry_with(None, credentials("alice", PASSWORD));
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = right
        .download(&registry_process.registry(), "acme/img", "t", dir.path())
        .await
        .expect("download with the right credentials");
    assert_eq!(manifest, images.ours.manifest.digest());
    image::assert_layout(dir.path(), &images.ours);

    let wrong = registry_with(None, credentials("alice", "wrong-password"));
    let other = tempfile::tempdir().expect("tempdir");
    let e = wrong
        .download(&registry_process.registry(), "acme/img", "t", other.path())
        .await
        .expect_err("wrong credentials");
    let text = clean_message(&e);
    assert!(matches!(e, RegistryError::Unauthorized { .. }), "{text}");
    assert!(
        text.contains(&registry_process.registry()) && text.contains("\"alice\""),
        "{text}"
    );
    assert!(!other.path().join("index.json").exists());

    let anonymous = registry_with(None, None);
    let e = anonymous
        .resolve(&registry_process.registry(), "acme/img", "t")
        .await
        .expect_err("no credentials");
    let text = clean_message(&e);
    assert!(
        text.contains("asks for credentials and none were given"),
        "{text}"
    );
}
