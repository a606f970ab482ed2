//! Guards memcached compatibility byte for byte: every scripted byte sequence in
//! `memcached_differential.txt` is sent to Debian's `memcached` and to a `fawn up` cluster,
//! and the replies must be identical, except for the short list of intended differences the
//! script marks (see [`Differs`]). The script format is described at the top of that file.
//!
//! Needs `memcached` on the PATH, and `saslpasswd2` for the SASL cases (`scripts/test.sh`
//! installs Debian's memcached and sasl2-bin).

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Cluster, Shape};

const SCRIPT: &str = include_str!("memcached_differential.txt");
/// How long a step may take before its reply is recorded as cut short.
const STEP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a `~` step listens for a reply that is not followed by a barrier.
const QUIET: Duration = Duration::from_millis(300);
/// The request that ends every `>` step, and its reply, which marks the end of the step's
/// replies: a meta get of a key no case uses, whose opaque (the step number) comes back in its
/// `EN` reply; on a binary connection, a no-op whose opaque is the step number.
fn barrier(step: usize, binary: bool) -> (Vec<u8>, Vec<u8>) {
    if binary {
        let frame = |magic: u8| {
            let mut frame = vec![magic, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
            frame.extend_from_slice(&(step as u32).to_be_bytes());
            frame.extend_from_slice(&[0; 8]);
            frame
        };
        return (frame(0x80), frame(0x81));
    }
    let request = format!("mg differential-barrier O{step}\r\n").into_bytes();
    let reply = format!("EN O{step}\r\n").into_bytes();
    (request, reply)
}

/// A case speaks the binary protocol if its first byte is the request magic.
fn is_binary(case: &Case) -> bool {
    case.steps.first().is_some_and(|(_, bytes)| bytes.first() == Some(&0x80))
}

/// How a step's reply is collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Send the barrier after the step and read up to its `MN`.
    Barrier,
    /// Read whatever arrives within [`QUIET`] (the server is mid-request, or silent).
    Quiet,
    /// Read until the server closes the connection.
    Close,
}

/// Intended differences: the part of a reply masked out on both sides before comparing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Differs {
    /// The `version` string: FAWN names itself after the memcached release it follows.
    Version,
    /// cas uniques: memcached counts stores server-wide, FAWN's chain heads count per range,
    /// so the numbers differ while their use (`gets` then `cas`) behaves the same.
    Cas,
    /// `stats` values (pid, uptime, counters of a different history); names are compared.
    StatValues,
    /// `stats items`/`slabs`: memcached's slab classes depend on what earlier cases stored
    /// (a flushed item keeps its class listed until it is reclaimed); FAWN reports one class.
    /// Only class 1 and the totals are compared.
    StatClasses,
    /// `stats conns`: descriptors differ, and connections of earlier cases may still be
    /// closing; only the listener and the asking connection are compared, without numbers.
    StatConns,
    /// `me`'s `size` and `cls`: memcached counts its item header and picks a slab class by
    /// that size; FAWN has neither (it reports key plus value bytes and class 1).
    ItemSize,
    /// Idle seconds (`mg l`, `me la=`) of 0 and 1 compare equal: memcached's clock ticks once
    /// a second from its own start, so a case can straddle a tick on one server only.
    Idle,
}

struct Case {
    name: String,
    line: usize,
    steps: Vec<(Wait, Vec<u8>)>,
    differs: Vec<Differs>,
    /// A memcached feature FAWN lacks (the reason): a difference is reported, not failed.
    missing: Option<String>,
    /// Runs against servers that require SASL PLAIN (`%sasl`), without a flush before.
    sasl: bool,
}

fn parse_script(text: &str) -> Vec<Case> {
    let mut cases: Vec<Case> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix("== ") {
            let (name, line, steps, differs) = (name.to_string(), i + 1, Vec::new(), Vec::new());
            cases.push(Case { name, line, steps, differs, missing: None, sasl: false });
            continue;
        }
        let case = cases.last_mut().unwrap_or_else(|| panic!("line {}: step before any case", i + 1));
        if line == "%sasl" {
            case.sasl = true;
            continue;
        }
        if let Some(reason) = line.strip_prefix("%missing ") {
            case.missing = Some(reason.to_string());
            continue;
        }
        if let Some(tags) = line.strip_prefix("%differs ") {
            case.differs.extend(tags.split_whitespace().map(|t| match t {
                "version" => Differs::Version,
                "cas" => Differs::Cas,
                "stat-values" => Differs::StatValues,
                "stat-classes" => Differs::StatClasses,
                "stat-conns" => Differs::StatConns,
                "item-size" => Differs::ItemSize,
                "idle" => Differs::Idle,
                other => panic!("line {}: unknown difference {other}", i + 1),
            }));
            continue;
        }
        let (wait, body) = match line.split_at(2) {
            ("> ", body) => (Wait::Barrier, body),
            ("~ ", body) => (Wait::Quiet, body),
            ("! ", body) => (Wait::Close, body),
            _ => panic!("line {}: unknown step {line:?}", i + 1),
        };
        case.steps.push((wait, unescape(body, i + 1)));
    }
    cases
}

