//! Durations in the configuration are strings such as `"30s"`, `"5m"` or `"7d"`.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A duration written as a string in the configuration file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigDuration(pub Duration);

impl<'de> Deserialize<'de> for ConfigDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_duration(&text)
            .map(ConfigDuration)
            .map_err(|err| {
                serde::de::Error::custom(format!(
                    "`{text}` is not a duration ({err}); write it like \"30s\", \"5m\" or \"7d\""
                ))
            })
    }
}
