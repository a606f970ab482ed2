//! The memcached binary protocol (deprecated by memcached, still used by spymemcached's binary
//! mode, libmemcached `--binary`, pylibmc `binary=True`): a bounded, panic-free request parser
//! and a response encoder. A connection whose first byte is [`REQUEST_MAGIC`] speaks it.
//!
//! Every frame is a 24-byte header, then extras, key and value. The parser checks each
//! request's extras, key and body lengths as memcached 1.6.18 does: a malformed header is
//! answered `Invalid arguments` and the connection is closed, since framing can no longer be
//! trusted; an unknown opcode is answered `Unknown command` and its body skipped.

use super::command::SetMode;
use super::{Limits, KEY_BYTES_MAX};

/// First byte of every request.
pub const REQUEST_MAGIC: u8 = 0x80;
const RESPONSE_MAGIC: u8 = 0x81;
const HEADER_BYTES: usize = 24;

/// Request opcodes (memcached's `protocol_binary.h`).
pub mod opcode {
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const REPLACE: u8 = 0x03;
    pub const DELETE: u8 = 0x04;
    pub const INCREMENT: u8 = 0x05;
    pub const DECREMENT: u8 = 0x06;
    pub const QUIT: u8 = 0x07;
    pub const FLUSH: u8 = 0x08;
    pub const GETQ: u8 = 0x09;
    pub const NOOP: u8 = 0x0a;
    pub const VERSION: u8 = 0x0b;
    pub const GETK: u8 = 0x0c;
    pub const GETKQ: u8 = 0x0d;
    pub const APPEND: u8 = 0x0e;
    pub const PREPEND: u8 = 0x0f;
    pub const STAT: u8 = 0x10;
    pub const SETQ: u8 = 0x11;
    pub const ADDQ: u8 = 0x12;
    pub const REPLACEQ: u8 = 0x13;
    pub const DELETEQ: u8 = 0x14;
    pub const INCREMENTQ: u8 = 0x15;
    pub const DECREMENTQ: u8 = 0x16;
    pub const QUITQ: u8 = 0x17;
    pub const FLUSHQ: u8 = 0x18;
    pub const APPENDQ: u8 = 0x19;
    pub const PREPENDQ: u8 = 0x1a;
    pub const VERBOSITY: u8 = 0x1b;
    pub const TOUCH: u8 = 0x1c;
    pub const GAT: u8 = 0x1d;
    pub const GATQ: u8 = 0x1e;
    pub const SASL_LIST_MECHS: u8 = 0x20;
    pub const SASL_AUTH: u8 = 0x21;
    pub const SASL_STEP: u8 = 0x22;
    pub const GATK: u8 = 0x23;
    pub const GATKQ: u8 = 0x24;
}

/// Response status codes, with the message memcached sends in an error's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok = 0x00,
    NotFound = 0x01,
    Exists = 0x02,
    TooLarge = 0x03,
    InvalidArguments = 0x04,
    NotStored = 0x05,
    NonNumeric = 0x06,
    AuthError = 0x20,
    UnknownCommand = 0x81,
    /// The cluster could not serve the request (memcached's "temporary failure").
    TemporaryFailure = 0x86,
}

impl Status {
    /// The error body memcached 1.6.18 sends with this status.
    pub fn message(self) -> &'static [u8] {
        match self {
            Status::Ok => b"",
            Status::NotFound => b"Not found",
            Status::Exists => b"Data exists for key.",
            Status::TooLarge => b"Too large.",
            Status::InvalidArguments => b"Invalid arguments",
            Status::NotStored => b"Not stored.",
            Status::NonNumeric => b"Non-numeric server-side value for incr or decr",
            Status::AuthError => b"Auth failure.",
            Status::UnknownCommand => b"Unknown command",
            Status::TemporaryFailure => b"Temporary failure",
        }
    }
}

/// One binary request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinRequest {
    pub opcode: u8,
    pub opaque: u32,
    /// The request's cas: for stores and deletes, a non-zero value makes them conditional.
    pub cas: u64,
    pub key: Vec<u8>,
    pub command: BinCommand,
}

