//! Sends the fake's deliveries to the configured webhook URL, one at a time and in order, as
//! GitHub's hookshot does for one hook, and records each attempt's outcome in the log.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::server::Shared;

/// GitHub gives a receiver 10 seconds to answer.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// Delivers every id that arrives, until the channel closes.
pub async fn sender(shared: Arc<Shared>, mut outbox: UnboundedReceiver<u64>) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    while let Some(id) = outbox.recv().await {
        let prepared = shared.with(|state| {
            let fail = state.fail_deliveries > 0;
            if fail {
                state.fail_deliveries -= 1;
            }
            let url = state.webhook.as_ref().map(|w| w.url.clone());
            let d = state.delivery_mut(id)?;
            match (fail, url) {
                (true, _) => {
                    d.status = "Failed to connect to host".into();
                    None
                }
                (false, None) => {
                    d.status = "No webhook URL configured".into();
                    None
                }
                (false, Some(url)) => Some((url, d.headers.clone(), d.body.clone())),
            }
        });
        let Some((url, headers, body)) = prepared else {
            continue;
        };
        let started = tokio::time::Instant::now();
        let mut request = http::Request::post(url.as_str());
        for (k, v) in &headers {
            request = request.header(k.as_str(), v.as_str());
        }
        let outcome = match request.body(Full::new(body)) {
            Err(e) => Err(format!("Invalid URL: {e}")),
            Ok(req) => match tokio::time::timeout(DELIVERY_TIMEOUT, async {
                let resp = client.request(req).await.map_err(|e| format!("{e}"))?;
                let status = resp.status().as_u16();
                let body = resp
                    .into_body()
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                Ok::<_, String>((status, String::from_utf8_lossy(&body).into_owned()))
            })
            .await
            {
                Ok(r) => r,
                Err(_) => Err("timed out".into()),
            },
        };
        let elapsed = started.elapsed().as_millis() as u64;
        shared.with(|state| {
            if let Some(d) = state.delivery_mut(id) {
                d.duration_ms = elapsed;
                match outcome {
                    Ok((code, body)) => {
                        d.status_code = code;
                        d.status = if (200..300).contains(&code) {
                            "OK".into()
                        } else {
                            format!("Invalid HTTP Response: {code}")
                        };
                        d.response_body = body;
                    }
                    Err(reason) => d.status = reason,
                }
            }
        });
    }
}
