//! DNS messages (RFC 1035 4.1) as the egress resolver reads and writes them: a runner's query
//! ([`parse_query`]), the upstream's answer to it ([`parse_answer`]), the resolver's own
//! refusals ([`respond`]) and DNS over TCP's framing ([`frame`]).
//!
//! Both ends are untrusted: the query is a job's (which may be hostile) and the answer comes
//! over the network. Every read is bounds-checked, names are at most 255 bytes, compression
//! pointers are followed only backwards and at most [`MAX_JUMPS`] times, and nothing here
//! panics or allocates more than the message's own size on any input.

use std::net::Ipv4Addr;

/// The largest message read: a UDP datagram over this is cut, and a query over this refused.
/// 4096 is the EDNS buffer size resolvers advertise by default.
pub const MAX_UDP: usize = 4096;

/// The most compression pointers followed in one name: more is a loop or an attack (a name
/// has at most 127 labels, and real answers point once or twice).
pub const MAX_JUMPS: usize = 64;

/// The longest name on the wire, its length bytes and the root's zero included (RFC 1035
/// 2.3.4).
const MAX_NAME_WIRE: usize = 255;

/// The header's size.
const HEADER: usize = 12;

/// Record type A and class IN.
const TYPE_A: u16 = 1;
const CLASS_IN: u16 = 1;

/// Header flag bits (RFC 1035 4.1.1).
const FLAG_QR: u16 = 0x8000;
const FLAG_TC: u16 = 0x0200;
const FLAG_RD: u16 = 0x0100;
const FLAG_RA: u16 = 0x0080;
const OPCODE_SHIFT: u16 = 11;
const OPCODE_MASK: u16 = 0xf;
const RCODE_MASK: u16 = 0xf;

/// No error.
pub const NOERROR: u8 = 0;
/// The server could not answer (the upstream failed or timed out).
pub const SERVFAIL: u8 = 2;
/// The name does not exist: what a denied name is answered in enforce mode.
pub const NXDOMAIN: u8 = 3;
/// The server will not answer: an unknown runner, or one over its rate.
pub const REFUSED: u8 = 5;

/// What was wrong with a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsError {
    #[error("the message ends early")]
    Short,
    #[error("a query longer than {MAX_UDP} bytes")]
    TooLong,
    #[error("a response where a query was expected")]
    NotQuery,
    #[error("a query where a response was expected")]
    NotResponse,
    #[error("opcode {0}, only QUERY (0) is answered")]
    Opcode(u8),
    #[error("{0} questions, exactly one expected")]
    Questions(u16),
    #[error("a query that carries answer or authority records")]
    RecordsInQuery,
    #[error("a compression pointer in a query's question")]
    CompressedQuestion,
    #[error("a compression pointer that does not point backwards")]
    BadPointer,
    #[error("more than {MAX_JUMPS} compression pointers in one name")]
    TooManyJumps,
    #[error("a label of a reserved type (length byte {0:#04x})")]
    LabelType(u8),
    #[error("a label byte {0:#04x}, outside printable ASCII or a dot")]
    LabelByte(u8),
    #[error("a name longer than {MAX_NAME_WIRE} bytes")]
    NameTooLong,
    #[error("class {0}, only IN (1) is answered")]
    Class(u16),
    #[error("id {got}, the query's is {expected}")]
    Id { expected: u16, got: u16 },
    #[error("the response's question is not the query's")]
    Question,
}

/// A runner's query, as [`parse_query`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub id: u16,
    /// Lowercase, no trailing dot, `.` for the root.
    pub name: String,
    /// 1 = A, 28 = AAAA, ...
    pub qtype: u16,
    /// The longest label's length in bytes (0 for the root): the tunnelling check reads it.
    pub longest_label: usize,
}

/// An upstream's answer, as [`parse_answer`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub id: u16,
    pub rcode: u8,
    /// TC: the answer was cut to fit UDP, the client retries over TCP.
    pub truncated: bool,
    /// Every A record of the answer section, with its TTL in seconds.
    pub a: Vec<(Ipv4Addr, u32)>,
}

