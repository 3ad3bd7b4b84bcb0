//! The CUDA toolchain, through `scripts/cuda-toolchain.sh` (the one implementation: it also serves
//! shells without cargo). Its `export NAME='value'` lines become the environment of the commands we run.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

pub const SCRIPT: &str = "scripts/cuda-toolchain.sh";

/// Runs the script (installing the pinned wheels if no toolkit exists) and returns its variables, with
/// `$PATH` / `$LD_LIBRARY_PATH` references expanded from our own environment.
pub fn ensure(root: &Path) -> Result<Vec<(String, String)>> {
    let script = root.join(SCRIPT);
    let out = Command::new(&script)
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed: {}", script.display(), out.status);
    }
    let stdout = String::from_utf8(out.stdout).context("toolchain script output is not UTF-8")?;
    stdout
        .lines()
        .map(|line| {
            parse_export(line).with_context(|| format!("unexpected toolchain script line `{line}`"))
        })
        .collect()
}

/// `export NAME='value'"$NAME"` or `export NAME='value'${NAME:+:$NAME}` → (NAME, expanded value).
fn parse_export(line: &str) -> Option<(String, String)> {
    let (name, rest) = line.strip_prefix("export ")?.split_once('=')?;
    let rest = rest.strip_prefix('\'')?;
    let (value, tail) = rest.split_once('\'')?;
    let current = std::env::var(name).unwrap_or_default();
    let value = match tail {
        "" => value.to_owned(),
        _ if current.is_empty() => value.to_owned(),
        _ => format!("{value}:{current}"),
    };
    Some((name.to_owned(), value))
}

#[cfg(test)]
mod tests {
    use super::parse_export;

    #[test]
    fn parses_the_script_output() {
        assert_eq!(
            parse_export("export CUDA_PATH='/x/cuda'"),
            Some(("CUDA_PATH".into(), "/x/cuda".into()))
        );
        let (name, value) = parse_export("export PATH='/x/cuda/bin':\"$PATH\"").unwrap();
        assert_eq!(name, "PATH");
        assert!(value.starts_with("/x/cuda/bin:"), "{value}");
        assert_eq!(
            parse_export(
                "export XTASK_SURELY_UNSET='/x/lib'${XTASK_SURELY_UNSET:+:$XTASK_SURELY_UNSET}"
            ),
            Some(("XTASK_SURELY_UNSET".into(), "/x/lib".into()))
        );
        assert_eq!(parse_export("cuda-toolchain: using /usr/local/cuda"), None);
    }
}
