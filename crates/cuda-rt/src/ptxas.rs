//! Parsing the resource report that ptxas writes into the NVRTC log under `--ptxas-options=-v`.
//!
//! The lines look like this (one block per entry function; `smem` only when non-zero):
//! ```text
//! ptxas info    : Compiling entry function 'saxpy' for 'sm_90a'
//! ptxas info    : Function properties for saxpy
//! ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
//! ptxas info    : Used 8 registers, used 0 barriers, 1024 bytes smem, 400 bytes cmem[0]
//! ```

/// Per-thread registers, spills and stack, and static shared memory of one entry function.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct KernelResources {
    /// The entry function's (possibly mangled) symbol name.
    pub name: String,
    pub registers: u32,
    /// Bytes stored to local memory by register spilling, its own and its called (not inlined)
    /// device functions'.
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub stack_bytes: u32,
    /// Static shared memory; dynamic shared memory is a launch parameter and not counted.
    pub smem_bytes: u32,
}

impl KernelResources {
    pub fn spills(&self) -> bool {
        self.spill_stores > 0 || self.spill_loads > 0
    }
}

/// The entry functions reported in `log`, in order. A device function that ptxas reports
/// separately (not inlined, after its entry function's block) adds its spills to the entry's: a
/// spill is a spill wherever the register allocator put it. (Its stack shows up in the caller's
/// frame already.)
pub fn parse_ptxas_log(log: &str) -> Vec<KernelResources> {
    let mut kernels: Vec<KernelResources> = Vec::new();
    // Whether the last "Function properties for X" header named the current entry function.
    let mut in_entry_properties = false;
    for line in log.lines() {
        let Some(rest) = line.strip_prefix("ptxas") else {
            continue;
        };
        let rest = rest.trim_start();
        let body = rest
            .strip_prefix("info")
            .map(|r| r.trim_start().trim_start_matches(':').trim());
        if let Some(name) = body.and_then(|b| b.strip_prefix("Compiling entry function '")) {
            let name = name.split('\'').next().unwrap_or_default();
            kernels.push(KernelResources {
                name: name.to_owned(),
                ..Default::default()
            });
            in_entry_properties = false;
        } else if let Some(name) = body.and_then(|b| b.strip_prefix("Function properties for ")) {
            in_entry_properties = kernels.last().is_some_and(|k| k.name == name.trim());
        } else if let Some(used) = body.and_then(|b| b.strip_prefix("Used ")) {
            if let Some(k) = kernels.last_mut() {
                k.registers = number_before(used, "registers").unwrap_or(0);
                k.smem_bytes = number_before(used, "bytes smem").unwrap_or(0);
            }
        } else if let Some(props) = rest.strip_prefix('.')
            && let Some(k) = kernels.last_mut()
        {
            if in_entry_properties {
                k.stack_bytes = number_before(props, "bytes stack frame").unwrap_or(0);
            }
            k.spill_stores += number_before(props, "bytes spill stores").unwrap_or(0);
            k.spill_loads += number_before(props, "bytes spill loads").unwrap_or(0);
        }
    }
    kernels
}

/// In a comma-separated list like `8 registers, used 0 barriers`, the number of the item ending in `unit`.
fn number_before(list: &str, unit: &str) -> Option<u32> {
    list.split(',')
        .map(str::trim)
        .find_map(|item| item.strip_suffix(unit))
        .and_then(|n| n.split_whitespace().last())
        .and_then(|n| n.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'big' for 'sm_90a'
ptxas info    : Function properties for big
ptxas         .     24 bytes stack frame, 20 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 24 bytes cumulative stack size, 4096 bytes smem, 400 bytes cmem[0]
ptxas info    : Function properties for _Z6helperv
ptxas         .     64 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Compiling entry function '_Z5smallPf' for 'sm_90a'
ptxas info    : Function properties for _Z5smallPf
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 360 bytes cmem[0]
ptxas info    : Compile time = 2.186 ms
";

    #[test]
    fn parses_every_entry_function() {
        let k = parse_ptxas_log(LOG);
        assert_eq!(
            k,
            vec![
                // With _Z6helperv's spills.
                KernelResources {
                    name: "big".into(),
                    registers: 255,
                    spill_stores: 28,
                    spill_loads: 24,
                    stack_bytes: 24,
                    smem_bytes: 4096,
                },
                KernelResources {
                    name: "_Z5smallPf".into(),
                    registers: 8,
                    ..Default::default()
                },
            ]
        );
        assert!(k[0].spills() && !k[1].spills());
    }

    #[test]
    fn ignores_non_ptxas_lines() {
        assert!(parse_ptxas_log("k.cu(3): warning: unused variable\n").is_empty());
    }
}
