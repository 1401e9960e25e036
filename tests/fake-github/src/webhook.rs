//! Sends the fake's deliveries to the configured webhook URL and records each attempt's outcome
//! in the log. GitHub promises neither order nor exactly-once: by default
//! ([`WebhookOrder::Chaotic`]) each delivery waits a random delay and they are sent
//! concurrently, so they arrive reordered (`in_progress` before `queued`), and some are sent a
//! second time, late, with the same GUID (an old event re-sent after newer ones). The plan comes
//! from a seeded generator: the seed is printed when the fake starts, and
//! `RM_FAKE_WEBHOOK_SEED` replays it. [`WebhookOrder::InOrder`] (one at a time, in order, once)
//! is for tests that say why they need it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::server::Shared;

/// GitHub gives a receiver 10 seconds to answer.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// The environment variable that fixes the seed of the default chaotic order (a failure's
/// printed seed replays its delivery plan).
pub const SEED_ENV: &str = "RM_FAKE_WEBHOOK_SEED";

/// By default, the longest a delivery waits before it is sent: deliveries closer together than
/// this may arrive in either order.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_millis(400);

/// By default, one delivery in this many is sent twice.
pub const DEFAULT_DUPLICATE_ONE_IN: u64 = 4;

/// By default, the longest a duplicate waits after its original's delay: long enough to arrive
/// after the events that followed it (a job's `queued` again after its `completed`).
pub const DEFAULT_LATE_RESEND: Duration = Duration::from_millis(1500);

/// How deliveries leave the fake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookOrder {
    /// One at a time, in the order recorded, each once: easier than GitHub.
    InOrder,
    /// Delayed, concurrent (so reordered) and sometimes duplicated, from a seed.
    Chaotic(Chaos),
}

/// The parameters of [`WebhookOrder::Chaotic`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chaos {
    pub seed: u64,
    pub max_delay: Duration,
    /// One delivery in this many is sent twice (`0`: never).
    pub duplicate_one_in: u64,
    pub late_resend: Duration,
}

impl Chaos {
    /// The default chaos with `seed`.
    pub fn with_seed(seed: u64) -> Self {
        Chaos {
            seed,
            max_delay: DEFAULT_MAX_DELAY,
            duplicate_one_in: DEFAULT_DUPLICATE_ONE_IN,
            late_resend: DEFAULT_LATE_RESEND,
        }
    }
}

impl WebhookOrder {
    /// The default: chaotic, with the seed from [`SEED_ENV`] or a fresh random one.
    pub fn default_chaotic() -> Self {
        let seed = std::env::var(SEED_ENV)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0);
        WebhookOrder::Chaotic(Chaos::with_seed(seed))
    }
}

/// A small seeded generator (splitmix64): the same seed gives the same plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..=max`, in whole milliseconds.
    fn duration(&mut self, max: Duration) -> Duration {
        let ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(self.next_u64() % ms.saturating_add(1))
    }
}

/// What the sender does with one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Wait this long, then send (concurrently with the others unless in order).
    pub delay: Duration,
    /// Also send it a second time (a duplicate is never duplicated again).
    pub duplicate: bool,
    pub concurrent: bool,
}

/// The plan for the next delivery. A duplicate waits longer: up to `max_delay + late_resend`.
pub fn plan(order: WebhookOrder, rng: &mut Rng, is_duplicate: bool) -> Plan {
    match order {
        WebhookOrder::InOrder => Plan {
            delay: Duration::ZERO,
            duplicate: false,
            concurrent: false,
        },
        WebhookOrder::Chaotic(chaos) => {
            let mut delay = rng.duration(chaos.max_delay);
            if is_duplicate {
                delay += rng.duration(chaos.late_resend);
            }
            let duplicate = !is_duplicate
                && chaos.duplicate_one_in > 0
                && rng.next_u64().is_multiple_of(chaos.duplicate_one_in);
            Plan {
                delay,
                duplicate,
                concurrent: true,
            }
        }
    }
}

