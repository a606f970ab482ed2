//! The memcached text protocol (memcached 1.6 `protocol.txt`): a bounded, panic-free request
//! parser and a response encoder.
//!
//! [`parse`] looks at the front of a connection's read buffer and returns one of:
//! - [`Parse::Frame`]: a complete [`Command`] and how many bytes it used;
//! - [`Parse::Incomplete`]: the request is not all there yet; read more and call again;
//! - [`Parse::Invalid`]: a malformed request, with the exact memcached error reply and what to
//!   do with the bytes (drop the line, swallow a data block, or close because framing is lost).
//!
//! Every allocation is bounded by [`Limits`]: the parser never waits for more than
//! `line_bytes_max` (or `get_line_bytes_max` for retrievals) bytes of command line, nor for a
//! data block over `value_bytes_max`; an oversized data block is reported at once and
//! swallowed by the caller without buffering.

pub mod binary;
mod command;
mod meta;
mod number;
pub mod reply;
mod text;

pub use command::{
    absolute_expiry, ArithMode, Command, GetCommand, MetaArith, MetaDelete, MetaFlags, MetaGet, MetaSet,
    SetMode, StoreCommand,
};

/// Longest key memcached accepts.
pub const KEY_BYTES_MAX: usize = 250;

/// memcached treats an exptime above this (30 days) as an absolute Unix time.
pub const REALTIME_MAXDELTA_SECS: i64 = 60 * 60 * 24 * 30;

/// memcached refuses a data length above `INT_MAX - 2` (the block's `\r\n` must fit an int).
const DATA_BYTES_MAX: i64 = i32::MAX as i64 - 2;

/// Size bounds the parser enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest partial command line waited for; past it, a line that is not a `get`/`gets` is
    /// dropped with the connection, silently, as memcached 1.6 does (2048).
    pub line_bytes_max: usize,
    /// Longest line of any command once its newline has arrived, and the longest partial
    /// `get`/`gets` line (multi-gets may carry many keys). Past it the connection is closed.
    pub get_line_bytes_max: usize,
    /// Largest value; a larger one is refused with `SERVER_ERROR object too large for cache`.
    pub value_bytes_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { line_bytes_max: 2048, get_line_bytes_max: 64 * 1024, value_bytes_max: 1024 * 1024 }
    }
}

/// The result of looking at the front of a read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parse {
    /// A complete command that used the first `consumed` bytes.
    Frame { command: Command, consumed: usize },
    /// Need more bytes (the buffer holds a prefix of a request, within the limits).
    Incomplete,
    /// A malformed request.
    Invalid(Invalid),
}

/// A malformed request and how to recover from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The exact error line to send (with `\r\n`), or `None` when memcached stays silent
    /// (`noreply` on a request whose line parsed far enough to see it, or a silent close).
    pub reply: Option<&'static [u8]>,
    /// Bytes of the buffer to drop now (the request line).
    pub consumed: usize,
    /// Further bytes to discard after `consumed` (a refused data block, with its `\r\n`); they
    /// may not have arrived yet.
    pub swallow: usize,
    /// Close the connection after the reply (memcached drops overlong lines and HTTP requests).
    pub close: bool,
    /// memcached unlinks the old item when a `set` is refused as too large, so a stale value
    /// does not survive a failed overwrite; the server should delete this key.
    pub unlink: Option<Vec<u8>>,
}

impl Invalid {
    /// A reply after which the connection goes on with the next line.
    pub(crate) fn line(reply: &'static [u8], consumed: usize) -> Self {
        Invalid { reply: Some(reply), consumed, swallow: 0, close: false, unlink: None }
    }

    /// The connection is closed without a reply.
    pub(crate) fn close(consumed: usize) -> Self {
        Invalid { reply: None, consumed, swallow: 0, close: true, unlink: None }
    }

    /// A reply after which the request's data block (`swallow` bytes) is discarded.
    pub(crate) fn swallowing(reply: &'static [u8], consumed: usize, swallow: usize) -> Self {
        Invalid { swallow, ..Invalid::line(reply, consumed) }
    }

    /// memcached's `noreply` also silences errors found after the token count was checked.
    pub(crate) fn quiet_if(mut self, noreply: bool) -> Self {
        if noreply && !self.close {
            self.reply = None;
        }
        self
    }
}

/// Parses one request from the front of `buf`. Never panics; see the module docs.
pub fn parse(buf: &[u8], limits: &Limits) -> Parse {
    let Some(nl) = buf.iter().position(|b| *b == b'\n') else {
        return incomplete_line(buf, limits);
    };
    if nl > limits.get_line_bytes_max.max(limits.line_bytes_max) {
        return Parse::Invalid(Invalid::close(nl + 1));
    }
    let line_end = if nl > 0 && buf[nl - 1] == b'\r' { nl - 1 } else { nl };
    let line = &buf[..line_end];
    let consumed = nl + 1;
    let tokens: Vec<&[u8]> = line.split(|b| *b == b' ').filter(|t| !t.is_empty()).collect();
    let Some(name) = tokens.first() else {
        return Parse::Invalid(Invalid::line(reply::ERROR, consumed));
    };
    let rest = &buf[consumed..];
    if meta::is_meta(name) {
        meta::parse(&tokens, consumed, rest, limits)
    } else {
        text::parse(&tokens, consumed, rest, limits)
    }
}

/// No newline yet: wait, unless the line is already longer than any acceptable line.
fn incomplete_line(buf: &[u8], limits: &Limits) -> Parse {
    if buf.len() > partial_line_limit(buf, limits) {
        Parse::Invalid(Invalid::close(buf.len()))
    } else {
        Parse::Incomplete
    }
}

/// A partial multi-get may be long (many keys); any other partial line must fit in
/// `line_bytes_max` (memcached waits only for `get ` and `gets ` lines).
fn partial_line_limit(buf: &[u8], limits: &Limits) -> usize {
    let start = buf.iter().position(|b| *b != b' ').unwrap_or(buf.len());
    let head = &buf[start..];
    if head.starts_with(b"get ") || head.starts_with(b"gets ") {
        limits.get_line_bytes_max.max(limits.line_bytes_max)
    } else {
        limits.line_bytes_max
    }
}

/// The data block of a storage request: `len` bytes then `\r\n`, starting at `rest`.
/// Returns the value, or `None` if not all there yet, or `Err` if the terminator is wrong.
pub(crate) fn data_block(rest: &[u8], len: usize) -> Option<Result<Vec<u8>, ()>> {
    let total = len.checked_add(2)?;
    let block = rest.get(..total)?;
    if &block[len..] == b"\r\n" {
        Some(Ok(block[..len].to_vec()))
    } else {
        Some(Err(()))
    }
}

pub(crate) use number::{strtol32, strtoul32, strtoull};

/// A storage command's data length as memcached accepts it (`0..=INT_MAX - 2`).
pub(crate) fn data_length(token: &[u8]) -> Option<usize> {
    let len = strtol32(token)?;
    usize::try_from(len).ok().filter(|l| *l as i64 <= DATA_BYTES_MAX)
}

#[cfg(test)]
mod tests;
