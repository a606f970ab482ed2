//! The meta commands `mg`, `ms`, `md`, `ma`, `mn`: `<cmd> <key> [<datalen>] <flag>*`, where a
//! flag is one letter optionally followed by a token (`T30`, `Oabc`).
//!
//! Only flags whose memcached semantics we keep are accepted; the others (`E` on `mg`, `x`
//! on `md`) are refused with `CLIENT_ERROR invalid flag` rather than half-honoured. `C`
//! (compare cas) is kept exactly as memcached reads it on each command: see
//! [`MetaSet::compare_cas`], [`MetaDelete::compare_cas`], [`MetaArith::compare_cas`]. The
//! access flags (`h`, `l`, `N`, `R` on `mg`, `I` on `md` and `ms`) are parsed here and
//! served as described in the front-end's `cmd/meta.rs`.

use base64::Engine;

use super::command::{ArithMode, Command, MetaArith, MetaDelete, MetaFlags, MetaGet, MetaSet, SetMode};
use super::KEY_BYTES_MAX;
use super::{data_block, data_length, reply, strtol32, strtoul32, strtoull, Invalid, Limits, Parse};

/// memcached refuses longer opaque tokens (a flag token of over 32 bytes with its `O`).
const OPAQUE_BYTES_MAX: usize = 31;

type Flag<'a> = (u8, &'a [u8]);
type Err = &'static [u8];

pub(super) fn is_meta(name: &[u8]) -> bool {
    matches!(name, b"mg" | b"ms" | b"md" | b"ma" | b"mn" | b"me")
}

pub(super) fn parse(tokens: &[&[u8]], consumed: usize, rest: &[u8], limits: &Limits) -> Parse {
    let result = match tokens[0] {
        b"mn" => Ok(Command::MetaNoop),
        b"ms" => return meta_set(tokens, consumed, rest, limits),
        b"me" if tokens.len() < 2 => Err(reply::BAD_FORMAT),
        _ if tokens.len() < 2 => Err(reply::ERROR),
        b"mg" => meta_get(tokens),
        b"md" => meta_delete(tokens),
        b"me" => meta_debug(tokens),
        _ => meta_arith(tokens),
    };
    match result {
        Ok(command) => Parse::Frame { command, consumed },
        Err(reply) => Parse::Invalid(Invalid::line(reply, consumed)),
    }
}

/// Splits flags, refusing letters outside `allowed` and repeated letters.
fn scan<'a>(tokens: &[&'a [u8]], allowed: &[u8], dup: Err) -> Result<Vec<Flag<'a>>, Err> {
    let mut flags: Vec<Flag<'a>> = Vec::with_capacity(tokens.len());
    for &token in tokens {
        let (letter, value) = match token.split_first() {
            Some((letter, value)) => (*letter, value),
            None => continue,
        };
        if !allowed.contains(&letter) {
            return Err(if dup == reply::INVALID_OR_DUPLICATE_FLAG { dup } else { reply::INVALID_FLAG });
        }
        if flags.iter().any(|(l, _)| *l == letter) {
            return Err(dup);
        }
        flags.push((letter, value));
    }
    Ok(flags)
}

/// The flags every meta command shares, and the key (decoded if `b`).
fn common(raw_key: &[u8], flags: &[Flag<'_>], bad_token: Err) -> Result<(Vec<u8>, MetaFlags), Err> {
    let mut meta = MetaFlags { order: flags.iter().map(|(l, _)| *l).collect(), ..MetaFlags::default() };
    for (letter, value) in flags {
        match letter {
            b'b' => meta.base64 = true,
            b'q' => meta.quiet = true,
            b'k' => meta.ret_key = true,
            b'c' => meta.ret_cas = true,
            b'O' if value.len() > OPAQUE_BYTES_MAX => return Err(b"CLIENT_ERROR opaque token too long\r\n"),
            b'O' => meta.opaque = Some(value.to_vec()),
            b'T' => meta.ttl = Some(strtol32(value).ok_or(bad_token)?),
            _ => {}
        }
    }
    let key = if meta.base64 { decode_key(raw_key)? } else { raw_key.to_vec() };
    Ok((key, meta))
}

fn decode_key(raw: &[u8]) -> Result<Vec<u8>, Err> {
    let key = base64::engine::general_purpose::STANDARD.decode(raw).map_err(|_| reply::BAD_KEY_ENCODING)?;
    if key.is_empty() || key.len() > KEY_BYTES_MAX {
        return Err(reply::BAD_KEY_ENCODING);
    }
    Ok(key)
}

fn check_key(raw_key: &[u8]) -> Result<(), Err> {
    if raw_key.len() > KEY_BYTES_MAX {
        Err(reply::BAD_FORMAT)
    } else {
        Ok(())
    }
}

fn has(flags: &[Flag<'_>], letter: u8) -> bool {
    flags.iter().any(|(l, _)| *l == letter)
}

fn token<'a>(flags: &[Flag<'a>], letter: u8) -> Option<&'a [u8]> {
    flags.iter().find(|(l, _)| *l == letter).map(|(_, v)| *v)
}

