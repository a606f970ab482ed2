//! The classic text commands (get ... verbosity), checked in the order memcached 1.6 checks
//! them, so that each malformed request gets the same error line as from memcached.

use super::command::{Command, GetCommand, SetMode, StoreCommand};
use super::{
    data_block, data_length, reply, strtol32, strtoul32, strtoull, Invalid, Limits, Parse, KEY_BYTES_MAX,
};

type Tokens<'a> = [&'a [u8]];

/// `tokens[0]` is the command name; `consumed` is the length of the line with its newline;
/// `rest` is what follows the line (a storage command's data block).
pub(super) fn parse(tokens: &Tokens, consumed: usize, rest: &[u8], limits: &Limits) -> Parse {
    let frame = |command| Parse::Frame { command, consumed };
    let result = match tokens[0] {
        b"get" => retrieval(tokens, false, false),
        b"gets" => retrieval(tokens, true, false),
        b"gat" => retrieval(tokens, false, true),
        b"gats" => retrieval(tokens, true, true),
        b"set" => return storage(tokens, SetMode::Set, consumed, rest, limits),
        b"add" => return storage(tokens, SetMode::Add, consumed, rest, limits),
        b"replace" => return storage(tokens, SetMode::Replace, consumed, rest, limits),
        b"append" => return storage(tokens, SetMode::Append, consumed, rest, limits),
        b"prepend" => return storage(tokens, SetMode::Prepend, consumed, rest, limits),
        b"cas" => return storage(tokens, SetMode::Cas(0), consumed, rest, limits),
        b"delete" => delete(tokens),
        b"incr" => arith(tokens, true),
        b"decr" => arith(tokens, false),
        b"touch" => touch(tokens),
        b"flush_all" => flush_all(tokens),
        b"version" => Ok(Command::Version),
        b"quit" => Ok(Command::Quit),
        b"verbosity" => verbosity(tokens),
        b"stats" => Ok(Command::Stats { group: tokens.get(1).map(|g| g.to_vec()) }),
        // memcached runs it whatever else the line holds; only a last `noreply` counts.
        b"refresh_certs" => Ok(Command::RefreshCerts { noreply: noreply(tokens) }),
        _ if is_http_request(tokens) => return Parse::Invalid(Invalid::close(consumed)),
        _ => Err(Invalid::line(reply::ERROR, 0)),
    };
    match result {
        Ok(command) => frame(command),
        Err(invalid) => Parse::Invalid(Invalid { consumed, ..invalid }),
    }
}

/// memcached closes the connection on an HTTP request line (`GET / HTTP/1.0`): an unknown
/// command of two or more bytes whose last token starts with `HTTP/`. Unknown commands
/// starting with a letter memcached dispatches early (`g s a c i d t`, and two-byte `m`
/// commands) are plain `ERROR`s.
fn is_http_request(tokens: &Tokens) -> bool {
    let name = tokens[0];
    let early = b"gsacidt".contains(&name[0]) || (name[0] == b'm' && name.len() == 2);
    let last_is_http = tokens.last().is_some_and(|t| t.starts_with(b"HTTP/"));
    name.len() >= 2 && !early && last_is_http
}

/// memcached's `set_noreply_maybe`: the last token is exactly `noreply`.
fn noreply(tokens: &Tokens) -> bool {
    tokens.last() == Some(&&b"noreply"[..])
}

fn error() -> Invalid {
    Invalid::line(reply::ERROR, 0)
}

fn bad_format() -> Invalid {
    Invalid::line(reply::BAD_FORMAT, 0)
}

fn retrieval(tokens: &Tokens, cas: bool, touch: bool) -> Result<Command, Invalid> {
    if tokens.len() < 2 {
        return Err(error());
    }
    let mut keys = &tokens[1..];
    let mut exptime = None;
    if touch {
        let t = strtol32(keys[0]).ok_or(Invalid::line(reply::BAD_EXPTIME, 0))?;
        exptime = Some(t);
        keys = &keys[1..];
    }
    if keys.iter().any(|k| k.len() > KEY_BYTES_MAX) {
        return Err(bad_format());
    }
    Ok(Command::Get(GetCommand { keys: keys.iter().map(|k| k.to_vec()).collect(), cas, touch: exptime }))
}

