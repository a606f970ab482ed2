//! Binary-protocol requests: the same cluster operations as the text commands, answered with
//! binary response frames (status, cas, extras, key, value), as memcached 1.6.18 answers them.
//! Quiet opcodes send nothing on success (gets: nothing on a miss); errors are always sent.

use fawn_proto::memcache::binary::{self, BinCommand, BinRequest, Status};
use fawn_proto::memcache::{absolute_expiry, SetMode};
use fawn_proto::op::{Guarded, Mutation, Outcome, Update};

use super::{admin, bare_update, get, now, store, Ctx, Flow};
use crate::memcache::stats::Stats;
use crate::service::{KvService, ServiceError};

/// A non-zero request cas on delete, append, prepend, increment and decrement: the update
/// applies only to an item with that cas (`Exists` otherwise), as memcached 1.6 does.
fn guarded(req: &BinRequest, then: Guarded) -> Mutation {
    match req.cas {
        0 => then.into(),
        unique => Mutation::IfCas { unique, then },
    }
}

/// Runs one binary request.
pub(in crate::memcache) async fn run<S: KvService>(ctx: &mut Ctx<'_, S>, req: BinRequest) -> Flow {
    let result = match req.command.clone() {
        BinCommand::Get { with_key, quiet, touch } => get_item(ctx, &req, with_key, quiet, touch).await,
        BinCommand::Store { mode, flags, exptime, value, quiet } => {
            store_item(
                ctx,
                &req,
                mode,
                Update {
                    key: req.key.clone(),
                    mutation: store::mutation(mode),
                    value,
                    flags,
                    expiry: absolute_expiry(exptime, now()),
                },
                quiet,
            )
            .await
        }
        BinCommand::Delete { quiet } => delete(ctx, &req, quiet).await,
        BinCommand::Arith { incr, delta, initial, exptime, quiet } => {
            arith(ctx, &req, incr, delta, initial, exptime, quiet).await
        }
        BinCommand::Touch { exptime } => get_item(ctx, &req, false, false, Some(exptime)).await,
        BinCommand::Flush { delay, quiet } => flush(ctx, &req, delay, quiet).await,
        BinCommand::Noop | BinCommand::Verbosity => {
            ok(ctx, &req, 0, &[], &[]);
            Ok(())
        }
        BinCommand::Version => {
            let version = ctx.shared.config.version.clone();
            ok(ctx, &req, 0, &[], version.as_bytes());
            Ok(())
        }
        BinCommand::Quit { quiet } => {
            if !quiet {
                ok(ctx, &req, 0, &[], &[]);
            }
            return Flow::Close;
        }
        BinCommand::Stat => stat(ctx, &req).await,
        // SASL changes the connection's state, so the session answers it before this runs.
        BinCommand::SaslList | BinCommand::SaslAuth { .. } | BinCommand::SaslStep => {
            fail(ctx, &req, Status::UnknownCommand);
            Ok(())
        }
    };
    if let Err(error) = result {
        Stats::incr(&ctx.stats().counters.server_errors);
        let status = match error {
            ServiceError::TooLarge => Status::TooLarge,
            _ => Status::TemporaryFailure,
        };
        fail(ctx, &req, status);
    }
    Flow::Continue
}

fn ok<S: KvService>(ctx: &mut Ctx<'_, S>, req: &BinRequest, cas: u64, extras: &[u8], value: &[u8]) {
    binary::response(ctx.out(), (req.opcode, req.opaque, Status::Ok), cas, extras, &[], value);
}

fn fail<S: KvService>(ctx: &mut Ctx<'_, S>, req: &BinRequest, status: Status) {
    binary::error(ctx.out(), req.opcode, req.opaque, status);
}

/// get/getk/getq/getkq, gat/gatk/gatq/gatkq and touch (which answers the flags only).
async fn get_item<S: KvService>(
    ctx: &mut Ctx<'_, S>,
    req: &BinRequest,
    with_key: bool,
    quiet: bool,
    touch: Option<i32>,
) -> Result<(), ServiceError> {
    let item = match touch {
        None => get::fetch(ctx, &req.key).await?,
        Some(exptime) => get::touch_and_fetch(ctx, &req.key, exptime).await?,
    };
    let Some(item) = item else {
        // memcached answers a getk/gatk miss with the key instead of the message.
        let head = (req.opcode, req.opaque, Status::NotFound);
        match (quiet, with_key) {
            (true, _) => {}
            (false, true) => binary::response(ctx.out(), head, 0, &[], &req.key, &[]),
            (false, false) => fail(ctx, req, Status::NotFound),
        }
        return Ok(());
    };
    let is_touch = req.opcode == binary::opcode::TOUCH;
    get::read(ctx, &req.key, &item);
    let key: &[u8] = if with_key { &req.key } else { &[] };
    let value: &[u8] = if is_touch { &[] } else { &item.value };
    let head = (req.opcode, req.opaque, Status::Ok);
    binary::response(ctx.out(), head, item.cas, &item.flags.to_be_bytes(), key, value);
    Ok(())
}

