//! Parser unit tests: each expected error line was checked against memcached 1.6.18.

use super::*;

fn p(input: &[u8]) -> Parse {
    parse(input, &Limits::default())
}

fn frame(input: &[u8]) -> Command {
    match p(input) {
        Parse::Frame { command, consumed } => {
            assert_eq!(consumed, input.len(), "whole input is one frame");
            command
        }
        other => panic!("expected a frame for {input:?}, got {other:?}"),
    }
}

fn invalid(input: &[u8]) -> Invalid {
    match p(input) {
        Parse::Invalid(invalid) => invalid,
        other => panic!("expected invalid for {input:?}, got {other:?}"),
    }
}

#[test]
fn get_multi_key_and_bare_newline() {
    let want = Command::Get(GetCommand { keys: vec![b"a".to_vec(), b"b".to_vec()], cas: false, touch: None });
    assert_eq!(frame(b"get a  b\r\n"), want);
    assert_eq!(frame(b"get a b\n"), want);
}

#[test]
fn gats_takes_exptime_first() {
    let want = Command::Get(GetCommand { keys: vec![b"k".to_vec()], cas: true, touch: Some(-5) });
    assert_eq!(frame(b"gats -5 k\r\n"), want);
    assert_eq!(invalid(b"gat x k\r\n").reply, Some(reply::BAD_EXPTIME));
}

#[test]
fn incomplete_until_line_and_block_arrive() {
    assert_eq!(p(b"get k"), Parse::Incomplete);
    assert_eq!(p(b"set k 0 0 5\r\nhel"), Parse::Incomplete);
    assert_eq!(p(b"set k 0 0 5\r\nhello\r"), Parse::Incomplete);
}

#[test]
fn set_with_noreply_and_cas() {
    let want = Command::Store(StoreCommand {
        mode: SetMode::Cas(42),
        key: b"k".to_vec(),
        flags: 7,
        exptime: 100,
        value: b"hi".to_vec(),
        noreply: true,
    });
    assert_eq!(frame(b"cas k 7 100 2 42 noreply\r\nhi\r\n"), want);
}

#[test]
fn unknown_and_empty_lines_are_error() {
    for line in [&b"foo\r\n"[..], b"\r\n", b"GET k\r\n", b"get\r\n", b"set k 0 0\r\n"] {
        assert_eq!(invalid(line).reply, Some(reply::ERROR), "{line:?}");
    }
}

#[test]
fn key_too_long() {
    let long = "a".repeat(251);
    let inv = invalid(format!("get {long}\r\n").as_bytes());
    assert_eq!((inv.reply, inv.close), (Some(reply::BAD_FORMAT), false));
    // As memcached: only the line is dropped; the data line is read as the next command.
    let inv = invalid(format!("set {long} 0 0 2\r\nhi\r\n").as_bytes());
    assert_eq!((inv.reply, inv.swallow, inv.close), (Some(reply::BAD_FORMAT), 0, false));
    let inv = invalid(format!("mg {long} v\r\n").as_bytes());
    assert_eq!(inv.reply, Some(reply::BAD_FORMAT));
}

#[test]
fn malformed_storage_lines_drop_only_the_line() {
    let cases: [(&[u8], &[u8]); 8] = [
        (b"set k 0 0 -1\r\n", reply::BAD_FORMAT),
        (b"set k 0 0 x\r\n", reply::BAD_FORMAT),
        (b"set k 0 0 4294967295\r\n", reply::BAD_FORMAT),
        (b"set k 0 0 2147483646\r\n", reply::BAD_FORMAT),
        (b"set k x 0 2\r\n", reply::BAD_FORMAT),
        (b"ms k x\r\n", reply::BAD_FORMAT),
        (b"set k 0 0\r\n", reply::ERROR),
        (b"cas k 0 0 2\r\n", reply::ERROR),
    ];
    for (line, want) in cases {
        let inv = invalid(&[line, b"hi\r\n"].concat());
        let got = (inv.reply, inv.consumed, inv.swallow, inv.close);
        assert_eq!(got, (Some(want), line.len(), 0, false), "{line:?}");
    }
    assert_eq!(invalid(b"set k x 0 2 noreply\r\nhi\r\n").reply, None);
}

#[test]
fn numbers_are_read_as_memcached_reads_them() {
    let Command::Store(st) = frame(b"set k 4294967296 +5 4294967297\r\na\r\n") else {
        panic!("expected a store");
    };
    assert_eq!((st.flags, st.exptime, st.value.len()), (0, 5, 1));
}

#[test]
fn bad_data_chunk_drops_the_block_and_goes_on() {
    let inv = invalid(b"set k 0 0 1\r\nab\r\n");
    assert_eq!((inv.reply, inv.consumed, inv.close), (Some(reply::BAD_DATA_CHUNK), 16, false));
    assert_eq!(invalid(b"set k 0 0 1 noreply\r\nab\r\n").reply, None);
    assert_eq!(invalid(b"ms k 1 q\r\nab\r\n").reply, Some(reply::BAD_DATA_CHUNK));
}

