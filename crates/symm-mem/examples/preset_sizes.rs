//! Prints the symmetric buffer layout of the DeepSeek MoE shapes at EP8, T_max = 8192:
//! `cargo run -p symm-mem --example preset_sizes [act_scale_group]`.

use symm_mem::{BlockMs, SymmLayout, SymmParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let act_scale_group = match std::env::args().nth(1) {
        Some(g) => g.parse()?,
        None => 32,
    };
    for (name, hidden, intermediate, num_experts, num_topk) in [
        ("DeepSeek-V4-Pro", 7168, 3072, 384, 6),
        ("DeepSeek-V4-Flash", 4096, 2048, 256, 6),
        ("DeepSeek-V3", 7168, 2048, 256, 8),
    ] {
        let layout = SymmLayout::new(SymmParams {
            num_ranks: 8,
            max_tokens_per_rank: 8192,
            hidden,
            intermediate,
            num_experts,
            num_topk,
            act_scale_group,
            block_ms: BlockMs::new(&[16, 32, 64, 128, 192, 256])?,
            l1_block_n: 128,
        })?;
        println!("== {name}, EP8 ==\n{layout}\n");
    }
    Ok(())
}
