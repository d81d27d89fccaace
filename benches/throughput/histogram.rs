//! The latency histogram.

/// Log-linear histogram of nanoseconds: 32 buckets per power of two (about 3 % wide).
pub(crate) struct Histogram {
    pub(crate) counts: Box<[u32; Histogram::BUCKETS]>,
}

impl Histogram {
    pub(crate) const BUCKETS: usize = 32 + 59 * 32;

    pub(crate) fn new() -> Histogram {
        Histogram {
            counts: Box::new([0; Histogram::BUCKETS]),
        }
    }

    pub(crate) fn record(&mut self, nanos: u64) {
        let index = if nanos < 32 {
            nanos as usize
        } else {
            let exponent = 63 - nanos.leading_zeros() as usize; // >= 5
            let mantissa = (nanos >> (exponent - 5)) as usize - 32;
            32 + (exponent - 5) * 32 + mantissa
        };
        self.counts[index] += 1;
    }

    /// The middle of bucket `index`, in nanoseconds.
    pub(crate) fn value(index: usize) -> f64 {
        if index < 32 {
            return index as f64;
        }
        let (exponent, mantissa) = ((index - 32) / 32 + 5, (index - 32) % 32);
        ((64 + 2 * mantissa + 1) as f64 / 2.0) * (1u64 << (exponent - 5)) as f64
    }

    pub(crate) fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
    }

    /// The `q` quantile in microseconds.
    pub(crate) fn quantile_us(&self, q: f64) -> f64 {
        let total: u64 = self.counts.iter().map(|&c| u64::from(c)).sum();
        let target = ((q * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (index, &count) in self.counts.iter().enumerate() {
            seen += u64::from(count);
            if seen >= target {
                return Histogram::value(index) / 1000.0;
            }
        }
        f64::NAN
    }
}