/// `\r \n \t \\ \{ \xHH`, and `{c*N}` for N copies of the character c.
fn unescape(body: &str, line: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('r') => out.push(b'\r'),
                Some('n') => out.push(b'\n'),
                Some('t') => out.push(b'\t'),
                Some('x') => {
                    let hex: String = chars.by_ref().take(2).collect();
                    out.push(u8::from_str_radix(&hex, 16).unwrap_or_else(|_| panic!("line {line}: bad \\x")));
                }
                Some(other) => out.extend(other.to_string().as_bytes()),
                None => panic!("line {line}: trailing backslash"),
            },
            '{' => {
                let spec: String = chars.by_ref().take_while(|c| *c != '}').collect();
                let (unit, count) = spec.split_once('*').unwrap_or_else(|| panic!("line {line}: bad {{}}"));
                let count: usize = count.parse().unwrap_or_else(|_| panic!("line {line}: bad count"));
                out.extend(unit.repeat(count).as_bytes());
            }
            c => out.extend(c.to_string().as_bytes()),
        }
    }
    out
}

/// What one server answered to a case: one entry per step.
type Transcript = Vec<Vec<u8>>;

fn run_case(addr: &str, case: &Case) -> Transcript {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut cas: Option<String> = None;
    let mut transcript = Vec::new();
    for (step, (wait, request)) in case.steps.iter().enumerate() {
        let request = substitute_cas(request, cas.as_deref());
        let mut bytes = request.clone();
        let (barrier, end) = barrier(step, is_binary(case));
        if *wait == Wait::Barrier {
            bytes.extend_from_slice(&barrier);
        }
        if stream.write_all(&bytes).is_err() {
            transcript.push(b"<write failed>".to_vec());
            break;
        }
        let (reply, closed) = read_reply(&mut stream, *wait, &end);
        if let Some(unique) = last_cas(&reply) {
            cas = Some(unique);
        }
        let mut entry = reply;
        if closed {
            entry.extend_from_slice(b"<closed>");
        }
        transcript.push(entry);
        if closed {
            break;
        }
    }
    transcript
}

/// `$CAS` in a request is this server's last cas unique seen in the case.
fn substitute_cas(request: &[u8], cas: Option<&str>) -> Vec<u8> {
    let text = String::from_utf8_lossy(request);
    match (text.contains("$CAS"), cas) {
        (true, Some(cas)) => text.replace("$CAS", cas).into_bytes(),
        _ => request.to_vec(),
    }
}

/// The last cas unique in a reply: the 5th field of a `VALUE` line, a meta `c` flag, or
/// `me`'s `cas=`.
fn last_cas(reply: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(reply);
    let mut found = None;
    for line in text.split("\r\n") {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields[0] == "VALUE" && fields.len() == 5 {
            found = Some(fields[4].to_string());
        } else if fields[0] == "ME" {
            found = fields.iter().find_map(|f| f.strip_prefix("cas=")).map(str::to_string).or(found);
        } else if matches!(fields[0], "HD" | "VA" | "EN" | "NF" | "NS" | "EX") {
            let flag =
                fields.iter().find(|f| f.starts_with('c') && f[1..].bytes().all(|b| b.is_ascii_digit()));
            if let Some(flag) = flag.filter(|f| f.len() > 1) {
                found = Some(flag[1..].to_string());
            }
        }
    }
    found
}

