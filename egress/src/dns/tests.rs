use super::*;

/// A message built for a test: a header and the sections' bytes as given.
struct Msg {
    bytes: Vec<u8>,
}

impl Msg {
    /// A header: id, flags, then QD/AN/NS/AR counts.
    fn header(id: u16, flags: u16, counts: [u16; 4]) -> Msg {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&id.to_be_bytes());
        bytes.extend_from_slice(&flags.to_be_bytes());
        for count in counts {
            bytes.extend_from_slice(&count.to_be_bytes());
        }
        Msg { bytes }
    }

    /// A standard query (RD set) for `name` of `qtype`, class IN.
    fn query(id: u16, name: &str, qtype: u16) -> Msg {
        Msg::header(id, 0x0100, [1, 0, 0, 0])
            .name(name)
            .u16(qtype)
            .u16(1)
    }

    /// A response (QR, RD, RA) with `answers` records to come.
    fn response(id: u16, rcode: u16, name: &str, qtype: u16, answers: u16) -> Msg {
        Msg::header(id, 0x8180 | rcode, [1, answers, 0, 0])
            .name(name)
            .u16(qtype)
            .u16(1)
    }

    /// A name, uncompressed, labels as written (no escaping: a test writes what it means).
    fn name(self, name: &str) -> Msg {
        let mut msg = self;
        for label in name.split('.').filter(|l| !l.is_empty()) {
            msg.bytes.push(label.len() as u8);
            msg.bytes.extend_from_slice(label.as_bytes());
        }
        msg.bytes.push(0);
        msg
    }

    fn raw(mut self, bytes: &[u8]) -> Msg {
        self.bytes.extend_from_slice(bytes);
        self
    }

    fn u16(self, value: u16) -> Msg {
        self.raw(&value.to_be_bytes())
    }

    fn pointer(self, to: u16) -> Msg {
        self.u16(0xc000 | to)
    }

    /// A record after its owner name: type, class, TTL and rdata.
    fn record(self, rtype: u16, class: u16, ttl: u32, rdata: &[u8]) -> Msg {
        self.u16(rtype)
            .u16(class)
            .raw(&ttl.to_be_bytes())
            .u16(rdata.len() as u16)
            .raw(rdata)
    }
}

fn query(name: &str, qtype: u16) -> Query {
    parse_query(&Msg::query(0x1234, name, qtype).bytes).unwrap()
}