/// Which of the webhook URLs the next delivery goes to: the only one; with several, in order,
/// each in turn (round-robin, `turn` counting); chaotic, one drawn from the seeded generator, so
/// the printed seed replays which receiver got what. Drawn only when there are several URLs, so
/// one URL leaves the plan of delays and duplicates exactly as before.
pub fn pick_url(
    urls: &[String],
    order: WebhookOrder,
    rng: &mut Rng,
    turn: &mut u64,
) -> Option<String> {
    let n = u64::try_from(urls.len()).ok().filter(|n| *n > 0)?;
    if n == 1 {
        return urls.first().cloned();
    }
    let at = match order {
        WebhookOrder::InOrder => {
            let at = *turn % n;
            *turn += 1;
            at
        }
        WebhookOrder::Chaotic(_) => rng.next_u64() % n,
    };
    urls.get(usize::try_from(at).ok()?).cloned()
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Delivers every id that arrives, until the channel closes.
pub async fn sender(shared: Arc<Shared>, mut outbox: UnboundedReceiver<u64>) {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    while let Some(id) = outbox.recv().await {
        // Whether to fail it is decided in the order deliveries were recorded, so "the next n
        // deliveries fail" means the next n events, whatever order they are sent in.
        let decided = shared.with(|state| {
            let fail = state.fail_deliveries > 0;
            if fail {
                state.fail_deliveries -= 1;
            }
            let order = state.webhook_order;
            let url = state.webhook.as_ref().and_then(|w| {
                pick_url(&w.urls, order, &mut state.webhook_rng, &mut state.url_turn)
            });
            let is_duplicate = state.delivery_mut(id)?.duplicate_of.is_some();
            let plan = plan(order, &mut state.webhook_rng, is_duplicate);
            let d = state.delivery_mut(id)?;
            let prepared = match (fail, url) {
                (true, _) => {
                    d.status = "Failed to connect to host".into();
                    None
                }
                (false, None) => {
                    d.status = "No webhook URL configured".into();
                    None
                }
                (false, Some(url)) => {
                    d.url = Some(url.clone());
                    Some((url, d.headers.clone(), d.body.clone()))
                }
            };
            if prepared.is_some() && plan.duplicate {
                // Recorded now (pending), so `settle` waits for it; sent when its turn comes.
                state.duplicate_delivery(id);
            }
            Some((plan, prepared?))
        });
        let Some((plan, (url, headers, body))) = decided else {
            continue;
        };
        let send = send(
            shared.clone(),
            client.clone(),
            id,
            plan.delay,
            url,
            headers,
            body,
        );
        if plan.concurrent {
            tokio::spawn(send);
        } else {
            send.await;
        }
    }
}

/// Waits `delay`, sends one delivery and records the outcome.
async fn send(
    shared: Arc<Shared>,
    client: HttpClient,
    id: u64,
    delay: Duration,
    url: String,
    headers: Vec<(String, String)>,
    body: Bytes,
) {
    tokio::time::sleep(delay).await;
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
        state.sent += 1;
        let seq = state.sent;
        if let Some(d) = state.delivery_mut(id) {
            d.duration_ms = elapsed;
            d.sent_seq = Some(seq);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_is_immediate_sequential_and_once() {
        let mut rng = Rng::new(7);
        for _ in 0..100 {
            assert_eq!(
                plan(WebhookOrder::InOrder, &mut rng, false),
                Plan {
                    delay: Duration::ZERO,
                    duplicate: false,
                    concurrent: false
                }
            );
        }
    }

    #[test]
    fn several_urls_are_taken_in_turn_in_order_and_drawn_from_the_seed_when_chaotic() {
        let urls: Vec<String> = ["http://a", "http://b", "http://c"]
            .iter()
            .map(|u| (*u).to_owned())
            .collect();
        let (mut rng, mut turn) = (Rng::new(1), 0);
        let picked: Vec<String> = (0..6)
            .filter_map(|_| pick_url(&urls, WebhookOrder::InOrder, &mut rng, &mut turn))
            .collect();
        assert_eq!(
            picked,
            [
                "http://a", "http://b", "http://c", "http://a", "http://b", "http://c"
            ]
        );
        let chaotic = WebhookOrder::Chaotic(Chaos::with_seed(9));
        let draw = |seed: u64| {
            let (mut rng, mut turn) = (Rng::new(seed), 0);
            (0..60)
                .filter_map(|_| pick_url(&urls, chaotic, &mut rng, &mut turn))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(9), draw(9), "the seed replays which URL got what");
        for url in &urls {
            assert!(draw(9).contains(url), "{url} never drawn");
        }
        // One URL draws nothing: the plan of a one-receiver test is unchanged.
        let mut rng = Rng::new(5);
        let one = vec!["http://only".to_owned()];
        assert_eq!(
            pick_url(&one, chaotic, &mut rng, &mut turn),
            Some("http://only".to_owned())
        );
        assert_eq!(rng, Rng::new(5));
        assert_eq!(pick_url(&[], chaotic, &mut rng, &mut turn), None);
    }

    #[test]
    fn a_seed_replays_its_plan_and_the_plan_reorders_and_duplicates() {
        let order = WebhookOrder::Chaotic(Chaos::with_seed(42));
        let plans = |seed: u64| {
            let mut rng = Rng::new(seed);
            (0..200)
                .map(|i| plan(order, &mut rng, i % 5 == 0))
                .collect::<Vec<_>>()
        };
        assert_eq!(plans(42), plans(42), "the same seed, the same plan");
        assert_ne!(plans(42), plans(43));
        let p = plans(42);
        assert!(p.iter().all(|x| x.concurrent));
        // Reordering: a later delivery sent before an earlier one.
        assert!(p.windows(2).any(|w| w[1].delay < w[0].delay));
        let originals: Vec<&Plan> = p.iter().step_by(5).collect();
        assert!(
            originals.iter().all(|x| !x.duplicate),
            "never a duplicate's duplicate"
        );
        let dups = p.iter().filter(|x| x.duplicate).count();
        assert!((20..=70).contains(&dups), "about one in 4 of 160: {dups}");
        let limit = DEFAULT_MAX_DELAY + DEFAULT_LATE_RESEND;
        assert!(p.iter().all(|x| x.delay <= limit));
        assert!(
            originals.iter().any(|x| x.delay > DEFAULT_MAX_DELAY),
            "a duplicate can come after everything sent near its original"
        );
    }
}
