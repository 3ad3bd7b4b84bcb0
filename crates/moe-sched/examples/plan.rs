//! Prints the plan of DeepSeek-V4-Pro at EP8 for a few batch sizes:
//! `cargo run -p moe-sched --example plan [tokens_per_rank...]`.

use moe_sched::{Plan, PlanConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut tokens: Vec<u32> = std::env::args()
        .skip(1)
        .map(|t| t.parse())
        .collect::<Result<_, _>>()?;
    if tokens.is_empty() {
        tokens = vec![8, 128, 512, 2048, 8192];
    }
    for t in tokens {
        println!(
            "{}\n",
            Plan::new(PlanConfig::new(7168, 3072, 384, 6, 8, t))?
        );
    }
    Ok(())
}
