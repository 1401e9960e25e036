//! The relay stream's Server-Sent Events framing, pure and bounded: bytes in, whole events out,
//! and never more than [`MAX_EVENT_BYTES`] held for one event. The relay is not trusted to end
//! its events (a hostile relay, or anyone on a path over plain HTTP, can send one endless line
//! or endless `data:` lines), so the parser refuses an event past the cap instead of buffering
//! it, and the subscription drops the connection. Each byte is looked at once, so a large
//! legitimate event costs time linear in its size (a parser that rescans its buffer for every
//! chunk would spend minutes on one 30 MiB line).
//!
//! Framing per the HTML living standard (`text/event-stream`): lines end in CRLF, LF or CR; a
//! blank line dispatches; `:` starts a comment; `field: value` with one optional space after
//! the colon. Only `event`, `id` and `data` are kept; the stream's own reconnection time
//! (`retry`) is ignored: [`super::Backoff`] decides.

/// The most bytes one event may take on the wire (its field lines, terminators excluded),
/// comments and the lines of fields that are ignored included.
///
/// The largest legitimate event is a delivery at the receiver's body cap: 25 MiB of body is
/// 34,952,536 bytes in base64 (4/3), inside a JSON document with the headers GitHub sends (a
/// few KiB). 48 MiB leaves room for that and for growth of the headers; anything longer is not
/// a delivery rm-relay could have stored.
pub(crate) const MAX_EVENT_BYTES: usize = 48 * 1024 * 1024;

// The cap must hold a delivery at the receiver's body cap, base64-encoded, with its headers.
const _: () = assert!((25 * 1024 * 1024_usize).div_ceil(3) * 4 + 1024 * 1024 < MAX_EVENT_BYTES);

/// One dispatched event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Event {
    /// The `event:` field; `message` when the event named none.
    pub event: String,
    /// The last `id:` field seen on the stream (ids persist across events, as the standard says).
    pub id: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

/// Why the stream cannot be read further.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(super) enum SseError {
    #[error(
        "the relay sent an event longer than {limit} bytes (the largest delivery is about 34 MiB); the connection is dropped"
    )]
    TooLarge { limit: usize },
    #[error("the relay stream is not UTF-8")]
    NotUtf8,
}

/// The parser's state between chunks.
#[derive(Debug)]
pub(super) struct Parser {
    limit: usize,
    /// The line being read, without its terminator.
    line: Vec<u8>,
    /// Bytes of the current event so far: its finished lines and `line`.
    event_bytes: usize,
    /// The last byte seen was a CR: an LF right after it ends nothing more.
    after_cr: bool,
    /// Nothing read yet: a leading byte-order mark is dropped.
    at_start: bool,
    event: String,
    data: String,
    has_data: bool,
    last_id: String,
}

impl Default for Parser {
    fn default() -> Self {
        Self::with_limit(MAX_EVENT_BYTES)
    }
}

impl Parser {
    /// A parser that refuses events over `limit` bytes.
    pub(super) fn with_limit(limit: usize) -> Self {
        Self {
            limit,
            line: Vec::new(),
            event_bytes: 0,
            after_cr: false,
            at_start: true,
            event: String::new(),
            data: String::new(),
            has_data: false,
            last_id: String::new(),
        }
    }