/// Reads a step's reply; `true` if the server closed the connection.
fn read_reply(stream: &mut TcpStream, wait: Wait, end: &[u8]) -> (Vec<u8>, bool) {
    let deadline = Instant::now() + if wait == Wait::Quiet { QUIET } else { STEP_TIMEOUT };
    let mut reply = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    loop {
        let now = Instant::now();
        if now >= deadline {
            if wait != Wait::Quiet {
                reply.extend_from_slice(b"<timed out>");
            }
            return (reply, false);
        }
        stream.set_read_timeout(Some(deadline - now)).expect("timeout");
        match stream.read(&mut chunk) {
            Ok(0) => return (reply, true),
            Ok(n) => reply.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return (reply, true),
        }
        if wait == Wait::Barrier && reply.ends_with(end) {
            reply.truncate(reply.len() - end.len());
            return (reply, false);
        }
    }
}

/// Applies a case's intended differences to one transcript.
fn mask(transcript: &Transcript, differs: &[Differs], binary: bool) -> Vec<String> {
    if binary {
        return transcript.iter().map(|step| mask_frames(step, differs)).collect();
    }
    transcript
        .iter()
        .map(|step| {
            let text = String::from_utf8_lossy(step);
            let mut lines: Vec<&str> = text.split("\r\n").collect();
            if differs.contains(&Differs::StatClasses) {
                lines.retain(|line| stat_class(line).is_none_or(|class| class == "1"));
            }
            let lines: Vec<String> = if differs.contains(&Differs::StatConns) {
                conns_of_interest(&lines)
            } else {
                lines.iter().map(|line| line.to_string()).collect()
            };
            let lines = lines.iter().map(|line| mask_line(line, differs));
            lines.collect::<Vec<_>>().join("\r\n")
        })
        .collect()
}

/// The slab class of a `STAT items:<class>:<field>` or `STAT <class>:<field>` line.
fn stat_class(line: &str) -> Option<&str> {
    let name = line.strip_prefix("STAT ")?.split(' ').next()?;
    let name = name.strip_prefix("items:").unwrap_or(name);
    let (class, _) = name.split_once(':')?;
    class.bytes().all(|b| b.is_ascii_digit()).then_some(class)
}

/// `stats conns` lines of the listener and of the connection whose state is
/// `conn_parse_cmd` (the asker), with `<fd>` for descriptors; other lines as they are.
fn conns_of_interest(lines: &[&str]) -> Vec<String> {
    let state = |fd: &str| {
        let prefix = format!("STAT {fd}:state ");
        lines.iter().find_map(|line| line.strip_prefix(prefix.as_str())).unwrap_or("")
    };
    let mut kept = Vec::new();
    for line in lines {
        match stat_class(line) {
            None => kept.push(line.to_string()),
            Some(fd) if matches!(state(fd), "conn_listening" | "conn_parse_cmd") => {
                kept.push(line.replacen(&format!("STAT {fd}:"), "STAT <fd>:", 1));
            }
            Some(_) => {}
        }
    }
    kept
}

fn mask_line(line: &str, differs: &[Differs]) -> String {
    let mut fields: Vec<String> = line.split(' ').map(str::to_string).collect();
    let head = fields[0].clone();
    for differ in differs {
        match differ {
            Differs::Version if head == "VERSION" && fields.len() == 2 => fields[1] = "<version>".into(),
            Differs::StatValues if head == "STAT" && fields.len() >= 3 => {
                fields.truncate(2);
                fields.push("<value>".into());
            }
            Differs::Cas if head == "VALUE" && fields.len() == 5 => fields[4] = "<cas>".into(),
            Differs::Cas if matches!(head.as_str(), "HD" | "VA" | "EN" | "NF" | "NS" | "EX") => {
                mask_flag(&mut fields, 'c', |_| true);
            }
            Differs::Idle if matches!(head.as_str(), "HD" | "VA") => {
                mask_flag(&mut fields, 'l', |value| matches!(value, "0" | "1"));
            }
            Differs::Cas if head == "ME" => mask_field(&mut fields, "cas=", |_| true),
            Differs::ItemSize if head == "ME" => {
                mask_field(&mut fields, "size=", |_| true);
                mask_field(&mut fields, "cls=", |_| true);
            }
            Differs::Idle if head == "ME" => {
                mask_field(&mut fields, "la=", |value| matches!(value, "0" | "1"))
            }
            _ => {}
        }
    }
    fields.join(" ")
}

/// Masks the value of a meta return flag (`<letter><digits>`) where `masked` holds.
fn mask_flag(fields: &mut [String], letter: char, masked: impl Fn(&str) -> bool) {
    for f in fields.iter_mut().skip(1) {
        let Some(value) = f.strip_prefix(letter) else { continue };
        if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) && masked(value) {
            *f = format!("{letter}<masked>");
        }
    }
}

