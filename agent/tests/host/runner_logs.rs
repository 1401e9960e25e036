//! Logs kept, with a real runner process: a shell script stands in as `bin/Runner.Listener`,
//! started through the `none` backend, and prints to its stdout and stderr what a careless job
//! could: the JIT configuration it got (real-shaped: the fake GitHub's encoding), a GitHub
//! token, a JWT, a PEM private key, an `Authorization` header. Its output reaches
//! `_diag/rm-output.log` in its runtime (no pipe to the agent); the copy cleanup keeps has every
//! line of it but none of those secrets.

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use rm_fake_github::FakeJitConfig;
use rm_runner::backend::{Backend as _, NoIsolation, Plan};
use rm_runner::logs::{self, Attempt, Bounds, Kept, Store};
use rm_runner::process::LISTENER;
use rm_runner::{RunnerRoot, Spawned};
use secrecy::SecretString;

const TOKEN: &str = "ghs_16C7e42F292c6912E7710c838347Ae178B4a";
const PAT: &str = "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123";
const JWT: &str =
    "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiIxMjM0NTYiLCJpYXQiOjE3MDAwMDAwMDB9.c2lnbmF0dXJlLWJ5dGVzLWhlcmU";
const KEY_LINE: &str = "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun";
const BEARER: &str = "Bearer s3cr3t-v4lue";

/// Prints each secret to stdout or stderr, between two plain lines, and exits.
fn script() -> String {
    format!(
        r#"#!/bin/sh
echo "hello from stdout"
echo "config: $ACTIONS_RUNNER_INPUT_JITCONFIG"
echo "token {TOKEN} and {PAT}" >&2
echo "jwt={JWT}"
echo "-----BEGIN RSA PRIVATE KEY-----"
echo "{KEY_LINE}"
echo "-----END RSA PRIVATE KEY-----" >&2
echo "Authorization: {BEARER}" >&2
echo "goodbye from stderr" >&2
"#
    )
}

#[tokio::test]
async fn a_runners_output_is_kept_with_every_line_and_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let package = dir.path().join("package");
    std::fs::create_dir_all(package.join("bin")).unwrap();
    let listener = package.join(LISTENER);
    std::fs::write(&listener, script()).unwrap();
    std::fs::set_permissions(&listener, std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = RunnerRoot::open(&dir.path().join("runners")).unwrap();
    let attempt_id = "0000000000000000000000000000000b";
    let runtime = root.create_ephemeral(attempt_id, &package).unwrap();
    let backend = NoIsolation {
        root: root.clone(),
        package: rm_runner::package::current::CurrentPackage::new(&package),
    };
    let plan = Plan {
        attempt_id: attempt_id.to_owned(),
        workspace: rm_journal::WorkspaceKind::Ephemeral,
        runtime_dir: runtime.dir().to_owned(),
        uid: None,
        cgroup: None,
        limits: Default::default(),
        env: Default::default(),
        network_allow: None,
        egress: None,
        egress_report: None,
        docker: None,
        cache: None,
        image: None,
        devices: None,
    };
    let jit = FakeJitConfig {
        server_url: "http://127.0.0.1:4711".to_owned(),
        runner_id: 42,
        runner_name: "rm-host-0000000000000000".to_owned(),
        token: "fake-runner-credential-0123456789abcdef".to_owned(),
        work_folder: "_work".to_owned(),
    }
    .encode();
    let Spawned { mut child, .. } = backend
        .start(&plan, &runtime, &SecretString::from(jit.clone()))
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the script exits")
        .unwrap();
    assert!(status.success(), "{status:?}");
    let output = std::fs::read_to_string(runtime.dir().join("_diag").join(logs::OUTPUT_FILE))
        .expect("the runner's output is in its runtime");
    // The script really printed them (else finding none below would prove nothing).
    for secret in [jit.as_str(), TOKEN, PAT, JWT, KEY_LINE, BEARER] {
        assert!(output.contains(secret), "{secret} not printed: {output}");
    }

    let store = Store::new(&dir.path().join("data"), Bounds::default());
    let attempt = Attempt {
        attempt_id: attempt_id.to_owned(),
        runner_name: "rm-host-0000000000000000".to_owned(),
        policy: "linux".to_owned(),
        job_id: Some(7),
        runtime_dir: runtime.dir().to_owned(),
    };
    let Kept::Made(manifest) = store.keep(&attempt, 1).unwrap() else {
        panic!("a copy is made");
    };
    assert_eq!(manifest.files[0].name, logs::OUTPUT_FILE);
    backend.clean(&plan).unwrap();
    assert!(!runtime.dir().exists());

    let kept = std::fs::read_to_string(store.entry(attempt_id).join(logs::OUTPUT_FILE)).unwrap();
    assert!(
        kept.contains("hello from stdout") && kept.contains("goodbye from stderr"),
        "{kept}"
    );
    assert_eq!(kept.lines().count(), output.lines().count(), "{kept}");
    let token_in_jit = "fake-runner-credential";
    for secret in [
        jit.as_str(),
        token_in_jit,
        TOKEN,
        PAT,
        JWT,
        KEY_LINE,
        BEARER,
        "s3cr3t",
    ] {
        assert!(!kept.contains(secret), "{secret} kept: {kept}");
    }
    let every_file: String = std::fs::read_dir(store.entry(attempt_id))
        .unwrap()
        .map(|f| std::fs::read_to_string(f.unwrap().path()).unwrap())
        .collect();
    assert!(!every_file.contains(jit.as_str()));
}
