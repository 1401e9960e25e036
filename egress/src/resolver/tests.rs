//! The resolver against real sockets: a stand-in upstream on the loopback, queries from the
//! loopback (the "runner" registered at 127.0.0.1), and a firewall double that records what it
//! was asked to open (the real one, `nft` in a runner's namespace, is tested in rm-runner and
//! end to end).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rm_runner::network::Names;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, UdpSocket};

use super::*;

const PUBLIC: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 11);

/// A query for `name`, type A, id `id`.
fn query(id: u16, name: &str) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        m.push(u8::try_from(label.len()).unwrap());
        m.extend_from_slice(label.as_bytes());
    }
    m.extend_from_slice(&[0, 0, 1, 0, 1]);
    m
}

/// The stand-in upstream's answer: `public.test` and names under `cdn.test` are PUBLIC with
/// TTL 5, everything else NXDOMAIN.
fn upstream_answer(q: &[u8]) -> Vec<u8> {
    let parsed = crate::dns::parse_query(q).unwrap();
    let known = parsed.name == "public.test" || parsed.name.ends_with(".cdn.test");
    let mut m = q.to_vec();
    m[2] = 0x81;
    m[3] = if known { 0x80 } else { 0x83 };
    m[6..8].copy_from_slice(&u16::from(known).to_be_bytes());
    if known {
        m.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4]);
        m.extend_from_slice(&PUBLIC.octets());
    }
    m
}

fn rcode(reply: &[u8]) -> u8 {
    reply[3] & 0x0f
}

/// Names the stand-in upstream was asked.
type Seen = Arc<Mutex<Vec<String>>>;

async fn upstream() -> (SocketAddr, Seen) {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let tcp = tokio::net::TcpListener::bind(addr).await.unwrap();
    let seen: Seen = Arc::default();
    let udp_seen = seen.clone();
    tokio::spawn(async move {
        let mut buf = [0u8; 512];
        loop {
            let (n, from) = socket.recv_from(&mut buf).await.unwrap();
            udp_seen
                .lock()
                .unwrap()
                .push(crate::dns::parse_query(&buf[..n]).unwrap().name);
            socket
                .send_to(&upstream_answer(&buf[..n]), from)
                .await
                .unwrap();
        }
    });
    let tcp_seen = seen.clone();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = tcp.accept().await.unwrap();
            let q = read_framed(&mut stream).await.unwrap();
            tcp_seen
                .lock()
                .unwrap()
                .push(crate::dns::parse_query(&q).unwrap().name);
            stream
                .write_all(&crate::dns::frame(&upstream_answer(&q)))
                .await
                .unwrap();
        }
    });
    (addr, seen)
}

/// One call of the firewall: the runner's namespace and what it opened.
type Opened = (String, Vec<(Ipv4Addr, Duration)>);

/// Records what it was asked to open; fails when `fail` is set.
#[derive(Default)]
struct Recorded {
    opened: Mutex<Vec<Opened>>,
    fail: std::sync::atomic::AtomicBool,
}

impl Firewall for Recorded {
    fn open(&self, names: &Names, addresses: &[(Ipv4Addr, Duration)]) -> Result<(), String> {
        if self.fail.load(Ordering::SeqCst) {
            return Err("nft: the table is gone".to_owned());
        }
        self.opened
            .lock()
            .unwrap()
            .push((names.netns.clone(), addresses.to_vec()));
        Ok(())
    }
}

struct Setup {
    resolver: Resolver,
    firewall: Arc<Recorded>,
    seen: Seen,
}

async fn setup(mode: Mode, allow: &[&str]) -> Setup {
    let (addr, seen) = upstream().await;
    let firewall = Arc::new(Recorded::default());
    let resolver = Resolver::bind(vec![addr], firewall.clone()).await.unwrap();
    let serving = resolver.clone();
    tokio::spawn(async move { serving.serve().await });
    let list =
        AllowList::parse(&allow.iter().map(|e| (*e).to_owned()).collect::<Vec<_>>()).unwrap();
    resolver.register(
        Runner {
            attempt_id: "a1".into(),
            address: Ipv4Addr::LOCALHOST,
            allow: Arc::new(list),
            mode,
            names: Names::of("0123456789ab"),
        },
        None,
    );
    Setup {
        resolver,
        firewall,
        seen,
    }
}