#[test]
fn http_request_line_closes_silently() {
    for line in [&b"GET / HTTP/1.0\r\n"[..], b"HEAD /x HTTP/1.1\r\n", b"foo HTTP/\r\n"] {
        let inv = invalid(line);
        assert_eq!((inv.reply, inv.close), (None, true), "{line:?}");
    }
    for line in [&b"x HTTP/1.0\r\n"[..], b"gxx / HTTP/1.0\r\n", b"mz / HTTP/1.0\r\n", b"foo HTTP/1.0 x\r\n"] {
        assert_eq!(invalid(line).reply, Some(reply::ERROR), "{line:?}");
    }
}

#[test]
fn too_large_is_swallowed_and_set_unlinks() {
    let limits = Limits { value_bytes_max: 4, ..Limits::default() };
    let Parse::Invalid(inv) = parse(b"set k 0 0 5\r\n", &limits) else {
        panic!("expected invalid");
    };
    assert_eq!(inv.reply, Some(reply::TOO_LARGE));
    assert_eq!((inv.consumed, inv.swallow, inv.close), (13, 7, false));
    assert_eq!(inv.unlink, Some(b"k".to_vec()));
    let Parse::Invalid(inv) = parse(b"add k 0 0 5 noreply\r\n", &limits) else {
        panic!("expected invalid");
    };
    assert_eq!((inv.reply, inv.unlink), (None, None));
}

#[test]
fn partial_line_too_long_closes_silently() {
    let long = vec![b'x'; 3000];
    let inv = invalid(&long);
    assert_eq!((inv.reply, inv.close), (None, true));
    // A complete line may be longer: memcached reads it whole and answers it.
    let key = "k".repeat(3000);
    assert_eq!(invalid(format!("set {key} 0 0 1\r\n").as_bytes()).reply, Some(reply::BAD_FORMAT));
    // Retrieval lines may be longer (multi-get of many keys).
    let mut get = b"get ".to_vec();
    get.extend(std::iter::repeat_n(b"k ", 2000).flatten());
    assert_eq!(p(&get), Parse::Incomplete);
}

#[test]
fn delete_forms() {
    let del = |noreply| Command::Delete { key: b"k".to_vec(), noreply };
    assert_eq!(frame(b"delete k\r\n"), del(false));
    assert_eq!(frame(b"delete k 0\r\n"), del(false));
    assert_eq!(frame(b"delete k noreply\r\n"), del(true));
    assert_eq!(frame(b"delete k 0 noreply\r\n"), del(true));
    assert_eq!(invalid(b"delete k 1\r\n").reply, Some(reply::DELETE_USAGE));
    assert_eq!(invalid(b"delete\r\n").reply, Some(reply::ERROR));
}

#[test]
fn arith_touch_flush_verbosity_errors() {
    assert_eq!(invalid(b"incr k -1\r\n").reply, Some(reply::BAD_DELTA));
    assert_eq!(invalid(b"incr k\r\n").reply, Some(reply::ERROR));
    assert_eq!(invalid(b"touch k x\r\n").reply, Some(reply::BAD_EXPTIME));
    assert_eq!(invalid(b"flush_all x\r\n").reply, Some(reply::BAD_EXPTIME));
    assert_eq!(invalid(b"flush_all 1 2 3\r\n").reply, Some(reply::ERROR));
    assert_eq!(invalid(b"verbosity\r\n").reply, Some(reply::ERROR));
    assert_eq!(invalid(b"verbosity x\r\n").reply, Some(reply::BAD_FORMAT));
    assert_eq!(invalid(b"verbosity noreply\r\n").reply, None);
    let flush = Command::FlushAll { delay: 10, noreply: true };
    assert_eq!(frame(b"flush_all 10 noreply\r\n"), flush);
}

#[test]
fn meta_get_flags_in_order() {
    let Command::MetaGet(mg) = frame(b"mg aGk= b v O12 k c\r\n") else {
        panic!("expected mg");
    };
    assert_eq!(mg.key, b"hi");
    assert_eq!(mg.meta.order, b"bvOkc");
    assert_eq!(mg.meta.opaque, Some(b"12".to_vec()));
    assert!(mg.value && mg.meta.ret_key && mg.meta.ret_cas && mg.meta.base64);
}

