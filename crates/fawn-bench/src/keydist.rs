//! Key distributions: uniform, Zipfian(θ) and "latest" (YCSB's definitions).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rand::Rng;

/// Which keys a workload touches.
#[derive(Clone, Copy, Debug, PartialEq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Distribution {
    /// Every key equally likely.
    Uniform,
    /// Key rank r has probability ∝ 1/(r+1)^θ; key 0 is the hottest.
    Zipfian,
    /// Puts insert new keys; gets pick recent keys with Zipfian popularity by age.
    Latest,
}

/// YCSB's Zipfian generator (Gray et al., "Quickly generating billion-record synthetic
/// databases"): O(n) set-up for ζ(n), O(1) per sample. θ must be in (0, 1).
#[derive(Debug)]
pub struct Zipfian {
    n: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
}

impl Zipfian {
    /// A generator of ranks in `0..n` (n ≥ 1).
    pub fn new(n: u64, theta: f64) -> anyhow::Result<Zipfian> {
        anyhow::ensure!(n >= 1, "zipfian needs at least one key");
        anyhow::ensure!(theta > 0.0 && theta < 1.0, "zipfian theta must be in (0, 1), got {theta}");
        let zetan = zeta(n, theta);
        let zeta2 = zeta(2.min(n), theta);
        let eta = (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
        Ok(Zipfian { n, theta, alpha: 1.0 / (1.0 - theta), zetan, eta })
    }

    /// One rank in `0..n`; 0 is the most popular.
    pub fn sample<R: Rng>(&self, rng: &mut R) -> u64 {
        let u: f64 = rng.gen();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1.min(self.n - 1);
        }
        let r = (self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        r.min(self.n - 1)
    }
}

fn zeta(n: u64, theta: f64) -> f64 {
    (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).sum()
}

/// Picks key indices for one workload; shared by every connection.
#[derive(Debug)]
pub struct KeyChooser {
    n: u64,
    dist: Distribution,
    zipf: Option<Zipfian>,
    /// For `latest`: one past the newest key index. Starts at n (the preloaded keys).
    next_insert: AtomicU64,
}

impl KeyChooser {
    /// A chooser over the `n` preloaded keys `0..n`.
    pub fn new(n: u64, dist: Distribution, theta: f64) -> anyhow::Result<Arc<KeyChooser>> {
        anyhow::ensure!(n >= 1, "the key space needs at least one key");
        let zipf = match dist {
            Distribution::Uniform => None,
            Distribution::Zipfian | Distribution::Latest => Some(Zipfian::new(n, theta)?),
        };
        Ok(Arc::new(KeyChooser { n, dist, zipf, next_insert: AtomicU64::new(n) }))
    }

    fn zipf_rank<R: Rng>(&self, rng: &mut R) -> u64 {
        match &self.zipf {
            Some(z) => z.sample(rng),
            None => rng.gen_range(0..self.n),
        }
    }

    /// The key a get reads.
    pub fn get_key<R: Rng>(&self, rng: &mut R) -> u64 {
        match self.dist {
            Distribution::Uniform => rng.gen_range(0..self.n),
            Distribution::Zipfian => self.zipf_rank(rng),
            Distribution::Latest => {
                let newest = self.next_insert.load(Ordering::Relaxed) - 1;
                newest - self.zipf_rank(rng).min(newest)
            }
        }
    }

    /// The key a put writes: an existing key, or for `latest` a brand-new one.
    pub fn put_key<R: Rng>(&self, rng: &mut R) -> u64 {
        match self.dist {
            Distribution::Latest => self.next_insert.fetch_add(1, Ordering::Relaxed),
            _ => self.get_key(rng),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::SmallRng, SeedableRng};

    #[test]
    fn zipfian_is_skewed_and_in_range() {
        let z = Zipfian::new(1000, 0.99).unwrap();
        let mut rng = SmallRng::seed_from_u64(1);
        let mut counts = vec![0u32; 1000];
        for _ in 0..100_000 {
            counts[z.sample(&mut rng) as usize] += 1;
        }
        // With θ=0.99 over 1000 keys, rank 0 gets ~13 %; the tail is thin but reached.
        assert!(counts[0] > 10_000, "rank 0 got {}", counts[0]);
        assert!(counts[0] > counts[10] * 5);
        assert!(counts[500..].iter().any(|&c| c > 0));
    }

    #[test]
    fn latest_reads_recent_inserts() {
        let k = KeyChooser::new(100, Distribution::Latest, 0.99).unwrap();
        let mut rng = SmallRng::seed_from_u64(2);
        assert_eq!(k.put_key(&mut rng), 100);
        assert_eq!(k.put_key(&mut rng), 101);
        let hits_newest = (0..1000).filter(|_| k.get_key(&mut rng) == 101).count();
        assert!(hits_newest > 100);
        assert!((0..1000).all(|_| k.get_key(&mut rng) <= 101));
    }

    #[test]
    fn bad_theta_is_an_error() {
        assert!(Zipfian::new(10, 1.0).is_err());
        assert!(KeyChooser::new(0, Distribution::Uniform, 0.5).is_err());
    }
}