/// `C<cas>`: the compare value, if given.
fn compare(flags: &[Flag<'_>], bad: Err) -> Result<Option<u64>, Err> {
    token(flags, b'C').map(|t| strtoull(t).ok_or(bad)).transpose()
}

const BAD_TOKEN: Err = b"CLIENT_ERROR bad token in command line format\r\n";

fn meta_get(tokens: &[&[u8]]) -> Result<Command, Err> {
    check_key(tokens[1])?;
    // `u` (do not bump the item in the LRU) is accepted and has nothing to do: FAWN has no LRU.
    let flags = scan(&tokens[2..], b"bcfhklNOqRstuvT", reply::DUPLICATE_FLAG)?;
    let (key, meta) = common(tokens[1], &flags, BAD_TOKEN)?;
    let seconds = |letter| token(&flags, letter).map(|t| strtol32(t).ok_or(BAD_TOKEN)).transpose();
    Ok(Command::MetaGet(MetaGet {
        key,
        meta,
        value: has(&flags, b'v'),
        ret_flags: has(&flags, b'f'),
        ret_size: has(&flags, b's'),
        ret_ttl: has(&flags, b't'),
        ret_hit: has(&flags, b'h'),
        ret_last_access: has(&flags, b'l'),
        vivify: seconds(b'N')?,
        recache: seconds(b'R')?,
    }))
}

fn meta_delete(tokens: &[&[u8]]) -> Result<Command, Err> {
    check_key(tokens[1])?;
    let flags = scan(&tokens[2..], b"bCIkOqT", reply::INVALID_OR_DUPLICATE_FLAG)?;
    // memcached's `md` reports a bad `T` token as a bad flag.
    let (key, meta) = common(tokens[1], &flags, reply::INVALID_OR_DUPLICATE_FLAG)?;
    let compare_cas = compare(&flags, reply::INVALID_OR_DUPLICATE_FLAG)?;
    Ok(Command::MetaDelete(MetaDelete { key, meta, compare_cas, invalidate: has(&flags, b'I') }))
}

/// `me <key>`: memcached's item debug line; further tokens are ignored, as memcached does.
fn meta_debug(tokens: &[&[u8]]) -> Result<Command, Err> {
    check_key(tokens[1])?;
    Ok(Command::MetaDebug { key: tokens[1].to_vec() })
}

fn meta_arith(tokens: &[&[u8]]) -> Result<Command, Err> {
    const BAD: Err = reply::INVALID_OR_DUPLICATE_FLAG;
    check_key(tokens[1])?;
    let flags = scan(&tokens[2..], b"bcCtvkOqNJDM", BAD)?;
    let (key, meta) = common(tokens[1], &flags, BAD)?;
    let number = |letter, default| match token(&flags, letter) {
        None => Ok(default),
        Some(t) => strtoull(t).ok_or(BAD),
    };
    let mode = match token(&flags, b'M') {
        None => ArithMode::Incr,
        Some(b"I" | b"i" | b"+") => ArithMode::Incr,
        Some(b"D" | b"d" | b"-") => ArithMode::Decr,
        Some(_) => return Err(reply::MA_BAD_MODE),
    };
    let vivify = match token(&flags, b'N') {
        None => None,
        Some(t) => Some(strtol32(t).ok_or(BAD)?),
    };
    Ok(Command::MetaArith(MetaArith {
        key,
        meta,
        value: has(&flags, b'v'),
        ret_ttl: has(&flags, b't'),
        vivify,
        // memcached's arithmetic ignores a compare value of 0.
        compare_cas: compare(&flags, BAD)?.filter(|unique| *unique != 0),
        initial: number(b'J', 0)?,
        delta: number(b'D', 1)?,
        mode,
    }))
}

/// `ms <key> <datalen> <flag>*` then the data block. Once the key and length are known every
/// error swallows the block; before that the next line is read as a command (as memcached).
fn meta_set(tokens: &[&[u8]], consumed: usize, rest: &[u8], limits: &Limits) -> Parse {
    if tokens.len() < 2 {
        return Parse::Invalid(Invalid::line(reply::ERROR, consumed));
    }
    let key_ok = tokens[1].len() <= KEY_BYTES_MAX;
    let len = tokens.get(2).and_then(|t| data_length(t)).filter(|_| key_ok);
    let Some(len) = len else {
        return Parse::Invalid(Invalid::line(reply::BAD_FORMAT, consumed));
    };
    let swallow = len + 2;
    let request = match meta_set_request(tokens) {
        Ok(request) => request,
        Err(reply) => return Parse::Invalid(Invalid::swallowing(reply, consumed, swallow)),
    };
    if len > limits.value_bytes_max {
        return Parse::Invalid(Invalid::swallowing(reply::TOO_LARGE, consumed, swallow));
    }
    match data_block(rest, len) {
        None => Parse::Incomplete,
        // Unlike `set`, `ms` reports a bad chunk even in quiet mode.
        Some(Err(())) => Parse::Invalid(super::text::bad_chunk(consumed + swallow, false)),
        Some(Ok(value)) => Parse::Frame {
            command: Command::MetaSet(MetaSet { value, ..request }),
            consumed: consumed + swallow,
        },
    }
}

/// Everything of an `ms` request but its value.
fn meta_set_request(tokens: &[&[u8]]) -> Result<MetaSet, Err> {
    check_key(tokens[1])?;
    let flags = scan(&tokens[3..], b"bcCFIkOqTM", reply::DUPLICATE_FLAG)?;
    let (key, meta) = common(tokens[1], &flags, BAD_TOKEN)?;
    let client_flags = match token(&flags, b'F') {
        None => 0,
        Some(t) => strtoul32(t).ok_or(reply::BAD_FORMAT)?,
    };
    let compare_cas = compare(&flags, BAD_TOKEN)?;
    let mode = match token(&flags, b'M') {
        None | Some(b"S") => SetMode::Set,
        Some(b"E") => SetMode::Add,
        Some(b"A") => SetMode::Append,
        Some(b"P") => SetMode::Prepend,
        Some(b"R") => SetMode::Replace,
        Some(_) => return Err(reply::MS_BAD_MODE),
    };
    let invalidate = has(&flags, b'I');
    Ok(MetaSet { key, meta, value: Vec::new(), client_flags, compare_cas, mode, invalidate })
}
