//! The runner side of the fake's runner protocol, used by the fake runner binary: register,
//! ask for a job, renew its lock while running it (as a real runner does; a runner that stops,
//! crashed or killed, has its job given up by the fake), report it done, say goodbye.

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::jit::{
    Acquired, AssignedJob, FakeJitConfig, JOB_RENEW_INTERVAL, JobDone, JobRenewal,
    RUNNER_PROTOCOL_PREFIX, Registered, RunnerBehavior, RunnerHello,
};

type Http = Client<HttpConnector, Full<Bytes>>;

/// A runner's connection to the fake.
pub struct RunnerSession {
    config: FakeJitConfig,
    client: Http,
    /// Renews the lock on the running job until it is reported done or the session ends.
    renewal: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for RunnerSession {
    fn drop(&mut self) {
        self.stop_renewing();
    }
}

impl RunnerSession {
    pub fn new(config: FakeJitConfig) -> Self {
        Self {
            config,
            client: Client::builder(TokioExecutor::new()).build_http(),
            renewal: std::sync::Mutex::new(None),
        }
    }

    fn stop_renewing(&self) {
        let task = self
            .renewal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            task.abort();
        }
    }

    /// Renews the lock on `job_id` every [`JOB_RENEW_INTERVAL`] until stopped, or until the
    /// fake says the job is no longer this runner's.
    fn start_renewing(&self, job_id: u64) {
        let (client, config) = (self.client.clone(), self.config.clone());
        let renewal = JobRenewal {
            runner_id: config.runner_id,
            token: config.token.clone(),
            job_id,
        };
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(JOB_RENEW_INTERVAL).await;
                let renewed: anyhow::Result<serde_json::Value> =
                    post(&client, &config, "renew", &renewal).await;
                if renewed.is_err() {
                    return;
                }
            }
        });
        let old = self
            .renewal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .replace(task);
        if let Some(old) = old {
            old.abort();
        }
    }

    pub fn config(&self) -> &FakeJitConfig {
        &self.config
    }

    fn hello(&self) -> RunnerHello {
        RunnerHello {
            runner_id: self.config.runner_id,
            token: self.config.token.clone(),
        }
    }

    async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        op: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        post(&self.client, &self.config, op, body).await
    }

    /// Registers; the fake answers with how this runner should behave.
    pub async fn register(&self) -> anyhow::Result<RunnerBehavior> {
        let r: Registered = self.post("register", &self.hello()).await?;
        Ok(r.behavior)
    }

    /// A job, if one fits this runner now.
    pub async fn acquire(&self) -> anyhow::Result<Option<AssignedJob>> {
        let a: Acquired = self.post("acquire", &self.hello()).await?;
        if let Some(job) = &a.job {
            self.start_renewing(job.job_id);
        }
        Ok(a.job)
    }

    pub async fn complete(&self, job_id: u64, conclusion: &str) -> anyhow::Result<()> {
        self.stop_renewing();
        let done = JobDone {
            runner_id: self.config.runner_id,
            token: self.config.token.clone(),
            job_id,
            conclusion: conclusion.to_owned(),
        };
        let _: serde_json::Value = self.post("complete", &done).await?;
        Ok(())
    }

    /// Goes offline (an idle exit); the registration stays until someone deletes it.
    pub async fn exit(&self) -> anyhow::Result<()> {
        let _: serde_json::Value = self.post("exit", &self.hello()).await?;
        Ok(())
    }
}

/// One runner-protocol call: POST `op` with `body`, the answer's JSON.
async fn post<B: Serialize, T: DeserializeOwned>(
    client: &Http,
    config: &FakeJitConfig,
    op: &str,
    body: &B,
) -> anyhow::Result<T> {
    let url = format!("{}{RUNNER_PROTOCOL_PREFIX}/{op}", config.server_url);
    let req = http::Request::post(url.as_str())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body)?)))?;
    let resp = client
        .request(req)
        .await
        .with_context(|| format!("cannot reach the fake GitHub at {url}"))?;
    let status = resp.status();
    let bytes = resp.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        bail!(
            "{op} refused ({status}): {}",
            String::from_utf8_lossy(&bytes)
        );
    }
    Ok(serde_json::from_slice(&bytes)?)
}
