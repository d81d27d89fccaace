//! The layer over a `MemoryStore` against `check` on the same kind of store: what the tower
//! layer adds where a decision costs no round trip (the `memory layer/check` line), in
//! interleaved rounds at concurrency 64 on one hot key.

use super::*;
use redlimit::store::MemoryStore;

impl Bench {
    /// A token-bucket limiter on a `MemoryStore` of its own.
    fn memory_limiter() -> Limiter {
        Limiter::builder(MemoryStore::new())
            .algorithm(Algorithm::TokenBucket)
            .build()
            .expect("a valid limiter")
    }

    /// `check token-bucket` on a `MemoryStore`.
    async fn memory_check(&mut self, shape: Shape) -> Checked<Run> {
        let limiter = Self::memory_limiter();
        let ops = self.check_ops(&limiter, admitting(Algorithm::TokenBucket), true, shape);
        let (run, _) = measure(&self.settings, &self.admin, ops).await?;
        assert_only(&limiter, "check on memory", "allowed", |s| {
            s.denied == 0 && s.store_errors == 0
        })?;
        self.record("check token-bucket on memory", shape, run.clone())?;
        Ok(run)
    }

    /// `layer (ready+call)` over a `MemoryStore`: the layer of (c) on the memory store.
    async fn memory_layer(&mut self, shape: Shape) -> Checked<Run> {
        let limiter = Self::memory_limiter();
        self.layer_on(limiter, "layer (ready+call) on memory", shape)
            .await
    }

    /// The layer's bench CPU per request over `check`'s, both on a `MemoryStore`, round by
    /// round (the side that goes first alternating).
    pub(crate) async fn memory_cost(&mut self) -> Checked<Vec<f64>> {
        let mut ratios = Vec::new();
        for round in 0..self.settings.rounds {
            let (layer, check) = if round % 2 == 0 {
                let layer = self.memory_layer(Shape::RATIO).await?;
                (layer, self.memory_check(Shape::RATIO).await?)
            } else {
                let check = self.memory_check(Shape::RATIO).await?;
                (self.memory_layer(Shape::RATIO).await?, check)
            };
            ratios.push(layer.own_cpu_us() / check.own_cpu_us());
        }
        Ok(ratios)
    }
}

/// The `memory layer/check` line: the median of the rounds.
pub(crate) fn memory_line(ratios: &[f64]) -> String {
    format!(
        "memory layer/check: {:.2} (this process's CPU per request, the layer over a MemoryStore \
         against check on one)",
        median(ratios.to_vec())
    )
}

/// `cargo bench --bench throughput -- [--quick] memory`: the memory rounds alone, their rows
/// and the `memory layer/check` line.
pub(crate) async fn only(settings: Settings) -> Checked {
    let mut bench = Bench::start(settings).await?;
    let ratios = bench.memory_cost().await?;
    // What the request the layer's side builds costs by itself.
    bench.service_alone(Shape::RATIO).await?;
    bench.rows.sort_by(|a, b| a.scenario.cmp(&b.scenario));
    println!();
    print_table(&bench.rows);
    println!();
    println!("{}", memory_line(&ratios));
    Ok(())
}
