//! Response lines, byte-exact as memcached 1.6 sends them, and encoders for value replies.

use base64::Engine;

pub const ERROR: &[u8] = b"ERROR\r\n";
pub const BAD_FORMAT: &[u8] = b"CLIENT_ERROR bad command line format\r\n";
pub const BAD_DATA_CHUNK: &[u8] = b"CLIENT_ERROR bad data chunk\r\n";
pub const TOO_LARGE: &[u8] = b"SERVER_ERROR object too large for cache\r\n";
pub const BAD_EXPTIME: &[u8] = b"CLIENT_ERROR invalid exptime argument\r\n";
pub const BAD_DELTA: &[u8] = b"CLIENT_ERROR invalid numeric delta argument\r\n";
pub const NON_NUMERIC: &[u8] = b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n";
pub const DELETE_USAGE: &[u8] = b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n";
pub const INVALID_FLAG: &[u8] = b"CLIENT_ERROR invalid flag\r\n";
pub const DUPLICATE_FLAG: &[u8] = b"CLIENT_ERROR duplicate flag\r\n";
pub const INVALID_OR_DUPLICATE_FLAG: &[u8] = b"CLIENT_ERROR invalid or duplicate flag\r\n";
pub const BAD_KEY_ENCODING: &[u8] = b"CLIENT_ERROR error decoding key\r\n";
pub const MS_BAD_MODE: &[u8] = b"CLIENT_ERROR invalid mode for ms M token\r\n";
pub const MA_BAD_MODE: &[u8] = b"CLIENT_ERROR invalid mode for ma M token\r\n";
pub const TOO_MANY_CONNECTIONS: &[u8] = b"SERVER_ERROR too many open connections\r\n";

pub const END: &[u8] = b"END\r\n";
pub const STORED: &[u8] = b"STORED\r\n";
pub const NOT_STORED: &[u8] = b"NOT_STORED\r\n";
pub const EXISTS: &[u8] = b"EXISTS\r\n";
pub const NOT_FOUND: &[u8] = b"NOT_FOUND\r\n";
pub const DELETED: &[u8] = b"DELETED\r\n";
pub const TOUCHED: &[u8] = b"TOUCHED\r\n";
pub const OK: &[u8] = b"OK\r\n";
pub const RESET: &[u8] = b"RESET\r\n";

pub const META_HD: &[u8] = b"HD";
pub const META_NS: &[u8] = b"NS";
pub const META_EX: &[u8] = b"EX";
pub const META_NF: &[u8] = b"NF";
pub const META_EN: &[u8] = b"EN";
pub const META_MN: &[u8] = b"MN\r\n";

/// `VALUE <key> <flags> <bytes>[ <cas>]\r\n<data>\r\n`.
pub fn value(out: &mut Vec<u8>, key: &[u8], flags: u32, data: &[u8], cas: Option<u64>) {
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    push_fmt(out, format_args!(" {} {}", flags, data.len()));
    if let Some(cas) = cas {
        push_fmt(out, format_args!(" {cas}"));
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// `SERVER_ERROR <message>\r\n`; the message is cut at any line break so it stays one line.
pub fn server_error(out: &mut Vec<u8>, message: &str) {
    let first_line = message.split(['\r', '\n']).next().unwrap_or("");
    out.extend_from_slice(b"SERVER_ERROR ");
    out.extend_from_slice(first_line.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// `STAT <name> <value>\r\n`.
pub fn stat(out: &mut Vec<u8>, name: &str, value: impl std::fmt::Display) {
    push_fmt(out, format_args!("STAT {name} {value}\r\n"));
}

/// A decimal number and `\r\n` (incr/decr reply).
pub fn number(out: &mut Vec<u8>, n: u64) {
    push_fmt(out, format_args!("{n}\r\n"));
}

/// Appends ` <letter><value>` (a meta return flag).
pub fn meta_flag(out: &mut Vec<u8>, letter: u8, value: impl std::fmt::Display) {
    out.push(b' ');
    out.push(letter);
    push_fmt(out, format_args!("{value}"));
}

/// Appends ` k<key>` and, for a base64 key, ` b` (memcached echoes `b` right after the key).
pub fn meta_key(out: &mut Vec<u8>, key: &[u8], base64: bool) {
    out.extend_from_slice(b" k");
    if base64 {
        let encoded = base64::engine::general_purpose::STANDARD.encode(key);
        out.extend_from_slice(encoded.as_bytes());
        out.extend_from_slice(b" b");
    } else {
        out.extend_from_slice(key);
    }
}

/// Appends ` O<opaque>`.
pub fn meta_opaque(out: &mut Vec<u8>, opaque: &[u8]) {
    out.extend_from_slice(b" O");
    out.extend_from_slice(opaque);
}

fn push_fmt(out: &mut Vec<u8>, args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    // Writing into a Vec cannot fail.
    let _ = out.write_fmt(args);
}
