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
//! `max_line` (or `max_get_line` for retrievals) bytes of command line, nor for a data block
//! over `max_value`; an oversized data block is reported at once and swallowed by the caller
//! without buffering.

mod command;
mod meta;
pub mod reply;
mod text;

pub use command::{
    absolute_expiry, ArithMode, Command, GetCommand, MetaArith, MetaDelete, MetaFlags, MetaGet, MetaSet,
    SetMode, StoreCommand,
};

/// Longest key memcached accepts (bytes).
pub const KEY_MAX_LENGTH: usize = 250;

/// memcached treats an exptime above this many seconds (30 days) as an absolute Unix time.
pub const REALTIME_MAXDELTA: i64 = 60 * 60 * 24 * 30;

/// Size bounds the parser enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest command line (without its data block) other than a retrieval; memcached: 2048.
    pub max_line: usize,
    /// Longest `get`/`gets`/`gat`/`gats` line (multi-gets may carry many keys).
    pub max_get_line: usize,
    /// Largest value; a larger one is refused with `SERVER_ERROR object too large for cache`.
    pub max_value: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_line: 2048, max_get_line: 64 * 1024, max_value: 1024 * 1024 }
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
    /// (`noreply` on a request whose line parsed far enough to see it).
    pub reply: Option<&'static [u8]>,
    /// Bytes of the buffer to drop now (the request line).
    pub consumed: usize,
    /// Further bytes to discard after `consumed` (a refused data block, with its `\r\n`); they
    /// may not have arrived yet.
    pub swallow: usize,
    /// Framing is lost: send the reply (even under `noreply`) and close the connection.
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

    /// A reply after which the connection must be closed.
    pub(crate) fn fatal(reply: &'static [u8], consumed: usize) -> Self {
        Invalid { close: true, ..Invalid::line(reply, consumed) }
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
    if nl > line_limit(buf, limits) {
        return Parse::Invalid(Invalid::fatal(reply::LINE_TOO_LONG, nl + 1));
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
    if buf.len() > line_limit(buf, limits) {
        Parse::Invalid(Invalid::fatal(reply::LINE_TOO_LONG, buf.len()))
    } else {
        Parse::Incomplete
    }
}

/// Retrieval lines may be long (many keys); everything else must fit in `max_line`.
fn line_limit(buf: &[u8], limits: &Limits) -> usize {
    let start = buf.iter().position(|b| *b != b' ').unwrap_or(buf.len());
    let head = &buf[start..];
    let is_get = [&b"get "[..], b"gets ", b"gat ", b"gats "].iter().any(|p| head.starts_with(p));
    if is_get {
        limits.max_get_line.max(limits.max_line)
    } else {
        limits.max_line
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

/// Parses an unsigned decimal the way memcached's `safe_strtoul*` accept it (digits only here;
/// a sign or trailing garbage is invalid).
pub(crate) fn parse_u64(token: &[u8]) -> Option<u64> {
    if token.is_empty() || !token.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(token).ok()?.parse().ok()
}

pub(crate) fn parse_u32(token: &[u8]) -> Option<u32> {
    parse_u64(token).and_then(|v| u32::try_from(v).ok())
}

/// A signed 32-bit decimal (exptime, delays), as memcached's `safe_strtol`.
pub(crate) fn parse_i32(token: &[u8]) -> Option<i32> {
    let (neg, digits) = match token.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, token),
    };
    let magnitude = i64::try_from(parse_u64(digits)?).ok()?;
    let value = if neg { -magnitude } else { magnitude };
    i32::try_from(value).ok()
}

#[cfg(test)]
mod tests;