#[test]
fn meta_errors_match_memcached() {
    assert_eq!(invalid(b"mg\r\n").reply, Some(reply::ERROR));
    assert_eq!(invalid(b"mg k zz\r\n").reply, Some(reply::INVALID_FLAG));
    assert_eq!(invalid(b"mg k v v\r\n").reply, Some(reply::DUPLICATE_FLAG));
    assert_eq!(invalid(b"mg !!! b v\r\n").reply, Some(reply::BAD_KEY_ENCODING));
    assert_eq!(invalid(b"ma k D-1\r\n").reply, Some(reply::INVALID_OR_DUPLICATE_FLAG));
    assert_eq!(invalid(b"ma k Mx\r\n").reply, Some(reply::MA_BAD_MODE));
    let inv = invalid(b"ms k 2 MX\r\nhi\r\n");
    assert_eq!((inv.reply, inv.swallow), (Some(reply::MS_BAD_MODE), 4));
    assert_eq!(invalid(b"md k Z\r\n").reply, Some(reply::INVALID_OR_DUPLICATE_FLAG));
    assert_eq!(invalid(b"me\r\n").reply, Some(reply::BAD_FORMAT));
    assert_eq!(frame(b"me k x\r\n"), Command::MetaDebug { key: b"k".to_vec() });
    let opaque = |n| format!("mg k O{}\r\n", "o".repeat(n));
    assert!(matches!(p(opaque(31).as_bytes()), Parse::Frame { .. }));
    assert_eq!(invalid(opaque(32).as_bytes()).reply, Some(&b"CLIENT_ERROR opaque token too long\r\n"[..]));
    let inv = invalid(b"ms k 2 zz\r\nhi\r\n");
    assert_eq!((inv.reply, inv.swallow), (Some(reply::INVALID_FLAG), 4));
}

#[test]
fn meta_set_and_arith() {
    let Command::MetaSet(ms) = frame(b"ms k 2 T10 F3 ME c\r\nhi\r\n") else {
        panic!("expected ms");
    };
    assert_eq!((ms.mode, ms.client_flags, ms.meta.ttl), (SetMode::Add, 3, Some(10)));
    assert_eq!(ms.value, b"hi");
    let Command::MetaArith(ma) = frame(b"ma k N0 J5 D2 MD v\r\n") else {
        panic!("expected ma");
    };
    assert_eq!((ma.vivify, ma.initial, ma.delta), (Some(0), 5, 2));
    assert_eq!(ma.mode, ArithMode::Decr);
    assert_eq!(frame(b"mn\r\n"), Command::MetaNoop);
}

#[test]
fn meta_compare_cas() {
    let Command::MetaSet(ms) = frame(b"ms k 2 C7 MA\r\nhi\r\n") else {
        panic!("expected ms");
    };
    assert_eq!((ms.mode, ms.compare_cas), (SetMode::Append, Some(7)));
    let Command::MetaDelete(md) = frame(b"md k C0\r\n") else {
        panic!("expected md");
    };
    assert_eq!(md.compare_cas, Some(0));
    let Command::MetaArith(ma) = frame(b"ma k C0\r\n") else {
        panic!("expected ma");
    };
    assert_eq!(ma.compare_cas, None);
    let Command::MetaArith(ma) = frame(b"ma k C12\r\n") else {
        panic!("expected ma");
    };
    assert_eq!(ma.compare_cas, Some(12));
    assert_eq!(invalid(b"md k Cx\r\n").reply, Some(reply::INVALID_OR_DUPLICATE_FLAG));
    assert_eq!(
        invalid(b"ms k 1 Cx\r\na\r\n").reply,
        Some(&b"CLIENT_ERROR bad token in command line format\r\n"[..])
    );
}

#[test]
fn exptime_conversion() {
    let now = 1_700_000_000;
    assert_eq!(absolute_expiry(0, now), 0);
    assert_eq!(absolute_expiry(-1, now), 1);
    assert_eq!(absolute_expiry(100, now), now + 100);
    assert_eq!(absolute_expiry(2_592_000, now), now + 2_592_000);
    assert_eq!(absolute_expiry(2_592_001, now), 2_592_001);
}

#[test]
fn meta_access_flags() {
    let Command::MetaGet(mg) = frame(b"mg k h l N30 R-5 v\r\n") else {
        panic!("expected mg");
    };
    assert!(mg.ret_hit && mg.ret_last_access && mg.value);
    assert_eq!((mg.vivify, mg.recache), (Some(30), Some(-5)));
    let Command::MetaGet(mg) = frame(b"mg k v\r\n") else {
        panic!("expected mg");
    };
    assert!(!mg.ret_hit && !mg.ret_last_access && mg.vivify.is_none() && mg.recache.is_none());
    let bad_token = Some(&b"CLIENT_ERROR bad token in command line format\r\n"[..]);
    assert_eq!(invalid(b"mg k Nx\r\n").reply, bad_token);
    assert_eq!(invalid(b"mg k R\r\n").reply, bad_token);
    let Command::MetaDelete(md) = frame(b"md k I T30 q\r\n") else {
        panic!("expected md");
    };
    assert!(md.invalidate && md.meta.quiet);
    assert_eq!(md.meta.ttl, Some(30));
    assert_eq!(invalid(b"md k I Tx\r\n").reply, Some(reply::INVALID_OR_DUPLICATE_FLAG));
    let Command::MetaSet(ms) = frame(b"ms k 1 I C5\r\na\r\n") else {
        panic!("expected ms");
    };
    assert!(ms.invalidate);
    assert_eq!(ms.compare_cas, Some(5));
}
