//! Tiny clients for the two wire protocols the load generator speaks: the memcached text protocol
//! and Redis's RESP. Only get and set; requests are encoded into a caller's buffer (so a pipelined
//! batch is one write) and responses are parsed one at a time, in order.

use std::io::Write;

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

/// A key-value wire protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// memcached text protocol (memcached, FAWN front-ends).
    Memcached,
    /// Redis serialization protocol.
    Redis,
}

/// What one response said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    Hit,
    Miss,
    Stored,
    /// The server answered with an error (or an unexpected but well-framed reply).
    Error,
}

/// Longest response line we accept; anything longer means we lost framing.
const LINE_BYTES_MAX: usize = 8 * 1024;

impl Protocol {
    /// Append a get request for `key` to `buf`.
    pub fn encode_get(self, buf: &mut Vec<u8>, key: &[u8]) {
        match self {
            Protocol::Memcached => {
                buf.extend_from_slice(b"get ");
                buf.extend_from_slice(key);
                buf.extend_from_slice(b"\r\n");
            }
            Protocol::Redis => {
                buf.extend_from_slice(b"*2\r\n$3\r\nGET\r\n");
                resp_bulk(buf, key);
            }
        }
    }

    /// Append a set request to `buf`.
    pub fn encode_set(self, buf: &mut Vec<u8>, key: &[u8], value: &[u8]) {
        match self {
            Protocol::Memcached => {
                // Writing to a Vec cannot fail.
                let _ = write!(buf, "set ");
                buf.extend_from_slice(key);
                let _ = write!(buf, " 0 0 {}\r\n", value.len());
                buf.extend_from_slice(value);
                buf.extend_from_slice(b"\r\n");
            }
            Protocol::Redis => {
                buf.extend_from_slice(b"*3\r\n$3\r\nSET\r\n");
                resp_bulk(buf, key);
                resp_bulk(buf, value);
            }
        }
    }

    /// Read the response to a get. `scratch` is reused to avoid allocating per request.
    pub async fn read_get<R: AsyncBufRead + Unpin>(self, r: &mut R, scratch: &mut Vec<u8>) -> Result<Reply> {
        match self {
            Protocol::Memcached => memcached_get(r, scratch).await,
            Protocol::Redis => redis_get(r, scratch).await,
        }
    }

    /// Read the response to a set.
    pub async fn read_set<R: AsyncBufRead + Unpin>(self, r: &mut R, scratch: &mut Vec<u8>) -> Result<Reply> {
        read_line(r, scratch).await?;
        let ok: &[u8] = match self {
            Protocol::Memcached => b"STORED",
            Protocol::Redis => b"+OK",
        };
        Ok(if scratch.as_slice() == ok { Reply::Stored } else { Reply::Error })
    }
}

fn resp_bulk(buf: &mut Vec<u8>, data: &[u8]) {
    let _ = write!(buf, "${}\r\n", data.len());
    buf.extend_from_slice(data);
    buf.extend_from_slice(b"\r\n");
}

/// Read one `\r\n`-terminated line into `line`, without the terminator.
async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, line: &mut Vec<u8>) -> Result<()> {
    line.clear();
    let n = r.take(LINE_BYTES_MAX as u64).read_until(b'\n', line).await.context("reading a response line")?;
    if n == 0 {
        bail!("server closed the connection");
    }
    if !line.ends_with(b"\r\n") {
        bail!(
            "response line not terminated by CRLF within {LINE_BYTES_MAX} bytes: {:?}",
            String::from_utf8_lossy(&line[..line.len().min(80)])
        );
    }
    line.truncate(line.len() - 2);
    Ok(())
}

/// Read and discard `n` data bytes plus their `\r\n`.
async fn skip_data<R: AsyncBufRead + Unpin>(r: &mut R, n: usize, scratch: &mut Vec<u8>) -> Result<()> {
    scratch.resize(n + 2, 0);
    r.read_exact(scratch).await.context("reading a value")?;
    if !scratch.ends_with(b"\r\n") {
        bail!("value of {n} bytes not followed by CRLF");
    }
    Ok(())
}