/// A bounds-checked reader over a message.
struct Reader<'a> {
    msg: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(msg: &'a [u8], at: usize) -> Reader<'a> {
        Reader { msg, at }
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], DnsError> {
        let end = self.at.checked_add(n).ok_or(DnsError::Short)?;
        let bytes = self.msg.get(self.at..end).ok_or(DnsError::Short)?;
        self.at = end;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, DnsError> {
        Ok(self.bytes(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DnsError> {
        let b = self.bytes(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, DnsError> {
        let b = self.bytes(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// The header's fields we read.
struct Header {
    id: u16,
    flags: u16,
    qdcount: u16,
    ancount: u16,
    nscount: u16,
}

impl Header {
    fn read(reader: &mut Reader<'_>) -> Result<Header, DnsError> {
        let header = Header {
            id: reader.u16()?,
            flags: reader.u16()?,
            qdcount: reader.u16()?,
            ancount: reader.u16()?,
            nscount: reader.u16()?,
        };
        // ARCOUNT: additional records (EDNS's OPT) are not read.
        reader.u16()?;
        Ok(header)
    }

    fn opcode(&self) -> u8 {
        // Four bits: the cast keeps them all.
        ((self.flags >> OPCODE_SHIFT) & OPCODE_MASK) as u8
    }
}

/// Whether compression pointers may be followed in a name.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pointers {
    Refused,
    Followed,
}

/// Reads the name at the reader's position, calling `label` with each label's bytes, and
/// leaves the reader after it (after its first pointer, if any). Pointers, where allowed, are
/// followed only backwards, to an offset before where the name (or the part of it last jumped
/// to) began, so each jump lands strictly earlier than the one before and no loop is possible;
/// and at most [`MAX_JUMPS`] times. The name, pointers resolved, is at most
/// [`MAX_NAME_WIRE`] bytes.
fn read_name(
    reader: &mut Reader<'_>,
    pointers: Pointers,
    mut label: impl FnMut(&[u8]) -> Result<(), DnsError>,
) -> Result<(), DnsError> {
    let msg = reader.msg;
    // Where the name goes on after a pointer; `reader` stays at the name's end in place.
    let mut at = reader.at;
    // Where the part of the name being read began: a pointer must land before it.
    let mut segment = at;
    let mut jumped = false;
    let mut jumps = 0;
    let mut wire = 0;
    loop {
        let mut here = Reader::new(msg, at);
        let len = here.u8()?;
        match len & 0xc0 {
            0x00 => {
                wire += 1 + usize::from(len);
                if wire > MAX_NAME_WIRE {
                    return Err(DnsError::NameTooLong);
                }
                if len == 0 {
                    if !jumped {
                        reader.at = here.at;
                    }
                    return Ok(());
                }
                label(here.bytes(usize::from(len))?)?;
                at = here.at;
            }
            0xc0 => {
                if pointers == Pointers::Refused {
                    return Err(DnsError::CompressedQuestion);
                }
                let low = here.u8()?;
                let target = usize::from(u16::from_be_bytes([len & 0x3f, low]));
                if target >= segment {
                    return Err(DnsError::BadPointer);
                }
                jumps += 1;
                if jumps > MAX_JUMPS {
                    return Err(DnsError::TooManyJumps);
                }
                if !jumped {
                    reader.at = here.at;
                    jumped = true;
                }
                at = target;
                segment = target;
            }
            _ => return Err(DnsError::LabelType(len)),
        }
    }
}

/// Reads a name as text: lowercase, labels joined by dots, `.` for the root; a label byte
/// outside `!`..=`~` or a dot (which would make two labels of one in the text) is refused.
/// Returns the text and the longest label's length.
fn read_name_text(
    reader: &mut Reader<'_>,
    pointers: Pointers,
) -> Result<(String, usize), DnsError> {
    let mut text = String::new();
    let mut longest = 0;
    read_name(reader, pointers, |label| {
        if let Some(&bad) = label
            .iter()
            .find(|b| !(b'!'..=b'~').contains(*b) || **b == b'.')
        {
            return Err(DnsError::LabelByte(bad));
        }
        if !text.is_empty() {
            text.push('.');
        }
        text.extend(label.iter().map(|b| char::from(b.to_ascii_lowercase())));
        longest = longest.max(label.len());
        Ok(())
    })?;
    if text.is_empty() {
        text.push('.');
    }
    Ok((text, longest))
}

/// A query: QR=0, opcode 0 (QUERY), exactly one question of class IN, no answer or authority
/// records; compression pointers in the question refused (a query has nothing before its
/// question to point at); the name rebuilt as text (labels with bytes outside `!`..=`~`, or a
/// dot, refused); additional records (EDNS OPT) allowed and ignored. A query longer than
/// [`MAX_UDP`] is refused (TCP would carry one).
pub fn parse_query(msg: &[u8]) -> Result<Query, DnsError> {
    if msg.len() > MAX_UDP {
        return Err(DnsError::TooLong);
    }
    let mut reader = Reader::new(msg, 0);
    let header = Header::read(&mut reader)?;
    if header.flags & FLAG_QR != 0 {
        return Err(DnsError::NotQuery);
    }
    if header.opcode() != 0 {
        return Err(DnsError::Opcode(header.opcode()));
    }
    if header.qdcount != 1 {
        return Err(DnsError::Questions(header.qdcount));
    }
    if header.ancount != 0 || header.nscount != 0 {
        return Err(DnsError::RecordsInQuery);
    }
    let (name, longest_label) = read_name_text(&mut reader, Pointers::Refused)?;
    let qtype = reader.u16()?;
    let qclass = reader.u16()?;
    if qclass != CLASS_IN {
        return Err(DnsError::Class(qclass));
    }
    Ok(Query {
        id: header.id,
        name,
        qtype,
        longest_label,
    })
}

/// An upstream's response to `query`: QR=1, opcode 0, the same id and the same question (name
/// case-insensitively, type, class IN) or [`DnsError`]; every A record (type 1 class 1
/// rdlength 4) of the answer section with its TTL (CNAME chains: all A records of the section
/// count, whatever their owner name; a TTL with its top bit set is 0, RFC 2181 8);
/// compression pointers followed with a bound (at most [`MAX_JUMPS`] jumps, only backwards).
/// Authority and additional sections are not read.
pub fn parse_answer(msg: &[u8], query: &Query) -> Result<Answer, DnsError> {
    let mut reader = Reader::new(msg, 0);
    let header = Header::read(&mut reader)?;
    if header.id != query.id {
        return Err(DnsError::Id {
            expected: query.id,
            got: header.id,
        });
    }
    if header.flags & FLAG_QR == 0 {
        return Err(DnsError::NotResponse);
    }
    if header.opcode() != 0 {
        return Err(DnsError::Opcode(header.opcode()));
    }
    if header.qdcount != 1 {
        return Err(DnsError::Questions(header.qdcount));
    }
    let (name, _) = read_name_text(&mut reader, Pointers::Followed)?;
    let qtype = reader.u16()?;
    let qclass = reader.u16()?;
    if name != query.name || qtype != query.qtype || qclass != CLASS_IN {
        return Err(DnsError::Question);
    }
    let mut a = Vec::new();
    for _ in 0..header.ancount {
        // Owner names are not ours to judge (a CNAME's target is any name): only their shape.
        read_name(&mut reader, Pointers::Followed, |_| Ok(()))?;
        let rtype = reader.u16()?;
        let class = reader.u16()?;
        let ttl = reader.u32()?;
        let rdlength = reader.u16()?;
        let rdata = reader.bytes(usize::from(rdlength))?;
        if rtype == TYPE_A
            && class == CLASS_IN
            && let &[a0, a1, a2, a3] = rdata
        {
            let ttl = if ttl > i32::MAX as u32 { 0 } else { ttl };
            a.push((Ipv4Addr::new(a0, a1, a2, a3), ttl));
        }
    }
    Ok(Answer {
        id: header.id,
        // Four bits: the cast keeps them all.
        rcode: (header.flags & RCODE_MASK) as u8,
        truncated: header.flags & FLAG_TC != 0,
        a,
    })
}

/// Where the question of a query `msg` ends, if it reads as one.
fn question_end(msg: &[u8]) -> Option<usize> {
    let mut reader = Reader::new(msg, HEADER);
    read_name(&mut reader, Pointers::Refused, |_| Ok(())).ok()?;
    reader.bytes(4).ok()?;
    Some(reader.at)
}

/// The wire form of a name as [`Query::name`] writes it (for a `msg` that no longer reads,
/// which [`parse_query`] having read it rules out).
fn name_wire(name: &str) -> Vec<u8> {
    let mut wire = Vec::with_capacity(name.len() + 2);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        let label = &label.as_bytes()[..label.len().min(63)];
        // At most 63: the cast keeps it.
        wire.push(label.len() as u8);
        wire.extend_from_slice(label);
    }
    wire.push(0);
    wire
}

/// The response to the query `msg` (already parsed as `query`) that carries only `rcode`:
/// same id, QR=1, opcode 0, RD copied, RA=1, the question copied byte for byte (its case
/// too: clients that randomise a name's case check it), no records and no OPT.
pub fn respond(msg: &[u8], query: &Query, rcode: u8) -> Vec<u8> {
    let rd = msg
        .get(2..4)
        .map_or(0, |f| u16::from_be_bytes([f[0], f[1]]) & FLAG_RD);
    let flags = FLAG_QR | rd | FLAG_RA | (u16::from(rcode) & RCODE_MASK);
    let mut out = Vec::with_capacity(HEADER + query.name.len() + 6);
    out.extend_from_slice(&query.id.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    match question_end(msg).and_then(|end| msg.get(HEADER..end)) {
        Some(question) => out.extend_from_slice(question),
        None => {
            out.extend_from_slice(&name_wire(&query.name));
            out.extend_from_slice(&query.qtype.to_be_bytes());
            out.extend_from_slice(&CLASS_IN.to_be_bytes());
        }
    }
    out
}

/// TCP framing (RFC 1035 4.2.2): a 2-byte big-endian length before each message. Messages
/// come from UDP (at most 65,507 bytes) or from this framing, so they fit; a longer one would
/// be cut to 65,535 bytes rather than framed with a wrong length.
pub fn frame(msg: &[u8]) -> Vec<u8> {
    let len = u16::try_from(msg.len()).unwrap_or(u16::MAX);
    let mut out = Vec::with_capacity(2 + usize::from(len));
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&msg[..usize::from(len)]);
    out
}

#[cfg(test)]
mod tests;