async fn ask(resolver: &Resolver, from: Ipv4Addr, message: &[u8]) -> Vec<u8> {
    let socket = UdpSocket::bind((from, 0)).await.unwrap();
    socket
        .send_to(message, (Ipv4Addr::LOCALHOST, resolver.port()))
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), socket.recv(&mut buf))
        .await
        .expect("the resolver answers")
        .unwrap();
    buf.truncate(n);
    buf
}

#[tokio::test]
async fn an_allowed_name_is_answered_after_its_address_is_opened_and_a_denied_one_never_leaves() {
    let s = setup(Mode::Enforce, &["public.test", "*.cdn.test"]).await;
    let reply = ask(&s.resolver, Ipv4Addr::LOCALHOST, &query(7, "public.test")).await;
    assert_eq!(
        reply,
        upstream_answer(&query(7, "public.test")),
        "the upstream's bytes"
    );
    assert_eq!(
        s.firewall.opened.lock().unwrap().clone(),
        vec![("rm-0123456789ab".to_owned(), vec![(PUBLIC, MIN_OPEN)])]
    );
    // Asked again at once: already open long enough, no `nft`.
    ask(&s.resolver, Ipv4Addr::LOCALHOST, &query(8, "Public.Test")).await;
    assert_eq!(s.firewall.opened.lock().unwrap().len(), 1);
    let reply = ask(&s.resolver, Ipv4Addr::LOCALHOST, &query(9, "img.cdn.test")).await;
    assert_eq!(rcode(&reply), crate::dns::NOERROR);

    let reply = ask(&s.resolver, Ipv4Addr::LOCALHOST, &query(10, "denied.test")).await;
    assert_eq!(rcode(&reply), crate::dns::NXDOMAIN);
    assert_eq!(&reply[..2], &10u16.to_be_bytes());
    assert!(
        !s.seen.lock().unwrap().iter().any(|n| n == "denied.test"),
        "a denied name reached the upstream: {:?}",
        s.seen.lock().unwrap()
    );
    let (_, tally) = s.resolver.unregister(Ipv4Addr::LOCALHOST, "a1").unwrap();
    let record = tally.record(None, &AllowList::empty());
    let names: Vec<(&str, Verdict, u64)> = record
        .names
        .iter()
        .map(|n| (n.name.as_str(), n.verdict, n.queries))
        .collect();
    assert_eq!(
        names,
        vec![
            ("denied.test", Verdict::Denied, 1),
            ("img.cdn.test", Verdict::Allowed, 1),
            ("public.test", Verdict::Allowed, 2),
        ]
    );
}

#[tokio::test]
async fn audit_forwards_everything_and_opens_nothing() {
    let s = setup(Mode::Audit, &["public.test"]).await;
    let reply = ask(&s.resolver, Ipv4Addr::LOCALHOST, &query(1, "denied.test")).await;
    assert_eq!(reply, upstream_answer(&query(1, "denied.test")));
    ask(&s.resolver, Ipv4Addr::LOCALHOST, &query(2, "public.test")).await;
    assert!(s.firewall.opened.lock().unwrap().is_empty());
    assert!(s.seen.lock().unwrap().iter().any(|n| n == "denied.test"));
    let (_, tally) = s.resolver.tallies().pop().unwrap();
    let record = tally.record(None, &AllowList::empty());
    assert_eq!(record.names[0].verdict, Verdict::WouldDeny);
    assert_eq!(record.names[1].verdict, Verdict::Allowed);
}

#[tokio::test]
async fn a_source_no_runner_is_registered_for_is_refused() {
    let s = setup(Mode::Enforce, &["public.test"]).await;
    let reply = ask(
        &s.resolver,
        Ipv4Addr::new(127, 0, 0, 2),
        &query(3, "public.test"),
    )
    .await;
    assert_eq!(rcode(&reply), crate::dns::REFUSED);
    assert!(s.seen.lock().unwrap().is_empty());
    // Unregistering another attempt's runner at the address leaves this one.
    assert!(
        s.resolver
            .unregister(Ipv4Addr::LOCALHOST, "other")
            .is_none()
    );
    assert_eq!(s.resolver.tallies().len(), 1);
}

#[tokio::test]
async fn an_answer_whose_addresses_cannot_be_opened_is_a_servfail() {
    let s = setup(Mode::Enforce, &["public.test"]).await;
    s.firewall.fail.store(true, Ordering::SeqCst);
    let reply = ask(&s.resolver, Ipv4Addr::LOCALHOST, &query(4, "public.test")).await;
    assert_eq!(rcode(&reply), crate::dns::SERVFAIL);
}

