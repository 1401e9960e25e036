//! The runner side of the fake's runner protocol, used by the fake runner binary: register,
//! ask for a job, report it done, say goodbye.

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::jit::{
    Acquired, AssignedJob, FakeJitConfig, JobDone, RUNNER_PROTOCOL_PREFIX, Registered,
    RunnerBehavior, RunnerHello,
};

/// A runner's connection to the fake.
pub struct RunnerSession {
    config: FakeJitConfig,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl RunnerSession {
    pub fn new(config: FakeJitConfig) -> Self {
        Self {
            config,
            client: Client::builder(TokioExecutor::new()).build_http(),
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
        let url = format!("{}{RUNNER_PROTOCOL_PREFIX}/{op}", self.config.server_url);
        let req = http::Request::post(url.as_str())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(serde_json::to_vec(body)?)))?;
        let resp = self
            .client
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

    /// Registers; the fake answers with how this runner should behave.
    pub async fn register(&self) -> anyhow::Result<RunnerBehavior> {
        let r: Registered = self.post("register", &self.hello()).await?;
        Ok(r.behavior)
    }

    /// A job, if one fits this runner now.
    pub async fn acquire(&self) -> anyhow::Result<Option<AssignedJob>> {
        let a: Acquired = self.post("acquire", &self.hello()).await?;
        Ok(a.job)
    }

    pub async fn complete(&self, job_id: u64, conclusion: &str) -> anyhow::Result<()> {
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