/// What a binary request asks for. `quiet` is the `...Q` opcodes: no reply on success (for
/// gets, no reply on a miss).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BinCommand {
    /// get, getq, getk, getkq, and with `touch` gat, gatq, gatk, gatkq.
    Get {
        with_key: bool,
        quiet: bool,
        touch: Option<i32>,
    },
    /// set, add, replace, append, prepend and their quiet forms.
    Store {
        mode: SetMode,
        flags: u32,
        exptime: i32,
        value: Vec<u8>,
        quiet: bool,
    },
    Delete {
        quiet: bool,
    },
    /// `exptime == u32::MAX`: a miss is not created.
    Arith {
        incr: bool,
        delta: u64,
        initial: u64,
        exptime: u32,
        quiet: bool,
    },
    Touch {
        exptime: i32,
    },
    Flush {
        delay: i32,
        quiet: bool,
    },
    Noop,
    Version,
    Quit {
        quiet: bool,
    },
    /// `stat [group]`: the key is the group.
    Stat,
    Verbosity,
    /// SASL: list the mechanisms; authenticate (the key is the mechanism, the value its
    /// data); a further step (no mechanism here has one).
    SaslList,
    SaslAuth {
        data: Vec<u8>,
    },
    SaslStep,
}

/// The result of looking at the front of a binary connection's read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BinParse {
    Frame { request: BinRequest, consumed: usize },
    Incomplete,
    Invalid(BinInvalid),
}

/// A refused request: the error reply to send (none for a bad magic byte, where memcached
/// closes silently), the bytes to drop now and later, and whether to close.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinInvalid {
    pub reply: Option<(u8, u32, Status)>,
    pub consumed: usize,
    pub swallow: usize,
    pub close: bool,
    /// A refused too-large `set` removes the old item, as in the text protocol.
    pub unlink: Option<Vec<u8>>,
}

struct Header {
    opcode: u8,
    key_len: usize,
    extras_len: usize,
    body_len: usize,
    opaque: u32,
    cas: u64,
}

fn header(buf: &[u8]) -> Option<Header> {
    let h: &[u8; HEADER_BYTES] = buf.get(..HEADER_BYTES)?.try_into().ok()?;
    let be32 = |i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    Some(Header {
        opcode: h[1],
        key_len: usize::from(u16::from_be_bytes([h[2], h[3]])),
        extras_len: usize::from(h[4]),
        body_len: be32(8) as usize,
        opaque: be32(12),
        cas: u64::from_be_bytes([h[16], h[17], h[18], h[19], h[20], h[21], h[22], h[23]]),
    })
}

/// Which lengths an opcode requires: extras, whether a key is required (`Some(true)`),
/// forbidden (`Some(false)`) or optional, and whether a value may follow.
fn shape(opcode: u8) -> Option<(&'static [usize], Option<bool>, bool)> {
    use opcode::*;
    Some(match opcode {
        GET | GETQ | GETK | GETKQ | DELETE | DELETEQ => (&[0], Some(true), false),
        SET | SETQ | ADD | ADDQ | REPLACE | REPLACEQ => (&[8], Some(true), true),
        APPEND | APPENDQ | PREPEND | PREPENDQ => (&[0], Some(true), true),
        INCREMENT | INCREMENTQ | DECREMENT | DECREMENTQ => (&[20], Some(true), false),
        TOUCH | GAT | GATQ | GATK | GATKQ => (&[4], Some(true), false),
        NOOP | VERSION | QUIT | QUITQ => (&[0], Some(false), false),
        FLUSH | FLUSHQ => (&[0, 4], Some(false), false),
        VERBOSITY => (&[4], Some(false), false),
        STAT => (&[0], None, false),
        SASL_LIST_MECHS => (&[0], Some(false), false),
        SASL_AUTH | SASL_STEP => (&[0], Some(true), true),
        _ => return None,
    })
}