#[tokio::test]
async fn a_flood_is_refused_past_the_rate_and_counted() {
    let s = setup(Mode::Enforce, &["public.test"]).await;
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    // In batches, each read back before the next, so that no reply is lost to the test's own
    // receive buffer.
    let (batches, batch) = (20u16, 50u16);
    let mut refused = 0u64;
    let mut buf = [0u8; 512];
    for b in 0..batches {
        for i in 0..batch {
            let id = b * batch + i;
            socket
                .send_to(
                    &query(id, &format!("n{id}.flood.test")),
                    (Ipv4Addr::LOCALHOST, s.resolver.port()),
                )
                .await
                .unwrap();
        }
        for _ in 0..batch {
            let n = tokio::time::timeout(Duration::from_secs(5), socket.recv(&mut buf))
                .await
                .expect("every query is answered")
                .unwrap();
            if rcode(&buf[..n]) == crate::dns::REFUSED {
                refused += 1;
            }
        }
    }
    // The burst and what the rate gave back while the batches went are answered, the rest
    // refused.
    assert!(
        refused > 0,
        "a flood of {} was never refused",
        batches * batch
    );
    let (_, tally) = s.resolver.tallies().pop().unwrap();
    let record = tally.record(None, &AllowList::empty());
    assert_eq!(record.rate_limited, refused);
    assert_eq!(
        s.resolver.counters().rate_limited.load(Ordering::Relaxed),
        refused
    );
    // The flood's names were refused ones of one zone: a channel.
    assert_eq!(record.tunnelling[0].zone, "flood.test");
}

#[tokio::test]
async fn tcp_queries_are_answered_over_tcp() {
    let s = setup(Mode::Enforce, &["public.test"]).await;
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, s.resolver.port()))
        .await
        .unwrap();
    for (id, name, want) in [
        (1u16, "public.test", crate::dns::NOERROR),
        (2, "denied.test", crate::dns::NXDOMAIN),
    ] {
        stream
            .write_all(&crate::dns::frame(&query(id, name)))
            .await
            .unwrap();
        let reply = read_framed(&mut stream).await.unwrap();
        assert_eq!(rcode(&reply), want, "{name}");
    }
    assert_eq!(s.firewall.opened.lock().unwrap().len(), 1);
}

#[test]
fn decisions_follow_the_mode_and_the_list() {
    let list = AllowList::parse(&["github.com".to_owned()]).unwrap();
    for (mode, name, want) in [
        (
            Mode::Enforce,
            "github.com",
            (Decision::ForwardAndOpen, Verdict::Allowed),
        ),
        (
            Mode::Enforce,
            "evil.test",
            (Decision::Refuse, Verdict::Denied),
        ),
        (
            Mode::Audit,
            "github.com",
            (Decision::Forward, Verdict::Allowed),
        ),
        (
            Mode::Audit,
            "evil.test",
            (Decision::Forward, Verdict::WouldDeny),
        ),
    ] {
        assert_eq!(decide(&list, mode, name), want, "{mode:?} {name}");
    }
}

#[test]
fn an_address_stays_open_for_its_ttl_within_bounds() {
    for (ttl, want) in [
        (0, MIN_OPEN),
        (5, MIN_OPEN),
        (300, Duration::from_secs(300)),
        (86_400, MAX_OPEN),
        (u32::MAX, MAX_OPEN),
    ] {
        assert_eq!(open_for(ttl), want, "{ttl}");
    }
}

#[test]
fn the_bucket_gives_a_burst_then_the_rate() {
    let start = Instant::now();
    let mut bucket = Bucket::new(start);
    let burst = (0..1000).take_while(|_| bucket.take(start)).count();
    assert_eq!(burst as f64, QUERY_BURST);
    assert!(!bucket.take(start));
    // A second later, a second's worth.
    let later = start + Duration::from_secs(1);
    let more = (0..1000).take_while(|_| bucket.take(later)).count();
    assert_eq!(more as f64, QUERIES_PER_SECOND);
    // A clock that goes back gives nothing.
    assert!(!bucket.take(start));
}

/// Records the reports it was asked to write.
#[derive(Default)]
struct Reports(Mutex<Vec<(String, usize)>>);

