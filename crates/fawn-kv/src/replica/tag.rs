//! A request's id and outcome as the tag of the record its update wrote (FAWN-DS record
//! format 3), so that the outcome is exactly as durable as the record: `client u64 | seq
//! u64 | code u8 | [value u64] | [cas u64]`, little-endian. The code's low nibble is the
//! outcome; bit 7 says the cas is the record's own seq and is left out (the usual case: 17
//! bytes for a set, 25 for an incr); for `Claimed`, bits 4 and 5 are `won` and `created`.

use fawn_ds::limits::TAG_BYTES_MAX;
use fawn_proto::native::ReqId;
use fawn_proto::op::Outcome;

/// Bytes of the longest tag: ids, code, a counter's value and a cas.
const OUTCOME_TAG_BYTES_MAX: usize = 8 + 8 + 1 + 8 + 8;
const _: () = assert!(OUTCOME_TAG_BYTES_MAX <= TAG_BYTES_MAX);

const CAS_IS_SEQ: u8 = 0x80;
const WON: u8 = 0x10;
const CREATED: u8 = 0x20;

/// The tag of one record (empty: the update came without its request).
pub struct OutcomeTag {
    buf: [u8; OUTCOME_TAG_BYTES_MAX],
    len: usize,
}

impl OutcomeTag {
    /// The tag of the record of `seq`: the request and outcome it answers (its origin), or
    /// none.
    pub fn of(origin: Option<(ReqId, &Outcome)>, seq: u64) -> OutcomeTag {
        let mut t = OutcomeTag { buf: [0; OUTCOME_TAG_BYTES_MAX], len: 0 };
        if let Some((req, outcome)) = origin {
            t.encode(req, outcome, seq);
        }
        t
    }

    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    fn encode(&mut self, req: ReqId, outcome: &Outcome, seq: u64) {
        self.put(&req.client.to_le_bytes());
        self.put(&req.seq.to_le_bytes());
        let (code, value, cas) = match *outcome {
            Outcome::Stored { cas } => (0, None, Some(cas)),
            Outcome::NotStored => (1, None, None),
            Outcome::Exists => (2, None, None),
            Outcome::NotFound => (3, None, None),
            Outcome::Deleted => (4, None, None),
            Outcome::Counter { value, cas } => (5, Some(value), Some(cas)),
            Outcome::Touched { cas } => (6, None, Some(cas)),
            Outcome::NonNumeric => (7, None, None),
            Outcome::Claimed { won, created, cas } => {
                (8 | if won { WON } else { 0 } | if created { CREATED } else { 0 }, None, Some(cas))
            }
            Outcome::Invalidated { cas } => (9, None, Some(cas)),
        };
        let elided = cas == Some(seq);
        self.put(&[code | if elided { CAS_IS_SEQ } else { 0 }]);
        if let Some(v) = value {
            self.put(&v.to_le_bytes());
        }
        if let Some(c) = cas.filter(|_| !elided) {
            self.put(&c.to_le_bytes());
        }
    }

    /// The request and outcome in the tag of the record of `seq`; `None` for a tag this
    /// code did not write (it is ignored: the retry is decided again).
    pub fn decode(tag: &[u8], seq: u64) -> Option<(ReqId, Outcome)> {
        let (client, rest) = tag.split_first_chunk::<8>()?;
        let (req_seq, rest) = rest.split_first_chunk::<8>()?;
        let (&code, mut rest) = rest.split_first()?;
        let mut u64_next = || -> Option<u64> {
            let (v, r) = rest.split_first_chunk::<8>()?;
            rest = r;
            Some(u64::from_le_bytes(*v))
        };
        let variant = code & 0x0F;
        let value = if variant == 5 { Some(u64_next()?) } else { None };
        let has_cas = matches!(variant, 0 | 5 | 6 | 8 | 9);
        let cas = match (has_cas, code & CAS_IS_SEQ != 0) {
            (true, true) => seq,
            (true, false) => u64_next()?,
            (false, _) => 0,
        };
        let flags_ok = code & (WON | CREATED) == 0 || variant == 8;
        let cas_flag_ok = has_cas || code & CAS_IS_SEQ == 0;
        if !rest.is_empty() || !flags_ok || !cas_flag_ok {
            return None;
        }
        let outcome = match variant {
            0 => Outcome::Stored { cas },
            1 => Outcome::NotStored,
            2 => Outcome::Exists,
            3 => Outcome::NotFound,
            4 => Outcome::Deleted,
            5 => Outcome::Counter { value: value?, cas },
            6 => Outcome::Touched { cas },
            7 => Outcome::NonNumeric,
            8 => Outcome::Claimed { won: code & WON != 0, created: code & CREATED != 0, cas },
            9 => Outcome::Invalidated { cas },
            _ => return None,
        };
        let req = ReqId { client: u64::from_le_bytes(*client), seq: u64::from_le_bytes(*req_seq) };
        Some((req, outcome))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcomes(cas: u64) -> Vec<Outcome> {
        vec![
            Outcome::Stored { cas },
            Outcome::NotStored,
            Outcome::Exists,
            Outcome::NotFound,
            Outcome::Deleted,
            Outcome::Counter { value: u64::MAX - 3, cas },
            Outcome::Touched { cas },
            Outcome::NonNumeric,
            Outcome::Claimed { won: true, created: false, cas },
            Outcome::Claimed { won: false, created: true, cas },
            Outcome::Invalidated { cas },
        ]
    }

    #[test]
    fn every_outcome_round_trips_and_a_set_costs_17_bytes() {
        let req = ReqId { client: 0xDEAD_BEEF_0123_4567, seq: 99 };
        for seq in [1u64, 1 << 52] {
            for cas in [seq, seq - 1] {
                for outcome in outcomes(cas) {
                    let tag = OutcomeTag::of(Some((req, &outcome)), seq);
                    assert!(tag.bytes().len() <= OUTCOME_TAG_BYTES_MAX);
                    assert_eq!(
                        OutcomeTag::decode(tag.bytes(), seq),
                        Some((req, outcome.clone())),
                        "{outcome:?}"
                    );
                }
            }
        }
        let set = Outcome::Stored { cas: 7 };
        assert_eq!(OutcomeTag::of(Some((req, &set)), 7).bytes().len(), 17);
        assert!(OutcomeTag::of(None, 7).bytes().is_empty());
    }

    /// Whatever the bytes, decoding never panics, and what it accepts encodes to a tag that
    /// decodes to the same request and outcome.
    #[test]
    fn any_tag_is_refused_or_round_trips() {
        use rand::{Rng, SeedableRng};
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut accepted = 0;
        for _ in 0..20_000 {
            let len = rng.gen_range(0..=TAG_BYTES_MAX);
            let mut tag: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            if len > 16 && rng.gen_bool(0.7) {
                tag[16] = rng.gen_range(0..10) | [0, CAS_IS_SEQ, WON, CREATED][rng.gen_range(0..4)];
                tag.truncate([17, 25, 33][rng.gen_range(0..3)].min(len));
            }
            let seq = rng.gen_range(1..4);
            if let Some((req, outcome)) = OutcomeTag::decode(&tag, seq) {
                let again = OutcomeTag::of(Some((req, &outcome)), seq);
                // A cas equal to the seq is always written elided.
                let same = again.bytes() == &tag[..]
                    || OutcomeTag::decode(again.bytes(), seq) == Some((req, outcome.clone()));
                assert!(same, "seed {seed}: {tag:?}");
                accepted += 1;
            }
        }
        assert!(accepted > 500, "seed {seed}: {accepted}");
    }
}