/// Masks the value of a `name=value` field (`me`) where `masked` holds.
fn mask_field(fields: &mut [String], name: &str, masked: impl Fn(&str) -> bool) {
    for f in fields.iter_mut() {
        if f.strip_prefix(name).is_some_and(&masked) {
            *f = format!("{name}<masked>");
        }
    }
}

/// Binary responses, one per line in hex, with the cas (and a version's body) masked if the
/// case says they differ; trailing bytes that are not a whole frame are shown as they are.
fn mask_frames(step: &[u8], differs: &[Differs]) -> String {
    let mut lines = Vec::new();
    let mut rest = step;
    while rest.len() >= 24 && rest[0] == 0x81 {
        let body_len = u32::from_be_bytes([rest[8], rest[9], rest[10], rest[11]]) as usize;
        let Some(frame) = rest.get(..24 + body_len) else { break };
        let mut frame = frame.to_vec();
        if differs.contains(&Differs::Cas) {
            frame[16..24].fill(0);
        }
        if differs.contains(&Differs::Version) && frame[1] == 0x0b {
            frame.truncate(24);
            frame[8..12].fill(0);
        }
        lines.push(frame.iter().map(|b| format!("{b:02x}")).collect::<String>());
        rest = &rest[24 + body_len..];
    }
    lines.push(String::from_utf8_lossy(rest).into_owned());
    lines.join(" | ")
}