/// set/add/replace/append/prepend; a non-zero request cas makes set and replace a
/// compare-and-set and guards append and prepend; add ignores it, as in memcached.
async fn store_item<S: KvService>(
    ctx: &mut Ctx<'_, S>,
    req: &BinRequest,
    mode: SetMode,
    mut update: Update,
    quiet: bool,
) -> Result<(), ServiceError> {
    Stats::incr(&ctx.stats().counters.cmd_set);
    update.mutation = match mode {
        SetMode::Set | SetMode::Replace if req.cas != 0 => Mutation::Cas { unique: req.cas },
        SetMode::Append => guarded(req, Guarded::Append),
        SetMode::Prepend => guarded(req, Guarded::Prepend),
        _ => update.mutation,
    };
    let outcome = ctx.service().update(update).await?;
    let status = match outcome {
        Outcome::Stored { cas } => {
            Stats::incr(&ctx.stats().counters.total_items);
            if !quiet {
                ok(ctx, req, cas, &[], &[]);
            }
            return Ok(());
        }
        Outcome::Exists => Status::Exists,
        Outcome::NotFound => Status::NotFound,
        _ => match mode {
            SetMode::Add => Status::Exists,
            SetMode::Replace => Status::NotFound,
            _ => Status::NotStored,
        },
    };
    fail(ctx, req, status);
    Ok(())
}

async fn delete<S: KvService>(
    ctx: &mut Ctx<'_, S>,
    req: &BinRequest,
    quiet: bool,
) -> Result<(), ServiceError> {
    let mutation = guarded(req, Guarded::Delete);
    let outcome = ctx.service().update(bare_update(req.key.clone(), mutation, 0)).await?;
    let counters = &ctx.stats().counters;
    if matches!(outcome, Outcome::Deleted) {
        Stats::incr(&counters.delete_hits);
        if !quiet {
            ok(ctx, req, 0, &[], &[]);
        }
    } else if matches!(outcome, Outcome::Exists) {
        fail(ctx, req, Status::Exists);
    } else {
        Stats::incr(&counters.delete_misses);
        fail(ctx, req, Status::NotFound);
    }
    Ok(())
}

/// incr/decr: a miss is created at `initial` (and not incremented) unless `exptime` is
/// `0xffffffff`; if another client creates it first, the delta is applied to theirs.
async fn arith<S: KvService>(
    ctx: &mut Ctx<'_, S>,
    req: &BinRequest,
    incr: bool,
    delta: u64,
    initial: u64,
    exptime: u32,
    quiet: bool,
) -> Result<(), ServiceError> {
    let mutation = guarded(req, if incr { Guarded::Incr { delta } } else { Guarded::Decr { delta } });
    for _ in 0..2 {
        let outcome = ctx.service().update(bare_update(req.key.clone(), mutation, 0)).await?;
        let counters = &ctx.stats().counters;
        let (value, cas) = match outcome {
            Outcome::Counter { value, cas } => (value, cas),
            Outcome::NonNumeric => {
                fail(ctx, req, Status::NonNumeric);
                return Ok(());
            }
            Outcome::Exists => {
                fail(ctx, req, Status::Exists);
                return Ok(());
            }
            _ if exptime == u32::MAX => {
                Stats::incr(if incr { &counters.incr_misses } else { &counters.decr_misses });
                fail(ctx, req, Status::NotFound);
                return Ok(());
            }
            _ => {
                let expiry = absolute_expiry(exptime as i32, now());
                let create = Update {
                    key: req.key.clone(),
                    mutation: Mutation::Add,
                    value: initial.to_string().into_bytes(),
                    flags: 0,
                    expiry,
                };
                match ctx.service().update(create).await? {
                    Outcome::Stored { cas } => (initial, cas),
                    _ => continue,
                }
            }
        };
        Stats::incr(if incr { &counters.incr_hits } else { &counters.decr_hits });
        if !quiet {
            ok(ctx, req, cas, &[], &value.to_be_bytes());
        }
        return Ok(());
    }
    fail(ctx, req, Status::NotFound);
    Ok(())
}

async fn flush<S: KvService>(
    ctx: &mut Ctx<'_, S>,
    req: &BinRequest,
    delay: i32,
    quiet: bool,
) -> Result<(), ServiceError> {
    Stats::incr(&ctx.stats().counters.cmd_flush);
    let now = now();
    let at = if delay <= 0 { now } else { absolute_expiry(delay, now) };
    ctx.service().flush_all(at).await?;
    if !quiet {
        ok(ctx, req, 0, &[], &[]);
    }
    Ok(())
}

/// `stat` with no group: one frame per general stat (key = name, value = value), then an
/// empty frame. `reset` clears the counters. Other groups are `Not found`.
async fn stat<S: KvService>(ctx: &mut Ctx<'_, S>, req: &BinRequest) -> Result<(), ServiceError> {
    let head = (req.opcode, req.opaque, Status::Ok);
    match &req.key[..] {
        b"" => {
            for (name, value) in admin::general_stats(ctx).await? {
                binary::response(ctx.out(), head, 0, &[], name.as_bytes(), value.as_bytes());
            }
        }
        b"reset" => ctx.stats().reset(),
        _ => {
            fail(ctx, req, Status::NotFound);
            return Ok(());
        }
    }
    binary::response(ctx.out(), head, 0, &[], &[], &[]);
    Ok(())
}
