//! What the benchmarks that run `rm-agent` against the fake GitHub share: the fake with one
//! organization and repository whose jobs take a given time ([`fake_github`]), and the agent
//! as a child process ([`AgentProcess`]) started on its configuration file with its log in a
//! file, stopped by SIGTERM (it drains) within [`STOP`], and killed if dropped, so a failed run
//! leaves nothing running.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use rm_fake_github::{AppKeyPair, FakeGithub, FakeOptions, RunnerBehavior};

/// How long an agent may take to drain and exit after SIGTERM.
pub const STOP: Duration = Duration::from_secs(60);

/// A fake GitHub for App `app_id` (its key returned beside it) with the organization `acme`
/// and the repository `repo`, whose jobs take `job_duration` on a runner.
pub async fn fake_github(
    app_id: u64,
    repo: &str,
    job_duration: Duration,
) -> Result<(AppKeyPair, FakeGithub)> {
    let key = AppKeyPair::generate()?;
    let fake = FakeGithub::start(FakeOptions::new(app_id, key.public_pem.clone())).await?;
    fake.add_org("acme");
    fake.add_repo(repo);
    fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: u64::try_from(job_duration.as_millis())?,
        ..RunnerBehavior::default()
    });
    Ok((key, fake))
}

/// Writes the App's private key as `dir/app.pem`, readable by its owner only (the agent refuses
/// a key file others can read), and returns its path for `github.private_key_file`.
pub fn write_app_key(dir: &Path, key: &AppKeyPair) -> Result<PathBuf> {
    use secrecy::ExposeSecret as _;
    use std::os::unix::fs::PermissionsExt as _;
    let key_file = dir.join("app.pem");
    std::fs::write(&key_file, key.private_pem.expose_secret())?;
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600))?;
    Ok(key_file)
}

/// One running `rm-agent`.
pub struct AgentProcess {
    name: String,
    child: Child,
    log: PathBuf,
}

impl AgentProcess {
    /// Starts `agent --config config command` with `secret` as its webhook secret, its stderr
    /// into `log`. `RM_BENCH_AGENT_LOG=info` (or `debug`) keeps more of its log than warnings.
    pub fn spawn(
        name: impl Into<String>,
        agent: &Path,
        config: &Path,
        command: &str,
        secret: &str,
        log: PathBuf,
    ) -> Result<Self> {
        let stderr = std::fs::File::create(&log)?;
        let child = Command::new(agent)
            .arg("--config")
            .arg(config)
            .arg(command)
            .env("RM_WEBHOOK_SECRET", secret)
            .env(
                "RM_LOG",
                std::env::var("RM_BENCH_AGENT_LOG").unwrap_or_else(|_| "warn".to_owned()),
            )
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("cannot start rm-agent {command}"))?;
        Ok(AgentProcess {
            name: name.into(),
            child,
            log,
        })
    }

    /// Fails with its log if it has exited.
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            bail!("{}: rm-agent exited ({status}):\n{log}", self.name);
        }
        Ok(())
    }

    /// SIGTERM (the agent drains), then up to [`STOP`] for it to exit.
    pub async fn stop(&mut self) -> Result<()> {
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::TERM,
        )?;
        let deadline = Instant::now() + STOP;
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                bail!(
                    "{}: rm-agent did not exit within {STOP:?} of SIGTERM",
                    self.name
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
