//! Where a delivery or a job sighting entered rm: recorded with the delivery and on the jobs it
//! touches, by name in the journal and in `--json` output.

/// Where a delivery entered rm. Recorded with the delivery and on the jobs it touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Straight from GitHub to this host's receiver.
    Webhook,
    /// Through an `rm-relay` subscription.
    Relay,
    /// Found by the REST polling fallback.
    Poll,
    /// A failed delivery that the agent asked GitHub to send again.
    Redelivery,
}

impl Source {
    /// The stable name used in the journal and in `--json` output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Webhook => "webhook",
            Self::Relay => "relay",
            Self::Poll => "poll",
            Self::Redelivery => "redelivery",
        }
    }

    /// The inverse of [`Source::as_str`].
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Webhook, Self::Relay, Self::Poll, Self::Redelivery]
            .into_iter()
            .find(|s| s.as_str() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::Source;

    #[test]
    fn sources_round_trip() {
        for source in [
            Source::Webhook,
            Source::Relay,
            Source::Poll,
            Source::Redelivery,
        ] {
            assert_eq!(Source::parse(source.as_str()), Some(source));
        }
    }
}