/// `<cmd> <key> <flags> <exptime> <bytes> [<cas unique>] [noreply]` then the data block.
/// A malformed line is answered and the next line is read as a command, even if it was meant
/// as the data block (memcached does this). Only a refused size swallows the block.
fn storage(tokens: &Tokens, mode: SetMode, consumed: usize, rest: &[u8], limits: &Limits) -> Parse {
    let base = if matches!(mode, SetMode::Cas(_)) { 6 } else { 5 };
    if tokens.len() != base && tokens.len() != base + 1 {
        return Parse::Invalid(Invalid::line(reply::ERROR, consumed));
    }
    let noreply = noreply(tokens);
    let bad = || Parse::Invalid(Invalid::line(reply::BAD_FORMAT, consumed).quiet_if(noreply));
    let key = tokens[1];
    if key.len() > KEY_BYTES_MAX {
        return bad();
    }
    let (Some(flags), Some(exptime)) = (strtoul32(tokens[2]), strtol32(tokens[3])) else {
        return bad();
    };
    if strtol32(tokens[4]).is_none() {
        return bad();
    }
    let mode = match mode {
        SetMode::Cas(_) => match strtoull(tokens[5]) {
            Some(unique) => SetMode::Cas(unique),
            None => return bad(),
        },
        other => other,
    };
    let Some(len) = data_length(tokens[4]) else {
        return bad();
    };
    let swallow = len + 2;
    if len > limits.value_bytes_max {
        let mut invalid = Invalid::swallowing(reply::TOO_LARGE, consumed, swallow).quiet_if(noreply);
        if mode == SetMode::Set {
            invalid.unlink = Some(key.to_vec());
        }
        return Parse::Invalid(invalid);
    }
    match data_block(rest, len) {
        None => Parse::Incomplete,
        Some(Err(())) => Parse::Invalid(bad_chunk(consumed + swallow, noreply)),
        Some(Ok(value)) => Parse::Frame {
            command: Command::Store(StoreCommand { mode, key: key.to_vec(), flags, exptime, value, noreply }),
            consumed: consumed + swallow,
        },
    }
}

/// A data block without its `\r\n`: memcached has read `len + 2` bytes as the block, drops
/// them, answers (unless `noreply`) and reads on from there.
pub(super) fn bad_chunk(consumed: usize, noreply: bool) -> Invalid {
    Invalid::line(reply::BAD_DATA_CHUNK, consumed).quiet_if(noreply)
}

/// `delete <key> [0] [noreply]`: memcached still accepts the legacy hold time if it is `0`.
fn delete(tokens: &Tokens) -> Result<Command, Invalid> {
    if !(2..=4).contains(&tokens.len()) {
        return Err(error());
    }
    let noreply = noreply(tokens);
    if tokens.len() > 2 {
        let hold_is_zero = tokens[2] == b"0";
        let valid = (tokens.len() == 3 && (hold_is_zero || noreply))
            || (tokens.len() == 4 && hold_is_zero && noreply);
        if !valid {
            return Err(Invalid::line(reply::DELETE_USAGE, 0).quiet_if(noreply));
        }
    }
    if tokens[1].len() > KEY_BYTES_MAX {
        return Err(bad_format().quiet_if(noreply));
    }
    Ok(Command::Delete { key: tokens[1].to_vec(), noreply })
}

fn arith(tokens: &Tokens, incr: bool) -> Result<Command, Invalid> {
    if tokens.len() != 3 && tokens.len() != 4 {
        return Err(error());
    }
    let noreply = noreply(tokens);
    if tokens[1].len() > KEY_BYTES_MAX {
        return Err(bad_format().quiet_if(noreply));
    }
    let delta = strtoull(tokens[2]).ok_or(Invalid::line(reply::BAD_DELTA, 0).quiet_if(noreply))?;
    Ok(Command::Arith { key: tokens[1].to_vec(), incr, delta, noreply })
}

fn touch(tokens: &Tokens) -> Result<Command, Invalid> {
    if tokens.len() != 3 && tokens.len() != 4 {
        return Err(error());
    }
    let noreply = noreply(tokens);
    if tokens[1].len() > KEY_BYTES_MAX {
        return Err(bad_format().quiet_if(noreply));
    }
    let exptime = strtol32(tokens[2]).ok_or(Invalid::line(reply::BAD_EXPTIME, 0).quiet_if(noreply))?;
    Ok(Command::Touch { key: tokens[1].to_vec(), exptime, noreply })
}

/// `flush_all [delay] [noreply]`.
fn flush_all(tokens: &Tokens) -> Result<Command, Invalid> {
    if tokens.len() > 3 {
        return Err(error());
    }
    let noreply = noreply(tokens);
    let has_delay = tokens.len() != if noreply { 2 } else { 1 };
    let delay = if has_delay {
        strtol32(tokens[1]).ok_or(Invalid::line(reply::BAD_EXPTIME, 0).quiet_if(noreply))?
    } else {
        0
    };
    Ok(Command::FlushAll { delay, noreply })
}

/// `verbosity <level> [noreply]`: memcached validates the level and answers OK.
fn verbosity(tokens: &Tokens) -> Result<Command, Invalid> {
    if tokens.len() != 2 && tokens.len() != 3 {
        return Err(error());
    }
    let noreply = noreply(tokens);
    strtoul32(tokens[1]).ok_or(bad_format().quiet_if(noreply))?;
    Ok(Command::Verbosity { noreply })
}
