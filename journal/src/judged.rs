//! What the intake records: a delivery with its verdict already judged and the columns the
//! journal stores already encoded ([`Judged`]). Judging (the handler's parse of a body of up to
//! 25 MiB) and encoding (its zstd) are CPU work: the caller does them, where it chooses (the
//! receiver: inline for a small body, on the blocking pool for a large one), and the writer
//! threads of both journals only do SQL.

use rm_handlers::Verdict;

use crate::{Incoming, JournalError, body};

/// A delivery ready for the journal's writer: its verdict, and its body and headers encoded.
pub struct Judged {
    pub(crate) incoming: Incoming,
    pub(crate) verdict: Verdict,
    pub(crate) stored: Stored,
}

/// A delivery's columns encoded before the writer sees them.
pub(crate) struct Stored {
    /// The zstd-compressed body.
    pub(crate) body: Vec<u8>,
    /// The kept headers as a JSON object.
    pub(crate) headers: String,
}

impl Judged {
    /// `incoming` with the `verdict` its handler gave ([`rm_handlers::judge`]). A body that is
    /// not JSON at all is refused with [`JournalError::NotJson`] (nothing is written): the
    /// handler's parse is the only one, and only a rejected body is read a second time, to
    /// tell "not JSON" from "JSON a handler cannot use".
    pub fn new(incoming: Incoming, verdict: Verdict) -> Result<Judged, JournalError> {
        if matches!(verdict, Verdict::Reject { .. }) && !rm_handlers::is_json(&incoming.body) {
            return Err(JournalError::NotJson);
        }
        let stored = Stored {
            body: body::encode(&incoming.body)
                .map_err(|err| JournalError::Commit(format!("cannot compress the body: {err}")))?,
            headers: encode_headers(&incoming.headers),
        };
        Ok(Judged {
            incoming,
            verdict,
            stored,
        })
    }

    /// Judges `incoming` with its event's handler, here, and encodes it: CPU work in proportion
    /// to the body, so a caller on an async worker does it only for a small body.
    pub fn of(incoming: Incoming) -> Result<Judged, JournalError> {
        let verdict = rm_handlers::judge(&incoming.delivery());
        Judged::new(incoming, verdict)
    }

    /// The delivery as it arrived.
    pub fn incoming(&self) -> &Incoming {
        &self.incoming
    }
}

/// The kept headers as the journal's `headers` column holds them: one JSON object.
fn encode_headers(headers: &[(String, String)]) -> String {
    let object: serde_json::Map<String, serde_json::Value> = headers
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    serde_json::Value::Object(object).to_string()
}
