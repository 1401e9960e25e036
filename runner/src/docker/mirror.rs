//! The pull-through registry mirror of a runner's daemon (`policy.docker_registry_mirror`):
//! the mirror's URL as dockerd must address it, and the flags that say so ([`daemon_mirror`],
//! pure). Written for the host's loopback (`http://127.0.0.1:5000`); the daemon is elsewhere:
//!
//! - dockerd runs in rootlesskit's child network namespace, behind slirp4netns started with
//!   `--disable-host-loopback`: its `127.0.0.1` is its own loopback, and slirp4netns refuses
//!   its gateway's (`10.0.2.2`) way to the loopback of the namespace it runs in.
//! - slirp4netns makes its outgoing connections in the runner's network namespace
//!   (`host.network = "private"`), where the host is the host end of the runner's veth. The
//!   host's table rewrites a runner's connection to that address on a `host.network_host_ports`
//!   port to the host's `127.0.0.1` (`crate::network::host_table`), which the configuration
//!   requires of the mirror's port. So the daemon gets the veth's host end, the same port.
//!   Measured (`agent/tests/host/runner_docker.rs`, the mirror test): with the rewritten URL a
//!   pull goes through the mirror; with `http://127.0.0.1:PORT` as written the daemon never
//!   reaches it and falls back to Docker Hub.
//!   (The runner's own table rewrites the namespace's `127.0.0.1:PORT` the same way, but only
//!   for connections made from that namespace's loopback, which slirp4netns's are not.)
//! - Under `host.network = "host"` there is no runner namespace: slirp4netns connects from the
//!   host's, and the URL is used as written (a loopback one is unreachable there, see
//!   [`daemon_mirror`]).

use std::net::Ipv4Addr;

/// A registry mirror's URL, parsed (`policy.docker_registry_mirror`): `http(s)://HOST[:PORT][/]`,
/// what dockerd's `--registry-mirror` takes (no path, user or query).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryMirror {
    /// `https://`; otherwise `http://`.
    pub https: bool,
    /// The host as written: a name, an IPv4 address, or an IPv6 one in brackets.
    pub host: String,
    /// The port written, or the scheme's (80, 443).
    pub port: u16,
}

impl RegistryMirror {
    /// Whether the host is this machine's loopback (`localhost`, 127.0.0.0/8, `[::1]`).
    pub fn is_loopback(&self) -> bool {
        is_loopback_host(&self.host)
    }

    /// `http(s)://HOST:PORT`.
    pub fn url(&self) -> String {
        format!(
            "{}://{}:{}",
            if self.https { "https" } else { "http" },
            self.host,
            self.port
        )
    }
}

/// `localhost`, an IPv4 address in 127.0.0.0/8, or `[::1]`, as [`http::Uri::host`] gives them.
pub fn is_loopback_host(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return v6
            .parse::<std::net::Ipv6Addr>()
            .is_ok_and(|ip| ip.is_loopback());
    }
    host.parse::<std::net::Ipv4Addr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// Where the daemon's slirp4netns connects from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The runner's own network namespace; the host is `host_end` there
    /// (`network::addresses(..).host` of the runner's uid).
    Private { host_end: Ipv4Addr },
    /// The host's network namespace.
    Host,
}

/// The mirror as the daemon is told it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonMirror {
    /// `--registry-mirror`.
    pub url: String,
    /// `--insecure-registry`, for an `https://` mirror whose host was rewritten: its
    /// certificate names the host as written (`127.0.0.1`, `localhost`), never the veth's
    /// address, and dockerd verifies names only of registries not marked insecure (it marks
    /// 127.0.0.0/8 so by itself). The connection never leaves the machine (veth, then the
    /// host's loopback). `None` for `http://`: dockerd speaks plain HTTP to a mirror whose URL
    /// says `http://` without being told (measured: `agent/tests/host/runner_docker.rs`).
    pub insecure: Option<String>,
}

/// The mirror as the daemon must address it. Pure.
///
/// In a private network a loopback mirror (the configuration accepts only `127.0.0.1` and
/// `localhost` there) becomes the runner's host-end address with the same port. Anything else
/// stays as written.
pub fn daemon_mirror(mirror: &RegistryMirror, route: Route) -> DaemonMirror {
    match route {
        Route::Private { host_end } if mirror.is_loopback() => {
            let rewritten = RegistryMirror {
                host: host_end.to_string(),
                ..mirror.clone()
            };
            DaemonMirror {
                url: rewritten.url(),
                insecure: mirror.https.then(|| format!("{host_end}:{}", mirror.port)),
            }
        }
        _ => DaemonMirror {
            url: mirror.url(),
            insecure: None,
        },
    }
}

/// dockerd's flags for `mirror`. Pure.
pub(crate) fn mirror_flags(mirror: &DaemonMirror) -> Vec<String> {
    let mut flags = vec!["--registry-mirror".to_owned(), mirror.url.clone()];
    if let Some(insecure) = &mirror.insecure {
        flags.push("--insecure-registry".to_owned());
        flags.push(insecure.clone());
    }
    flags
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mirror(https: bool, host: &str, port: u16) -> RegistryMirror {
        RegistryMirror {
            https,
            host: host.to_owned(),
            port,
        }
    }

    #[test]
    fn a_loopback_mirror_is_the_runners_host_end_in_a_private_network() {
        let private = Route::Private {
            host_end: Ipv4Addr::new(10, 213, 12, 1),
        };
        let cases = [
            (
                mirror(false, "127.0.0.1", 5000),
                private,
                "http://10.213.12.1:5000",
                None,
            ),
            (
                mirror(false, "localhost", 5000),
                private,
                "http://10.213.12.1:5000",
                None,
            ),
            (
                mirror(false, "LocalHost", 80),
                private,
                "http://10.213.12.1:80",
                None,
            ),
            (
                mirror(true, "127.0.0.1", 5443),
                private,
                "https://10.213.12.1:5443",
                Some("10.213.12.1:5443"),
            ),
            // Not the host's loopback: as written (the configuration refuses it in a private
            // network; a host network takes any URL).
            (
                mirror(true, "mirror.example", 443),
                private,
                "https://mirror.example:443",
                None,
            ),
            (
                mirror(false, "127.0.0.1", 5000),
                Route::Host,
                "http://127.0.0.1:5000",
                None,
            ),
            (
                mirror(true, "mirror.example", 8443),
                Route::Host,
                "https://mirror.example:8443",
                None,
            ),
            (
                mirror(false, "[::1]", 5000),
                Route::Host,
                "http://[::1]:5000",
                None,
            ),
        ];
        for (written, route, url, insecure) in cases {
            let got = daemon_mirror(&written, route);
            assert_eq!(
                got,
                DaemonMirror {
                    url: url.to_owned(),
                    insecure: insecure.map(str::to_owned),
                },
                "{written:?} {route:?}"
            );
        }
    }

    #[test]
    fn the_flags_name_the_mirror_and_an_insecure_one() {
        let plain = DaemonMirror {
            url: "http://10.213.0.1:5000".to_owned(),
            insecure: None,
        };
        assert_eq!(
            mirror_flags(&plain),
            ["--registry-mirror", "http://10.213.0.1:5000"]
        );
        let tls = DaemonMirror {
            url: "https://10.213.0.1:5443".to_owned(),
            insecure: Some("10.213.0.1:5443".to_owned()),
        };
        assert_eq!(
            mirror_flags(&tls),
            [
                "--registry-mirror",
                "https://10.213.0.1:5443",
                "--insecure-registry",
                "10.213.0.1:5443"
            ]
        );
    }
}
