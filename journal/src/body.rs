//! How delivery bodies are stored: zstd-compressed, level 1. Webhook payloads are repetitive
//! JSON (URLs, repository and sender objects) that shrinks several times over, and every byte
//! not written is a byte the writer thread does not copy into the WAL, fsync, and checkpoint
//! again into the database. Compression happens on the caller's thread, beside the handler,
//! not on the writer. Reads give back the exact bytes GitHub signed.

/// zstd's fastest standard level: the gain over level 3 in size is small for payloads this
/// size, and the writer is what the hot path waits on, not the CPU of the request tasks.
const LEVEL: i32 = 1;

/// A body is never stored larger than the receiver accepts; decoding refuses anything that
/// claims to expand past it.
const MAX_DECODED_BYTES: usize = 32 * 1024 * 1024;

thread_local! {
    /// One compression context per thread: creating one costs more than compressing a body.
    static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// The stored form of `body`.
pub(crate) fn encode(body: &[u8]) -> std::io::Result<Vec<u8>> {
    COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let compressor = match slot.as_mut() {
            Some(compressor) => compressor,
            None => slot.insert(zstd::bulk::Compressor::new(LEVEL)?),
        };
        compressor.compress(body)
    })
}

/// The exact body back from its stored form.
pub(crate) fn decode(stored: &[u8]) -> std::io::Result<Vec<u8>> {
    zstd::bulk::decompress(stored, MAX_DECODED_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_round_trip_exactly_and_real_payloads_shrink() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/webhooks");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "json") {
                let body = std::fs::read(&path).unwrap();
                let stored = encode(&body).unwrap();
                assert_eq!(decode(&stored).unwrap(), body, "{}", path.display());
                if body.len() > 4096 {
                    assert!(
                        stored.len() * 2 < body.len(),
                        "{}: {} -> {}",
                        path.display(),
                        body.len(),
                        stored.len()
                    );
                }
            }
        }
        for body in [&b""[..], b"{}", &[0u8, 255, 7][..]] {
            assert_eq!(decode(&encode(body).unwrap()).unwrap(), body);
        }
    }

    #[test]
    fn a_damaged_stored_body_is_an_error_not_a_panic() {
        let mut stored = encode(br#"{"action":"queued"}"#).unwrap();
        stored.truncate(stored.len() / 2);
        assert!(decode(&stored).is_err());
        assert!(decode(b"not zstd").is_err());
    }
}