/// Parses one request from the front of `buf`. Never panics.
pub fn parse(buf: &[u8], limits: &Limits) -> BinParse {
    let Some(first) = buf.first() else {
        return BinParse::Incomplete;
    };
    if *first != REQUEST_MAGIC {
        return BinParse::Invalid(BinInvalid {
            reply: None,
            consumed: 0,
            swallow: 0,
            close: true,
            unlink: None,
        });
    }
    let Some(h) = header(buf) else {
        return BinParse::Incomplete;
    };
    let refuse = |status, swallow, close| {
        let reply = Some((h.opcode, h.opaque, status));
        BinParse::Invalid(BinInvalid { reply, consumed: HEADER_BYTES, swallow, close, unlink: None })
    };
    let Some((extras, key_rule, has_value)) = shape(h.opcode) else {
        return refuse(Status::UnknownCommand, h.body_len, false);
    };
    let value_len = h.body_len.checked_sub(h.key_len + h.extras_len);
    let lengths_ok = extras.contains(&h.extras_len)
        && key_rule.is_none_or(|required| required == (h.key_len > 0))
        && h.key_len <= KEY_BYTES_MAX
        && value_len.is_some_and(|v| has_value || v == 0);
    let Some(value_len) = value_len.filter(|_| lengths_ok) else {
        return refuse(Status::InvalidArguments, 0, true);
    };
    if value_len > limits.value_bytes_max {
        let key_start = HEADER_BYTES + h.extras_len;
        let Some(key) = buf.get(key_start..key_start + h.key_len) else {
            return BinParse::Incomplete;
        };
        let unlink = matches!(h.opcode, opcode::SET | opcode::SETQ).then(|| key.to_vec());
        let reply = Some((h.opcode, h.opaque, Status::TooLarge));
        let swallow = h.body_len;
        return BinParse::Invalid(BinInvalid {
            reply,
            consumed: HEADER_BYTES,
            swallow,
            close: false,
            unlink,
        });
    }
    let Some(body) = buf.get(HEADER_BYTES..HEADER_BYTES + h.body_len) else {
        return BinParse::Incomplete;
    };
    let (extras, rest) = body.split_at(h.extras_len);
    let (key, value) = rest.split_at(h.key_len);
    let command = command(h.opcode, extras, value);
    let request = BinRequest { opcode: h.opcode, opaque: h.opaque, cas: h.cas, key: key.to_vec(), command };
    BinParse::Frame { request, consumed: HEADER_BYTES + h.body_len }
}

/// Decodes a request whose lengths [`shape`] has checked.
fn command(op: u8, extras: &[u8], value: &[u8]) -> BinCommand {
    use opcode::*;
    let be32 = |i: usize| extras.get(i..i + 4).map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    let be64 = |i: usize| (u64::from(be32(i)) << 32) | u64::from(be32(i + 4));
    let quiet = matches!(
        op,
        GETQ | GETKQ
            | GATQ
            | GATKQ
            | SETQ
            | ADDQ
            | REPLACEQ
            | APPENDQ
            | PREPENDQ
            | DELETEQ
            | INCREMENTQ
            | DECREMENTQ
            | QUITQ
            | FLUSHQ
    );
    let store =
        |mode, flags, exptime| BinCommand::Store { mode, flags, exptime, value: value.to_vec(), quiet };
    match op {
        GET | GETQ | GETK | GETKQ => {
            BinCommand::Get { with_key: matches!(op, GETK | GETKQ), quiet, touch: None }
        }
        GAT | GATQ | GATK | GATKQ => {
            BinCommand::Get { with_key: matches!(op, GATK | GATKQ), quiet, touch: Some(be32(0) as i32) }
        }
        SET | SETQ => store(SetMode::Set, be32(0), be32(4) as i32),
        ADD | ADDQ => store(SetMode::Add, be32(0), be32(4) as i32),
        REPLACE | REPLACEQ => store(SetMode::Replace, be32(0), be32(4) as i32),
        APPEND | APPENDQ => store(SetMode::Append, 0, 0),
        PREPEND | PREPENDQ => store(SetMode::Prepend, 0, 0),
        DELETE | DELETEQ => BinCommand::Delete { quiet },
        INCREMENT | INCREMENTQ | DECREMENT | DECREMENTQ => BinCommand::Arith {
            incr: matches!(op, INCREMENT | INCREMENTQ),
            delta: be64(0),
            initial: be64(8),
            exptime: be32(16),
            quiet,
        },
        TOUCH => BinCommand::Touch { exptime: be32(0) as i32 },
        FLUSH | FLUSHQ => BinCommand::Flush { delay: be32(0) as i32, quiet },
        VERSION => BinCommand::Version,
        QUIT | QUITQ => BinCommand::Quit { quiet },
        STAT => BinCommand::Stat,
        VERBOSITY => BinCommand::Verbosity,
        SASL_LIST_MECHS => BinCommand::SaslList,
        SASL_AUTH => BinCommand::SaslAuth { data: value.to_vec() },
        SASL_STEP => BinCommand::SaslStep,
        _ => BinCommand::Noop,
    }
}