#[test]
fn queries_are_read() {
    let q = parse_query(&Msg::query(0xbeef, "Public.RM-e2e.test", 1).bytes).unwrap();
    assert_eq!(
        q,
        Query {
            id: 0xbeef,
            name: "public.rm-e2e.test".to_string(),
            qtype: 1,
            longest_label: 6,
        }
    );
    let root = parse_query(&Msg::query(1, "", 2).bytes).unwrap();
    assert_eq!((root.name.as_str(), root.longest_label), (".", 0));
    let label = "a".repeat(63);
    let long = parse_query(&Msg::query(1, &format!("{label}.exfil.test"), 28).bytes).unwrap();
    assert_eq!((long.longest_label, long.qtype), (63, 28));
    assert_eq!(long.name, format!("{label}.exfil.test"));
    // EDNS: an OPT record in the additional section is allowed and ignored.
    let edns = Msg::header(7, 0x0120, [1, 0, 0, 1])
        .name("github.com")
        .u16(1)
        .u16(1)
        .raw(&[0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(parse_query(&edns.bytes).unwrap().name, "github.com");
    // Printable punctuation is a label byte like any other (the allow list refuses the name).
    let odd = parse_query(&Msg::query(1, "a_b!~.test", 1).bytes).unwrap();
    assert_eq!(odd.name, "a_b!~.test");
}

#[test]
fn real_query_bytes_are_read() {
    // `dig github.com A` as dig sends it: RD and AD set, an EDNS OPT (4096 bytes) with a cookie.
    let bytes: &[u8] = &[
        0x8a, 0x4c, 0x01, 0x20, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x06, b'g', b'i',
        b't', b'h', b'u', b'b', 0x03, b'c', b'o', b'm', 0x00, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00,
        0x29, 0x04, 0xd0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0c, 0x00, 0x0a, 0x00, 0x08, 0x4e, 0x2d,
        0x95, 0x13, 0x74, 0x1e, 0x1b, 0x52,
    ];
    let q = parse_query(bytes).unwrap();
    assert_eq!(
        (q.id, q.name.as_str(), q.qtype, q.longest_label),
        (0x8a4c, "github.com", 1, 6)
    );
}

#[test]
fn queries_that_are_not_one_plain_question_are_refused() {
    let good = Msg::query(1, "a.test", 1).bytes;
    let mut cut = good.clone();
    cut.pop();
    let mut long = good.clone();
    long.resize(MAX_UDP + 1, 0);
    let mut nul = Msg::header(1, 0x0100, [1, 0, 0, 0]).raw(&[3, b'a', 0, b'b', 4]);
    nul = nul.raw(b"test").raw(&[0, 0, 1, 0, 1]);
    let dotted = Msg::header(1, 0x0100, [1, 0, 0, 0])
        .raw(&[3, b'a', b'.', b'b', 4])
        .raw(b"test")
        .raw(&[0, 0, 1, 0, 1]);
    let space = Msg::query(1, "a b.test", 1);
    let high = Msg::header(1, 0x0100, [1, 0, 0, 0])
        .raw(&[2, 0xc3, 0xbc, 0])
        .raw(&[0, 1, 0, 1]);
    let compressed = Msg::header(1, 0x0100, [1, 0, 0, 0])
        .raw(&[1, b'a'])
        .pointer(12)
        .raw(&[0, 1, 0, 1]);
    let reserved = Msg::header(1, 0x0100, [1, 0, 0, 0]).raw(&[0x41, b'a', 0, 0, 1, 0, 1]);
    let label = "a".repeat(63);
    let too_long = Msg::query(1, &[label.as_str(); 5].join("."), 1);
    let cases: Vec<(&str, Vec<u8>, DnsError)> = vec![
        ("empty", vec![], DnsError::Short),
        (
            "a header only",
            Msg::header(1, 0x0100, [1, 0, 0, 0]).bytes,
            DnsError::Short,
        ),
        ("cut", cut, DnsError::Short),
        ("too long", long, DnsError::TooLong),
        (
            "a response",
            Msg::response(1, 0, "a.test", 1, 0).bytes,
            DnsError::NotQuery,
        ),
        (
            "opcode STATUS",
            Msg::header(1, 0x1000, [1, 0, 0, 0])
                .name("a.test")
                .u16(1)
                .u16(1)
                .bytes,
            DnsError::Opcode(2),
        ),
        (
            "no question",
            Msg::header(1, 0x0100, [0, 0, 0, 0]).bytes,
            DnsError::Questions(0),
        ),
        (
            "two questions",
            Msg::header(1, 0x0100, [2, 0, 0, 0])
                .name("a.test")
                .u16(1)
                .u16(1)
                .name("b.test")
                .u16(1)
                .u16(1)
                .bytes,
            DnsError::Questions(2),
        ),
        (
            "an answer",
            Msg::header(1, 0x0100, [1, 1, 0, 0])
                .name("a.test")
                .u16(1)
                .u16(1)
                .bytes,
            DnsError::RecordsInQuery,
        ),
        (
            "an authority record",
            Msg::header(1, 0x0100, [1, 0, 1, 0])
                .name("a.test")
                .u16(1)
                .u16(1)
                .bytes,
            DnsError::RecordsInQuery,
        ),
        ("a NUL in a label", nul.bytes, DnsError::LabelByte(0)),
        ("a dot in a label", dotted.bytes, DnsError::LabelByte(b'.')),
        ("a space in a label", space.bytes, DnsError::LabelByte(b' ')),
        ("UTF-8 in a label", high.bytes, DnsError::LabelByte(0xc3)),
        ("a pointer", compressed.bytes, DnsError::CompressedQuestion),
        (
            "a reserved label type",
            reserved.bytes,
            DnsError::LabelType(0x41),
        ),
        (
            "a name over 255 bytes",
            too_long.bytes,
            DnsError::NameTooLong,
        ),
        (
            "class CH",
            Msg::header(1, 0x0100, [1, 0, 0, 0])
                .name("version.bind")
                .u16(16)
                .u16(3)
                .bytes,
            DnsError::Class(3),
        ),
        (
            "no type and class",
            Msg::header(1, 0x0100, [1, 0, 0, 0]).name("a.test").bytes,
            DnsError::Short,
        ),
    ];
    for (what, bytes, want) in cases {
        assert_eq!(parse_query(&bytes), Err(want), "{what}");
    }
}

#[test]
fn a_compressed_cname_chain_gives_every_a_record() {
    // www.example.com A: a CNAME to cdn.example.net (compressed against the question), then
    // two A records owned by the CNAME's target (a pointer to it), as a real resolver writes.
    let bytes: &[u8] = &[
        0x12, 0x34, 0x81, 0x80, 0x00, 0x01, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, // header
        // 12: question www.example.com A IN
        0x03, b'w', b'w', b'w', 0x07, b'e', b'x', b'a', b'm', b'p', b'l', b'e', 0x03, b'c', b'o',
        b'm', 0x00, 0x00, 0x01, 0x00, 0x01, //
        // 33: CNAME, owner -> 12, TTL 300, rdata cdn.example + "net" (8 + 4 + 5 = 17 bytes)
        0xc0, 0x0c, 0x00, 0x05, 0x00, 0x01, 0x00, 0x00, 0x01, 0x2c, 0x00, 0x11, //
        // 45: cdn.example.net
        0x03, b'c', b'd', b'n', 0x07, b'e', b'x', b'a', b'm', b'p', b'l', b'e', 0x03, b'n', b'e',
        b't', 0x00, //
        // A, owner -> 45, TTL 60, 93.184.216.34
        0xc0, 0x2d, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x3c, 0x00, 0x04, 93, 184, 216,
        34, //
        // A, owner -> 45, TTL 30, 93.184.216.35
        0xc0, 0x2d, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x1e, 0x00, 0x04, 93, 184, 216, 35,
    ];
    let q = Query {
        id: 0x1234,
        name: "www.example.com".to_string(),
        qtype: 1,
        longest_label: 7,
    };
    let answer = parse_answer(bytes, &q).unwrap();
    assert_eq!(
        answer,
        Answer {
            id: 0x1234,
            rcode: NOERROR,
            truncated: false,
            a: vec![
                (Ipv4Addr::new(93, 184, 216, 34), 60),
                (Ipv4Addr::new(93, 184, 216, 35), 30)
            ],
        }
    );
    // Any cut of it is refused, never read past.
    for len in 0..bytes.len() {
        assert!(parse_answer(&bytes[..len], &q).is_err(), "cut at {len}");
    }
}

#[test]
fn answers_keep_only_a_records_of_the_answer_section() {
    let q = query("a.test", 1);
    let msg = Msg::response(0x1234, 0, "A.Test", 1, 5)
        .pointer(12)
        .record(1, 1, 10, &[203, 0, 113, 11])
        // An AAAA, an A of class CH and an A of the wrong length: not addresses.
        .pointer(12)
        .record(28, 1, 10, &[0; 16])
        .pointer(12)
        .record(1, 3, 10, &[203, 0, 113, 12])
        .pointer(12)
        .record(1, 1, 10, &[203, 0, 113, 13, 0])
        // A TTL with its top bit set is 0 (RFC 2181 8).
        .name("b.test")
        .record(1, 1, 0x8000_0000, &[203, 0, 113, 14])
        // Not read: the authority and additional sections (counts left 0 above, bytes here).
        .name("c.test")
        .record(1, 1, 10, &[203, 0, 113, 15]);
    let answer = parse_answer(&msg.bytes, &q).unwrap();
    assert_eq!(
        answer.a,
        [
            (Ipv4Addr::new(203, 0, 113, 11), 10),
            (Ipv4Addr::new(203, 0, 113, 14), 0)
        ]
    );
    let nx = Msg::response(0x1234, 3, "a.test", 1, 0);
    let nx = parse_answer(&nx.bytes, &q).unwrap();
    assert_eq!((nx.rcode, nx.truncated, nx.a.len()), (NXDOMAIN, false, 0));
    let tc = Msg::header(0x1234, 0x8380, [1, 0, 0, 0])
        .name("a.test")
        .u16(1)
        .u16(1);
    assert!(parse_answer(&tc.bytes, &q).unwrap().truncated);
}

#[test]
fn answers_to_another_question_or_malformed_are_refused() {
    let q = query("a.test", 1);
    // 24: a label then a pointer back to it: backwards, but a loop.
    let back_loop = Msg::response(0x1234, 0, "a.test", 1, 1)
        .raw(&[1, b'x'])
        .pointer(24)
        .record(1, 1, 10, &[1, 2, 3, 4]);
    let forward = Msg::response(0x1234, 0, "a.test", 1, 1)
        .pointer(200)
        .record(1, 1, 10, &[1, 2, 3, 4]);
    let to_itself =
        Msg::response(0x1234, 0, "a.test", 1, 1)
            .pointer(24)
            .record(1, 1, 10, &[1, 2, 3, 4]);
    let cut_rdata = Msg::response(0x1234, 0, "a.test", 1, 1)
        .pointer(12)
        .u16(1)
        .u16(1)
        .raw(&[0, 0, 0, 10])
        .u16(4)
        .raw(&[1, 2]);
    let missing_record =
        Msg::response(0x1234, 0, "a.test", 1, 2)
            .pointer(12)
            .record(1, 1, 10, &[1, 2, 3, 4]);
    let cases: Vec<(&str, Vec<u8>, DnsError)> = vec![
        (
            "another id",
            Msg::response(0x4321, 0, "a.test", 1, 0).bytes,
            DnsError::Id {
                expected: 0x1234,
                got: 0x4321,
            },
        ),
        (
            "a query",
            Msg::query(0x1234, "a.test", 1).bytes,
            DnsError::NotResponse,
        ),
        (
            "another name",
            Msg::response(0x1234, 0, "b.test", 1, 0).bytes,
            DnsError::Question,
        ),
        (
            "a longer name",
            Msg::response(0x1234, 0, "a.test.evil", 1, 0).bytes,
            DnsError::Question,
        ),
        (
            "another type",
            Msg::response(0x1234, 0, "a.test", 28, 0).bytes,
            DnsError::Question,
        ),
        (
            "another class",
            Msg::header(0x1234, 0x8180, [1, 0, 0, 0])
                .name("a.test")
                .u16(1)
                .u16(3)
                .bytes,
            DnsError::Question,
        ),
        (
            "no question",
            Msg::header(0x1234, 0x8180, [0, 0, 0, 0]).bytes,
            DnsError::Questions(0),
        ),
        (
            "opcode NOTIFY",
            Msg::header(0x1234, 0xa180, [1, 0, 0, 0])
                .name("a.test")
                .u16(1)
                .u16(1)
                .bytes,
            DnsError::Opcode(4),
        ),
        ("a loop backwards", back_loop.bytes, DnsError::BadPointer),
        ("a pointer forwards", forward.bytes, DnsError::BadPointer),
        ("a pointer to itself", to_itself.bytes, DnsError::BadPointer),
        ("cut rdata", cut_rdata.bytes, DnsError::Short),
        (
            "fewer records than counted",
            missing_record.bytes,
            DnsError::Short,
        ),
        (
            "a header only",
            Msg::header(0x1234, 0x8180, [1, 0, 0, 0]).bytes,
            DnsError::Short,
        ),
    ];
    for (what, bytes, want) in cases {
        assert_eq!(parse_answer(&bytes, &q), Err(want), "{what}");
    }
}

/// A response to a.test A whose first record (a TXT) holds a chain of `parts` name parts in its
/// rdata, each a label and a pointer to the part before (the first to the question's name), and
/// whose second record, an A, is owned by the last part: `parts + 1` jumps, all backwards.
fn chain(parts: u16) -> Vec<u8> {
    // The TXT's rdata begins at 36: header 12, question 12, owner pointer 2, fixed fields 10.
    let mut rdata = Vec::new();
    let mut previous = 12;
    for part in 0..parts {
        rdata.extend_from_slice(&[1, b'x', 0xc0 | (previous >> 8) as u8, previous as u8]);
        previous = 36 + 4 * part;
    }
    Msg::response(0x1234, 0, "a.test", 1, 2)
        .pointer(12)
        .record(16, 1, 10, &rdata)
        .pointer(previous)
        .record(1, 1, 10, &[1, 2, 3, 4])
        .bytes
}

#[test]
fn pointer_chains_are_bounded() {
    let q = query("a.test", 1);
    // 63 parts: 64 jumps, the most followed.
    assert_eq!(
        parse_answer(&chain(63), &q).unwrap().a,
        [(Ipv4Addr::new(1, 2, 3, 4), 10)]
    );
    // 64 parts: one jump too many, though the name (2 bytes a part and a.test's 8) would fit
    // in 255 bytes: only the jump bound stops it.
    assert_eq!(parse_answer(&chain(64), &q), Err(DnsError::TooManyJumps));
    assert_eq!(parse_answer(&chain(120), &q), Err(DnsError::TooManyJumps));
}

#[test]
fn refusals_answer_the_question_asked() {
    // RD set, a mixed-case name (0x20 randomisation) and an EDNS OPT.
    let msg = Msg::header(0xabcd, 0x0100, [1, 0, 0, 1])
        .name("DeNied.rm-E2E.test")
        .u16(1)
        .u16(1)
        .raw(&[0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 0])
        .bytes;
    let q = parse_query(&msg).unwrap();
    let out = respond(&msg, &q, NXDOMAIN);
    let question = &msg[12..msg.len() - 11];
    assert_eq!(
        &out[..4],
        &[0xab, 0xcd, 0x81, 0x83],
        "id, QR RD RA, NXDOMAIN"
    );
    assert_eq!(
        &out[4..12],
        &[0, 1, 0, 0, 0, 0, 0, 0],
        "one question, no records"
    );
    assert_eq!(&out[12..], question, "the question byte for byte");
    let parsed = parse_answer(&out, &q).unwrap();
    assert_eq!((parsed.rcode, parsed.a.len()), (NXDOMAIN, 0));
    // RD clear stays clear.
    let plain = Msg::header(9, 0x0000, [1, 0, 0, 0])
        .name("a.test")
        .u16(28)
        .u16(1)
        .bytes;
    let q = parse_query(&plain).unwrap();
    let out = respond(&plain, &q, REFUSED);
    assert_eq!(&out[2..4], &[0x80, 0x85]);
    assert_eq!(parse_answer(&out, &q).unwrap().rcode, REFUSED);
    // SERVFAIL, and a message that no longer reads (never after parse_query): the question
    // is written from the query.
    let out = respond(&[], &q, SERVFAIL);
    assert_eq!(parse_answer(&out, &q).unwrap().rcode, SERVFAIL);
    let root = parse_query(&Msg::query(3, "", 2).bytes).unwrap();
    let out = respond(&[], &root, SERVFAIL);
    assert_eq!(parse_answer(&out, &root).unwrap().id, 3);
}

#[test]
fn tcp_frames_carry_the_length() {
    assert_eq!(frame(&[]), [0, 0]);
    assert_eq!(frame(&[1, 2, 3]), [0, 3, 1, 2, 3]);
    let big = vec![7; 300];
    let framed = frame(&big);
    assert_eq!(&framed[..2], &[1, 44]);
    assert_eq!(&framed[2..], &big[..]);
    let huge = vec![0; 70_000];
    let framed = frame(&huge);
    assert_eq!((&framed[..2], framed.len()), (&[0xff, 0xff][..], 65_537));
}

#[test]
fn no_input_makes_the_readers_panic() {
    // Every message of a few bytes, and every one-byte change of real messages: whatever
    // they read as, they are read without a panic, and an answer's addresses come from
    // records that are there.
    let q = query("a.test", 1);
    let base = Msg::response(0x1234, 0, "a.test", 1, 2)
        .pointer(12)
        .record(5, 1, 10, &[1, b'b', 0xc0, 12])
        .raw(&[1, b'b'])
        .pointer(12)
        .record(1, 1, 10, &[1, 2, 3, 4])
        .bytes;
    assert_eq!(parse_answer(&base, &q).unwrap().a.len(), 1);
    for at in 0..base.len() {
        for value in [0x00, 0x01, 0x3f, 0x40, 0xc0, 0xc1, 0xff] {
            let mut changed = base.clone();
            changed[at] = value;
            if let Ok(answer) = parse_answer(&changed, &q) {
                assert!(answer.a.len() <= 2);
            }
            let _ = parse_query(&changed);
        }
    }
    for len in 0..16 {
        for fill in [0x00, 0x01, 0xc0, 0xff] {
            let msg = vec![fill; len];
            assert!(parse_query(&msg).is_err(), "{len} bytes of {fill:#x}");
        }
    }
}
