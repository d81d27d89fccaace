//! The HTTP cost: what `http + layer` adds over `http (no layer)` per request, at concurrency 64
//! on one hot key and over 10 000 keys, in interleaved rounds (the `http cost` line).

use super::*;

/// The shapes of the `http cost` line, in its order.
pub(crate) const HTTP_COST_SHAPES: [Shape; 2] =
    [Shape::RATIO, Shape::new(RATIO_CONCURRENCY, Keys::Spread)];

/// `http + layer` against `http (no layer)` at one shape, round by round.
#[derive(Default)]
pub(crate) struct HttpCost {
    /// This process's CPU µs per request, with the layer minus without.
    cpu: Vec<f64>,
    /// Allocations per request, with the layer minus without.
    allocations: Vec<f64>,
    /// Requests a second, with the layer over without.
    rate: Vec<f64>,
}

impl HttpCost {
    fn push(&mut self, layer: &Run, plain: &Run) {
        self.cpu.push(layer.own_cpu_us() - plain.own_cpu_us());
        self.allocations
            .push(layer.allocations_per_op() - plain.allocations_per_op());
        self.rate.push(layer.rate() / plain.rate());
    }
}

impl Bench {
    /// `http (no layer)` and `http + layer` at each of [`HTTP_COST_SHAPES`], interleaved: each
    /// round runs both sides of a shape back to back, the side that goes first alternating, so
    /// that a busy machine weighs on both alike.
    pub(crate) async fn http_cost(&mut self) -> Checked<[HttpCost; 2]> {
        let mut costs = [HttpCost::default(), HttpCost::default()];
        for round in 0..self.settings.http_rounds {
            for (shape, cost) in HTTP_COST_SHAPES.into_iter().zip(&mut costs) {
                let (layer, plain) = if round % 2 == 0 {
                    let layer = self.http(shape, true).await?;
                    (layer, self.http(shape, false).await?)
                } else {
                    let plain = self.http(shape, false).await?;
                    (self.http(shape, true).await?, plain)
                };
                cost.push(&layer, &plain);
            }
        }
        Ok(costs)
    }
}

/// The `http cost` line: the medians of the rounds of each shape.
pub(crate) fn http_cost_line([hot, spread]: &[HttpCost; 2]) -> String {
    format!(
        "http cost: layer adds {:.2} µs and {:.1} allocations per request (hot), {:.2} µs and \
         {:.1} ({KEYS} keys); http + layer / http: {:.2} (hot), {:.2} ({KEYS} keys)",
        median(hot.cpu.clone()),
        median(hot.allocations.clone()),
        median(spread.cpu.clone()),
        median(spread.allocations.clone()),
        median(hot.rate.clone()),
        median(spread.rate.clone()),
    )
}

/// `cargo bench --bench throughput -- [--quick] http`: the HTTP rounds alone, their rows and
/// the `http cost` line.
pub(crate) async fn only(settings: Settings) -> Checked {
    let mut bench = Bench::start(settings).await?;
    let costs = bench.http_cost().await?;
    // `http (no layer)` first; each scenario's shapes stay in the order they ran.
    bench.rows.sort_by(|a, b| a.scenario.cmp(&b.scenario));
    println!();
    println!(
        "http scenario: {} interleaved rounds, each run {:?} warm-up, then {:?}",
        bench.settings.http_rounds, bench.settings.warm_up, bench.settings.run
    );
    println!();
    print_table(&bench.rows);
    println!();
    println!("{}", http_cost_line(&costs));
    Ok(())
}
