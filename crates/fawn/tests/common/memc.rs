//! A minimal memcached text-protocol client for recorded workloads: one connection, one
//! request at a time, every reply parsed strictly. A time-out or an I/O error drops the
//! connection (a late reply would otherwise answer the next request); the next call
//! reconnects.

#![allow(dead_code)]

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemcError {
    /// Nothing reached the server (the connection could not be made).
    NotSent(String),
    /// The request may have reached the server: a time-out, a lost connection, or a
    /// `SERVER_ERROR` (which the front-end answers when a back-end timed out).
    Ambiguous(String),
}

/// What `cas` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CasReply {
    Stored,
    Exists,
    NotFound,
}

/// One connection to a memcached-protocol server.
pub struct MemcClient {
    addr: String,
    timeout: Duration,
    conn: Option<BufReader<TcpStream>>,
}

impl MemcClient {
    pub fn new(addr: &str, timeout: Duration) -> MemcClient {
        MemcClient { addr: addr.to_string(), timeout, conn: None }
    }

    /// `get`; with the item's cas unique (`gets`) when `with_cas`.
    pub async fn get(&mut self, key: &str, with_cas: bool) -> Result<Option<(String, u64)>, MemcError> {
        let cmd = if with_cas { "gets" } else { "get" };
        let req = format!("{cmd} {key}\r\n");
        match self.call(req.as_bytes(), Some((key, with_cas))).await? {
            Reply::Value(v) => Ok(v),
            Reply::Line(l) => Err(server_said(&l)),
        }
    }

    pub async fn set(&mut self, key: &str, value: &str) -> Result<(), MemcError> {
        let req = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
        match self.line(req.as_bytes()).await?.as_str() {
            "STORED" => Ok(()),
            other => Err(server_said(other)),
        }
    }

    pub async fn cas(&mut self, key: &str, value: &str, unique: u64) -> Result<CasReply, MemcError> {
        let req = format!("cas {key} 0 0 {} {unique}\r\n{value}\r\n", value.len());
        match self.line(req.as_bytes()).await?.as_str() {
            "STORED" => Ok(CasReply::Stored),
            "EXISTS" => Ok(CasReply::Exists),
            "NOT_FOUND" => Ok(CasReply::NotFound),
            other => Err(server_said(other)),
        }
    }

    /// Whether the key existed.
    pub async fn delete(&mut self, key: &str) -> Result<bool, MemcError> {
        let req = format!("delete {key}\r\n");
        match self.line(req.as_bytes()).await?.as_str() {
            "DELETED" => Ok(true),
            "NOT_FOUND" => Ok(false),
            other => Err(server_said(other)),
        }
    }

    async fn line(&mut self, request: &[u8]) -> Result<String, MemcError> {
        match self.call(request, None).await? {
            Reply::Line(l) => Ok(l),
            Reply::Value(_) => Err(MemcError::Ambiguous("a value where a line was expected".into())),
        }
    }

    /// Sends `request` and reads one reply line, or a retrieval reply for `(key, with_cas)`.
    async fn call(&mut self, request: &[u8], value_of: Option<(&str, bool)>) -> Result<Reply, MemcError> {
        if self.conn.is_none() {
            let stream = tokio::time::timeout(self.timeout, TcpStream::connect(&self.addr))
                .await
                .map_err(|_| MemcError::NotSent("connect timed out".into()))?
                .map_err(|e| MemcError::NotSent(format!("connect: {e}")))?;
            let _ = stream.set_nodelay(true);
            self.conn = Some(BufReader::new(stream));
        }
        let conn = self.conn.as_mut().expect("connected above");
        let exchange = async {
            conn.get_mut().write_all(request).await?;
            match value_of {
                Some((key, with_cas)) => read_value(conn, key, with_cas).await.map(Reply::Value),
                None => read_line(conn).await.map(Reply::Line),
            }
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                self.conn = None;
                Err(MemcError::Ambiguous(format!("i/o: {e}")))
            }
            Err(_) => {
                self.conn = None;
                Err(MemcError::Ambiguous("timed out".into()))
            }
        }
    }
}

enum Reply {
    Line(String),
    Value(Option<(String, u64)>),
}

fn server_said(line: &str) -> MemcError {
    MemcError::Ambiguous(format!("server answered {line:?}"))
}

fn bad(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

async fn read_line(conn: &mut BufReader<TcpStream>) -> std::io::Result<String> {
    let mut line = String::new();
    if conn.read_line(&mut line).await? == 0 {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed"));
    }
    let line = line.strip_suffix("\r\n").ok_or_else(|| bad(format!("line without CRLF: {line:?}")))?;
    Ok(line.to_string())
}

/// Reads `VALUE <key> <flags> <bytes> [<cas>]` + data + `END`, or `END` alone. A
/// `SERVER_ERROR` line is returned as an error (the caller records the read as failed).
async fn read_value(
    conn: &mut BufReader<TcpStream>,
    key: &str,
    with_cas: bool,
) -> std::io::Result<Option<(String, u64)>> {
    let line = read_line(conn).await?;
    if line == "END" {
        return Ok(None);
    }
    let parts: Vec<&str> = line.split(' ').collect();
    let well_formed = parts.len() == if with_cas { 5 } else { 4 } && parts[0] == "VALUE" && parts[1] == key;
    if !well_formed {
        return Err(bad(format!("unexpected reply {line:?}")));
    }
    let len: usize = parts[3].parse().map_err(|_| bad(format!("bad length in {line:?}")))?;
    let cas: u64 =
        if with_cas { parts[4].parse().map_err(|_| bad(format!("bad cas in {line:?}")))? } else { 0 };
    let mut data = vec![0u8; len + 2];
    conn.read_exact(&mut data).await?;
    if !data.ends_with(b"\r\n") {
        return Err(bad("data block without CRLF".into()));
    }
    data.truncate(len);
    let end = read_line(conn).await?;
    if end != "END" {
        return Err(bad(format!("expected END, got {end:?}")));
    }
    let value = String::from_utf8(data).map_err(|_| bad("value is not UTF-8".into()))?;
    Ok(Some((value, cas)))
}
