//! `moe-sched`: MegaMoE scheduling (being written).
