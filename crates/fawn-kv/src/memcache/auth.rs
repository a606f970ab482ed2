//! Authentication with a user file, as memcached does it: `user:password` lines (memcached's
//! `-Y` file, also the file its SASL PLAIN reads). Text connections authenticate with
//! `set <any key> <flags> <exptime> <bytes>` whose data is `<user> <password>`; binary ones
//! with SASL `PLAIN`.

use std::path::Path;

/// The users allowed in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Users {
    entries: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Users {
    /// Reads a user file: one `user:password` per line; blank lines are skipped.
    pub fn load(path: &Path) -> std::io::Result<Users> {
        Ok(Users::parse(&std::fs::read(path)?))
    }

    pub fn parse(text: &[u8]) -> Users {
        let entries = text
            .split(|b| *b == b'\n')
            .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
            .filter_map(|line| {
                let colon = line.iter().position(|b| *b == b':')?;
                Some((line[..colon].to_vec(), line[colon + 1..].to_vec()))
            })
            .collect();
        Users { entries }
    }

    /// Whether `user` has this `password`. Every entry is compared in full, so the time taken
    /// does not tell how much of a guess was right.
    pub fn check(&self, user: &[u8], password: &[u8]) -> bool {
        let mut found = false;
        for (u, p) in &self.entries {
            found |= equal(u, user) & equal(p, password);
        }
        found
    }

    /// The text protocol's credentials: the data of an authenticating `set`, `<user> <password>`
    /// (memcached splits on spaces and ignores extra ones).
    pub fn check_text(&self, data: &[u8]) -> bool {
        let mut words = data.split(|b| *b == b' ').filter(|w| !w.is_empty());
        match (words.next(), words.next()) {
            (Some(user), Some(password)) => self.check(user, password),
            _ => false,
        }
    }

    /// SASL `PLAIN` (RFC 4616): `[authzid] NUL authcid NUL password`. There is no acting as
    /// another user: an authorization identity must be empty or the user's own (memcached's
    /// Cyrus SASL refuses any other).
    pub fn check_plain(&self, data: &[u8]) -> bool {
        let mut parts = data.split(|b| *b == 0);
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(authzid), Some(user), Some(password), None) if authzid.is_empty() || authzid == user => {
                self.check(user, password)
            }
            _ => false,
        }
    }
}

fn equal(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (x, y) in a.iter().zip(b) {
        diff |= usize::from(x ^ y);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_text_and_plain_credentials() {
        let users = Users::parse(b"alice:secret\r\nbob:hun:ter2\n\nnocolon\n");
        assert!(users.check_text(b"alice secret"));
        assert!(users.check_text(b"alice  secret "));
        assert!(users.check_text(b"bob hun:ter2"));
        assert!(!users.check_text(b"alice wrong"));
        assert!(!users.check_text(b"alice"));
        assert!(!users.check_text(b"nocolon "));
        assert!(users.check_plain(b"\0alice\0secret"));
        assert!(users.check_plain(b"alice\0alice\0secret"));
        assert!(!users.check_plain(b"bob\0alice\0secret"));
        assert!(!users.check_plain(b"\0alice\0secre"));
        assert!(!users.check_plain(b"alice\0secret"));
    }
}