/// Clears both servers between cases, so each case starts from an empty cache. FAWN's
/// `flush_all` reaches every back-end and answers `SERVER_ERROR` when one is slow (a loaded
/// machine); that is setup, not a case, so it is retried a few times.
fn flush(addr: &str) {
    const ATTEMPTS: u32 = 5;
    for attempt in 1..=ATTEMPTS {
        let mut stream = TcpStream::connect(addr).expect("connect");
        stream.write_all(b"flush_all\r\n").expect("flush");
        stream.set_read_timeout(Some(STEP_TIMEOUT)).expect("timeout");
        let mut reply = Vec::new();
        let mut byte = [0u8; 1];
        while !reply.ends_with(b"\n") {
            stream.read_exact(&mut byte).expect("flush reply");
            reply.push(byte[0]);
        }
        if reply == b"OK\r\n" {
            return;
        }
        let text = String::from_utf8_lossy(&reply);
        assert!(
            text.starts_with("SERVER_ERROR") && attempt < ATTEMPTS,
            "flush_all at {addr} answered {text:?} (attempt {attempt})"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Debian's memcached on a free loopback port, one worker thread, killed on drop.
struct Memcached {
    child: Child,
    addr: String,
}

impl Memcached {
    fn start() -> Memcached {
        Memcached::start_with(&[], None)
    }

    /// With `-S` (SASL, binary protocol only) and Cyrus SASL's configuration in `sasl_conf`.
    fn start_sasl(sasl_conf: &Path) -> Memcached {
        Memcached::start_with(&["-S", "-B", "binary"], Some(sasl_conf))
    }

    fn start_with(args: &[&str], sasl_conf: Option<&Path>) -> Memcached {
        let port = TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let mut command = Command::new("memcached");
        command.args(["-p", &port.to_string(), "-U", "0", "-l", "127.0.0.1", "-t", "1"]).args(args);
        if root {
            command.args(["-u", "root"]);
        }
        if let Some(dir) = sasl_conf {
            command.env("SASL_CONF_PATH", dir);
        }
        let child = command.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap_or_else(|e| {
            panic!("cannot start memcached ({e}); install Debian's package (scripts/test.sh does)")
        });
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "memcached did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Memcached { child, addr }
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn show(lines: &[String]) -> String {
    lines.iter().enumerate().map(|(i, s)| format!("  step {}: {:?}\n", i + 1, s)).collect()
}

/// Whether two servers' replies are the same but for remaining TTLs (meta flag `t<N>`) one
/// second apart: each server reads its clock when it answers, and a second may pass between.
fn ttls_within_a_second(want: &[String], got: &[String]) -> bool {
    let ttl = |t: &str| t.strip_prefix('t').and_then(|n| n.parse::<i64>().ok());
    let same_token =
        |a: &str, b: &str| a == b || matches!((ttl(a), ttl(b)), (Some(x), Some(y)) if (x - y).abs() <= 1);
    want.len() == got.len()
        && want.iter().zip(got).all(|(w, g)| {
            let (w, g): (Vec<&str>, Vec<&str>) =
                (w.split_whitespace().collect(), g.split_whitespace().collect());
            w.len() == g.len() && w.iter().zip(&g).all(|(a, b)| same_token(a, b))
        })
}

/// Runs the cases against both servers; panics listing the cases that differ.
fn compare(cases: &[&Case], memcached: &str, fawn: &str) {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    let mut failures = Vec::new();
    for case in cases {
        if !case.sasl {
            flush(memcached);
            flush(fawn);
        }
        let want = run_case(memcached, case);
        let got = run_case(fawn, case);
        let exact = want == got;
        let binary = is_binary(case);
        let (want, got) = (mask(&want, &case.differs, binary), mask(&got, &case.differs, binary));
        let exact = exact || ttls_within_a_second(&want, &got);
        let verdict = match (exact, want == got, &case.missing) {
            (true, _, _) => "identical",
            (false, true, _) => "intended difference",
            (false, false, Some(_)) => "missing",
            (false, false, None) => "different",
        };
        *counts.entry(verdict).or_default() += 1;
        if verdict != "identical" {
            eprintln!("{verdict}: {:?} {:?}", case.name, case.differs);
        }
        if let (Some(reason), true) = (&case.missing, want == got) {
            eprintln!("case {:?} is marked missing ({reason}) but now matches: drop the mark", case.name);
        }
        if verdict == "different" {
            failures.push(format!(
                "case {:?} (line {}):\n memcached:\n{} fawn:\n{}",
                case.name,
                case.line,
                show(&want),
                show(&got)
            ));
        }
    }
    let count = |verdict| counts.get(verdict).copied().unwrap_or(0);
    eprintln!(
        "memcached differential: {} scripts, {} identical, {} intended differences, {} missing \
         features, {} different",
        cases.len(),
        count("identical"),
        count("intended difference"),
        count("missing"),
        count("different")
    );
    assert!(failures.is_empty(), "{} cases differ:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn replies_match_memcached_byte_for_byte() {
    let cases = parse_script(SCRIPT);
    assert!(cases.len() >= 200, "the script has {} cases", cases.len());
    let memcached = Memcached::start();
    let cluster = Cluster::start(Shape::default());
    let plain: Vec<&Case> = cases.iter().filter(|case| !case.sasl).collect();
    compare(&plain, &memcached.addr, &cluster.frontend_memcached(0));
}

/// The SASL user both servers know.
const SASL_USER: &str = "alice";
const SASL_PASSWORD: &str = "secret";

/// The `%sasl` cases against memcached with SASL (its user in a Cyrus sasldb made with
/// `saslpasswd2`) and `fawn up` with the same user in its `--memcached-auth-file`.
#[test]
fn sasl_replies_match_memcached_byte_for_byte() {
    let cases = parse_script(SCRIPT);
    let sasl: Vec<&Case> = cases.iter().filter(|case| case.sasl).collect();
    assert!(sasl.len() >= 5, "the script has {} SASL cases", sasl.len());
    let dir = tempfile::tempdir().expect("tempdir");
    let sasldb = dir.path().join("sasldb2");
    let conf = format!("mech_list: plain\nsasldb_path: {}\n", sasldb.display());
    std::fs::write(dir.path().join("memcached.conf"), conf).expect("sasl conf");
    let mut saslpasswd = Command::new("saslpasswd2")
        .args(["-a", "memcached", "-c", "-p", "-f"])
        .arg(&sasldb)
        .arg(SASL_USER)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run saslpasswd2 ({e}); install Debian's sasl2-bin (scripts/test.sh does)")
        });
    saslpasswd.stdin.take().expect("stdin").write_all(SASL_PASSWORD.as_bytes()).expect("password");
    assert!(saslpasswd.wait().expect("saslpasswd2").success(), "saslpasswd2 failed");
    let users = dir.path().join("users");
    std::fs::write(&users, format!("{SASL_USER}:{SASL_PASSWORD}\n")).expect("user file");

    let memcached = Memcached::start_sasl(dir.path());
    let args = ["--memcached-auth-file".to_string(), users.display().to_string()];
    let cluster = Cluster::start_with(Shape::default(), &args);
    compare(&sasl, &memcached.addr, &cluster.frontend_memcached(0));
}