    /// Reads one chunk; the events it completed, in order. After an `Err` the stream is
    /// unusable and the parser must be dropped with the connection.
    pub(super) fn push(&mut self, mut chunk: &[u8]) -> Result<Vec<Event>, SseError> {
        const BOM: &[u8] = "\u{feff}".as_bytes();
        let mut events = Vec::new();
        if self.at_start && !chunk.is_empty() {
            // A BOM split over chunks is not worth handling: rm-relay never sends one.
            chunk = chunk.strip_prefix(BOM).unwrap_or(chunk);
            self.at_start = false;
        }
        while !chunk.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if chunk[0] == b'\n' {
                    chunk = &chunk[1..];
                    continue;
                }
            }
            match chunk.iter().position(|b| *b == b'\n' || *b == b'\r') {
                Some(end) => {
                    self.take(&chunk[..end])?;
                    self.after_cr = chunk[end] == b'\r';
                    chunk = &chunk[end + 1..];
                    let line = std::mem::take(&mut self.line);
                    if let Some(event) = self.end_line(&line)? {
                        events.push(event);
                    }
                    // Keep the allocation for the next line.
                    self.line = line;
                    self.line.clear();
                }
                None => {
                    self.take(chunk)?;
                    chunk = &[];
                }
            }
        }
        Ok(events)
    }

    /// Appends part of a line, within the cap.
    fn take(&mut self, part: &[u8]) -> Result<(), SseError> {
        self.event_bytes = self.event_bytes.saturating_add(part.len());
        if self.event_bytes > self.limit {
            return Err(SseError::TooLarge { limit: self.limit });
        }
        self.line.extend_from_slice(part);
        Ok(())
    }

    /// One whole line: a field, a comment, or the blank line that dispatches.
    fn end_line(&mut self, line: &[u8]) -> Result<Option<Event>, SseError> {
        if line.is_empty() {
            self.event_bytes = 0;
            return Ok(self.dispatch());
        }
        let line = std::str::from_utf8(line).map_err(|_| SseError::NotUtf8)?;
        if line.starts_with(':') {
            return Ok(None);
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => value.clone_into(&mut self.event),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "id" if !value.contains('\0') => value.clone_into(&mut self.last_id),
            _ => {}
        }
        Ok(None)
    }

    fn dispatch(&mut self) -> Option<Event> {
        let event = std::mem::take(&mut self.event);
        let data = std::mem::take(&mut self.data);
        if !std::mem::take(&mut self.has_data) {
            return None;
        }
        Some(Event {
            event: if event.is_empty() {
                "message".to_owned()
            } else {
                event
            },
            id: self.last_id.clone(),
            data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(parser: &mut Parser, chunks: &[&[u8]]) -> Vec<Event> {
        chunks
            .iter()
            .flat_map(|c| parser.push(c).expect("parsed"))
            .collect()
    }

    #[test]
    fn events_come_whole_whatever_the_chunking_and_line_endings() {
        let stream: &[u8] = b"\xef\xbb\xbf: keepalive\n\nevent: delivery\r\nid: 7\r\ndata: {\"a\":\r\ndata:1}\r\n\r\nevent: delivery\rid: 8\rdata: x\r\r";
        let whole = all(&mut Parser::default(), &[stream]);
        let expected = vec![
            Event {
                event: "delivery".into(),
                id: "7".into(),
                data: "{\"a\":\n1}".into(),
            },
            Event {
                event: "delivery".into(),
                id: "8".into(),
                data: "x".into(),
            },
        ];
        assert_eq!(whole, expected);
        // Byte by byte: a CR and its LF in different chunks end one line, not two.
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(all(&mut Parser::default(), &bytes), expected);
    }

    #[test]
    fn comments_and_empty_events_dispatch_nothing_and_ids_persist() {
        let mut parser = Parser::default();
        let events = all(&mut parser, &[b"id: 3\n\n: hi\n\ndata\n\n"]);
        assert_eq!(
            events,
            vec![Event {
                event: "message".into(),
                id: "3".into(),
                data: String::new(),
            }]
        );
    }

    #[test]
    fn an_event_past_the_cap_is_refused_even_without_a_line_end() {
        let mut parser = Parser::with_limit(64);
        assert!(parser.push(b"event: delivery\nid: 1\n").is_ok());
        let endless = [b'a'; 16];
        let mut refused = None;
        for n in 0..10 {
            if let Err(err) = parser.push(&endless) {
                refused = Some((n, err));
                break;
            }
        }
        let (n, err) = refused.expect("refused within the cap");
        assert_eq!(err, SseError::TooLarge { limit: 64 });
        assert!(n <= 4, "refused after {n} chunks");
        assert!(parser.line.len() <= 64);
    }

    #[test]
    fn endless_short_data_lines_are_one_event_and_capped_too() {
        let mut parser = Parser::with_limit(64);
        let refused = (0..100).find_map(|_| parser.push(b"data: x\n").err());
        assert_eq!(refused, Some(SseError::TooLarge { limit: 64 }));
        assert!(parser.data.len() <= 64);
    }

    #[test]
    fn the_cap_counts_per_event_so_many_events_pass() {
        let mut parser = Parser::with_limit(64);
        for _ in 0..100 {
            let events = parser
                .push(b"event: delivery\nid: 1\ndata: xyz\n\n")
                .expect("fits");
            assert_eq!(events.len(), 1);
        }
    }

    #[test]
    fn a_delivery_at_the_receivers_body_cap_passes() {
        // 25 MiB of body in base64, inside the relay's JSON with headers.
        let data_len = (25 * 1024 * 1024_usize).div_ceil(3) * 4 + 8 * 1024;
        let mut parser = Parser::default();
        assert!(
            parser
                .push(b"event: delivery\nid: 9\ndata: ")
                .expect("head")
                .is_empty()
        );
        let chunk = vec![b'A'; 64 * 1024];
        let mut left = data_len;
        while left > 0 {
            let n = left.min(chunk.len());
            assert!(parser.push(&chunk[..n]).expect("within the cap").is_empty());
            left -= n;
        }
        let events = parser.push(b"\n\n").expect("end");
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].data.len(), data_len);
        assert_eq!(events[0].id, "9");
    }
}