fn parse_usize(s: &[u8]) -> Result<usize> {
    std::str::from_utf8(s)
        .ok()
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad length {:?}", String::from_utf8_lossy(s)))
}

/// `VALUE <key> <flags> <bytes> [<cas>]\r\n<data>\r\n ... END\r\n`, or an error line.
async fn memcached_get<R: AsyncBufRead + Unpin>(r: &mut R, scratch: &mut Vec<u8>) -> Result<Reply> {
    let mut reply = Reply::Miss;
    loop {
        read_line(r, scratch).await?;
        if scratch.as_slice() == b"END" {
            return Ok(reply);
        }
        if !scratch.starts_with(b"VALUE ") {
            // ERROR / CLIENT_ERROR / SERVER_ERROR end the request.
            return Ok(Reply::Error);
        }
        let bytes = scratch.split(|&b| b == b' ').nth(3).context("VALUE line without a byte count")?;
        let n = parse_usize(bytes)?;
        skip_data(r, n, scratch).await?;
        reply = Reply::Hit;
    }
}

/// `$<len>\r\n<data>\r\n`, `$-1\r\n` (miss) or `-ERR ...`.
async fn redis_get<R: AsyncBufRead + Unpin>(r: &mut R, scratch: &mut Vec<u8>) -> Result<Reply> {
    read_line(r, scratch).await?;
    match scratch.first() {
        Some(b'$') if scratch.as_slice() == b"$-1" => Ok(Reply::Miss),
        Some(b'$') => {
            let n = parse_usize(&scratch[1..])?;
            skip_data(r, n, scratch).await?;
            Ok(Reply::Hit)
        }
        Some(b'-') => Ok(Reply::Error),
        _ => bail!("unexpected RESP reply to GET: {:?}", String::from_utf8_lossy(scratch)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().build().unwrap()
    }

    #[test]
    fn encodes() {
        let mut b = Vec::new();
        Protocol::Memcached.encode_set(&mut b, b"k", b"vv");
        Protocol::Memcached.encode_get(&mut b, b"k");
        assert_eq!(b, b"set k 0 0 2\r\nvv\r\nget k\r\n");
        b.clear();
        Protocol::Redis.encode_set(&mut b, b"k", b"vv");
        assert_eq!(b, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nvv\r\n");
    }

    #[test]
    fn parses_memcached() {
        rt().block_on(async {
            let mut input: &[u8] =
                b"VALUE k 0 2\r\nab\r\nEND\r\nEND\r\nSTORED\r\nSERVER_ERROR out of memory\r\n";
            let mut s = Vec::new();
            let p = Protocol::Memcached;
            assert_eq!(p.read_get(&mut input, &mut s).await.unwrap(), Reply::Hit);
            assert_eq!(p.read_get(&mut input, &mut s).await.unwrap(), Reply::Miss);
            assert_eq!(p.read_set(&mut input, &mut s).await.unwrap(), Reply::Stored);
            assert_eq!(p.read_set(&mut input, &mut s).await.unwrap(), Reply::Error);
            assert!(p.read_get(&mut input, &mut s).await.is_err()); // EOF
        });
    }

    #[test]
    fn parses_redis() {
        rt().block_on(async {
            let mut input: &[u8] = b"$2\r\nab\r\n$-1\r\n+OK\r\n-ERR x\r\n";
            let mut s = Vec::new();
            let p = Protocol::Redis;
            assert_eq!(p.read_get(&mut input, &mut s).await.unwrap(), Reply::Hit);
            assert_eq!(p.read_get(&mut input, &mut s).await.unwrap(), Reply::Miss);
            assert_eq!(p.read_set(&mut input, &mut s).await.unwrap(), Reply::Stored);
            assert_eq!(p.read_get(&mut input, &mut s).await.unwrap(), Reply::Error);
        });
    }
}