impl Reporter for Reports {
    fn report(&self, runner: &Runner, tally: &Tally) {
        let names = tally.record(None, &AllowList::empty()).names.len();
        self.0
            .lock()
            .unwrap()
            .push((runner.attempt_id.clone(), names));
    }
}

#[tokio::test]
async fn the_report_name_has_the_report_written_and_is_never_recorded_or_sent() {
    let s = setup(Mode::Enforce, &["public.test"]).await;
    // Without a reporter: only NXDOMAIN.
    let reply = ask(&s.resolver, Ipv4Addr::LOCALHOST, &query(1, REPORT_NAME)).await;
    assert_eq!(rcode(&reply), crate::dns::NXDOMAIN);
    let reports = Arc::new(Reports::default());
    s.resolver.set_reporter(reports.clone());
    ask(&s.resolver, Ipv4Addr::LOCALHOST, &query(2, "public.test")).await;
    let reply = ask(&s.resolver, Ipv4Addr::LOCALHOST, &query(3, REPORT_NAME)).await;
    assert_eq!(rcode(&reply), crate::dns::NXDOMAIN);
    assert_eq!(
        reports.0.lock().unwrap().clone(),
        vec![("a1".to_owned(), 1)]
    );
    // Asked again at once: answered, not written again (at most once per REPORT_EVERY).
    let reply = ask(&s.resolver, Ipv4Addr::LOCALHOST, &query(5, REPORT_NAME)).await;
    assert_eq!(rcode(&reply), crate::dns::NXDOMAIN);
    assert_eq!(reports.0.lock().unwrap().len(), 1);
    let (_, tally) = s.resolver.tallies().pop().unwrap();
    let names: Vec<String> = tally
        .record(None, &AllowList::empty())
        .names
        .into_iter()
        .map(|n| n.name)
        .collect();
    assert_eq!(names, vec!["public.test"]);
    assert!(!s.seen.lock().unwrap().iter().any(|n| n == REPORT_NAME));
    // Another source's report name writes nothing.
    ask(
        &s.resolver,
        Ipv4Addr::new(127, 0, 0, 2),
        &query(4, REPORT_NAME),
    )
    .await;
    assert_eq!(reports.0.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_runner_holds_at_most_its_tcp_connections() {
    let s = setup(Mode::Enforce, &["public.test"]).await;
    let mut held = Vec::new();
    for _ in 0..MAX_TCP_CONNECTIONS {
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, s.resolver.port()))
            .await
            .unwrap();
        // Each is served: a query answered proves the resolver took it.
        stream
            .write_all(&crate::dns::frame(&query(1, "public.test")))
            .await
            .unwrap();
        let reply = read_framed(&mut stream).await.unwrap();
        assert_eq!(rcode(&reply), crate::dns::NOERROR);
        held.push(stream);
    }
    // One more is closed at once, unanswered.
    let mut extra = TcpStream::connect((Ipv4Addr::LOCALHOST, s.resolver.port()))
        .await
        .unwrap();
    let _ = extra
        .write_all(&crate::dns::frame(&query(2, "public.test")))
        .await;
    let mut buf = [0u8; 2];
    let read = tokio::time::timeout(Duration::from_secs(5), extra.read(&mut buf))
        .await
        .expect("the extra connection is closed, not left open");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    // A held one closed frees its place.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut again = TcpStream::connect((Ipv4Addr::LOCALHOST, s.resolver.port()))
        .await
        .unwrap();
    again
        .write_all(&crate::dns::frame(&query(3, "public.test")))
        .await
        .unwrap();
    let mut len = [0u8; 2];
    tokio::time::timeout(Duration::from_secs(5), again.read_exact(&mut len))
        .await
        .expect("a freed place is taken again")
        .unwrap();
}

#[tokio::test]
async fn a_resolver_takes_the_port_it_is_asked_for_when_free() {
    let firewall: Arc<dyn Firewall> = Arc::new(Recorded::default());
    let upstream = vec!["127.0.0.1:9".parse().unwrap()];
    let first = Resolver::bind(upstream.clone(), firewall.clone())
        .await
        .unwrap();
    let port = first.port();
    // Taken: another port.
    let second = Resolver::bind_preferring(Some(port), upstream.clone(), firewall.clone())
        .await
        .unwrap();
    assert_ne!(second.port(), port);
    // Free again (the earlier agent gone): the same port.
    drop(first);
    let third = Resolver::bind_preferring(Some(port), upstream, firewall)
        .await
        .unwrap();
    assert_eq!(third.port(), port);
}