/// Appends one response frame.
pub fn response(
    out: &mut Vec<u8>,
    head: (u8, u32, Status),
    cas: u64,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
) {
    let (opcode, opaque, status) = head;
    let body_len = extras.len() + key.len() + value.len();
    out.push(RESPONSE_MAGIC);
    out.push(opcode);
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.push(extras.len() as u8);
    out.push(0);
    out.extend_from_slice(&(status as u16).to_be_bytes());
    out.extend_from_slice(&(body_len as u32).to_be_bytes());
    out.extend_from_slice(&opaque.to_be_bytes());
    out.extend_from_slice(&cas.to_be_bytes());
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// Appends an error response: the status and memcached's message for it.
pub fn error(out: &mut Vec<u8>, opcode: u8, opaque: u32, status: Status) {
    response(out, (opcode, opaque, status), 0, &[], &[], status.message());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(op: u8, key: &[u8], extras: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = vec![REQUEST_MAGIC, op];
        out.extend_from_slice(&(key.len() as u16).to_be_bytes());
        out.push(extras.len() as u8);
        out.extend_from_slice(&[0, 0, 0]);
        out.extend_from_slice(&((key.len() + extras.len() + value.len()) as u32).to_be_bytes());
        out.extend_from_slice(&7u32.to_be_bytes());
        out.extend_from_slice(&9u64.to_be_bytes());
        [out, extras.to_vec(), key.to_vec(), value.to_vec()].concat()
    }

    fn limits() -> Limits {
        Limits { value_bytes_max: 16, ..Limits::default() }
    }

    #[test]
    fn decodes_a_set_and_waits_for_its_body() {
        let frame = request(opcode::SETQ, b"k", &[0, 0, 0, 5, 0, 0, 0, 100], b"val");
        for cut in 0..frame.len() {
            assert_eq!(parse(&frame[..cut], &limits()), BinParse::Incomplete, "cut at {cut}");
        }
        let BinParse::Frame { request, consumed } = parse(&frame, &limits()) else {
            panic!("expected a frame");
        };
        assert_eq!((consumed, request.opaque, request.cas, &request.key[..]), (frame.len(), 7, 9, &b"k"[..]));
        let want = BinCommand::Store {
            mode: SetMode::Set,
            flags: 5,
            exptime: 100,
            value: b"val".to_vec(),
            quiet: true,
        };
        assert_eq!(request.command, want);
    }

    #[test]
    fn malformed_lengths_close_and_unknown_opcodes_skip() {
        let get_with_extras = request(opcode::GET, b"k", b"abcd", b"");
        let BinParse::Invalid(inv) = parse(&get_with_extras, &limits()) else { panic!("invalid") };
        assert_eq!((inv.reply.map(|r| r.2), inv.close), (Some(Status::InvalidArguments), true));
        let long_key = request(opcode::GET, &[b'k'; 251], b"", b"");
        assert!(matches!(parse(&long_key, &limits()), BinParse::Invalid(BinInvalid { close: true, .. })));
        let unknown = request(0x50, b"k", b"", b"xx");
        let BinParse::Invalid(inv) = parse(&unknown, &limits()) else { panic!("invalid") };
        assert_eq!(
            (inv.reply.map(|r| r.2), inv.swallow, inv.close),
            (Some(Status::UnknownCommand), 3, false)
        );
        let bad_magic = [0x81u8; 24];
        assert!(matches!(
            parse(&bad_magic, &limits()),
            BinParse::Invalid(BinInvalid { reply: None, close: true, .. })
        ));
    }

    #[test]
    fn too_large_values_are_skipped_and_unlink_on_set() {
        let frame = request(opcode::SET, b"k", &[0; 8], &[b'x'; 17]);
        let BinParse::Invalid(inv) = parse(&frame[..33], &limits()) else { panic!("invalid") };
        assert_eq!((inv.reply.map(|r| r.2), inv.consumed, inv.swallow), (Some(Status::TooLarge), 24, 26));
        assert_eq!(inv.unlink, Some(b"k".to_vec()));
    }

    #[test]
    fn error_response_matches_memcached() {
        let mut out = Vec::new();
        error(&mut out, opcode::GET, 0xdeadbeef, Status::NotFound);
        let mut want = vec![0x81, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 9, 0xde, 0xad, 0xbe, 0xef];
        want.extend_from_slice(&[0; 8]);
        want.extend_from_slice(b"Not found");
        assert_eq!(out, want);
    }
}
