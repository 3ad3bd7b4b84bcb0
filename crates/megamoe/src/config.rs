//! Problem configuration: the shape of one MoE layer and how it is split over ranks
//! (DESIGN §1), its `config.json` form, validation with typed errors, and the named presets.

use fp_formats::Recipe;
use serde::{Deserialize, Serialize};

/// Channel counts must be multiples of this (the coarsest block any recipe uses).
pub const CHANNEL_ALIGN: usize = 128;

/// The largest hidden size, intermediate size and expert count a config may have (a thousand
/// times today's models): with each at most 2^20, every tensor's element count (at most
/// E·2I·H = 2^61) and every per-pair multiply-add count fits in 64 bits, so shapes computed from a
/// config never overflow.
pub const MAX_DIM: usize = 1 << 20;

/// One MoE layer split over `num_ranks` expert-parallel ranks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Config {
    /// Hidden size H (K of Linear1, N of Linear2).
    pub hidden: usize,
    /// Intermediate size I (Linear1 has 2I output rows: gate then up).
    pub intermediate: usize,
    /// Global expert count E; rank r owns experts `r·E_l .. (r+1)·E_l`.
    pub num_experts: usize,
    /// Slots per token.
    pub top_k: usize,
    /// Expert-parallel ranks R.
    pub num_ranks: usize,
    /// SwiGLU clamp c (None = off).
    pub clamp: Option<f32>,
    /// Activation-scale recipe (weights are always MXFP4).
    pub recipe: Recipe,
}

#[derive(Clone, Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("hidden H = {0} is not a positive multiple of {CHANNEL_ALIGN}")]
    Hidden(usize),
    #[error("intermediate I = {0} is not a positive multiple of {CHANNEL_ALIGN}")]
    Intermediate(usize),
    #[error("{key} = {value} exceeds the largest supported {MAX_DIM}")]
    TooLarge { key: &'static str, value: usize },
    #[error("num_ranks must be at least 1")]
    NoRanks,
    #[error("num_experts E = {experts} is not a positive multiple of num_ranks R = {ranks}")]
    ExpertsPerRank { experts: usize, ranks: usize },
    #[error("top_k = {top_k} must be in 1..={experts} (num_experts)")]
    TopK { top_k: usize, experts: usize },
    #[error("clamp = {0} must be finite and positive (use null to switch it off)")]
    Clamp(f32),
    #[error("act_scale_block = {0} is neither 32 (mx32) nor 128 (g128)")]
    ActScaleBlock(usize),
    #[error("config.json: {0}")]
    Json(String),
    #[error("unknown preset `{0}` (known: {known})", known = PRESETS.join(", "))]
    UnknownPreset(String),
}

/// The on-disk form of [`Config`]: `config.json`.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigJson {
    hidden: usize,
    intermediate: usize,
    num_experts: usize,
    top_k: usize,
    num_ranks: usize,
    clamp: Option<f32>,
    #[serde(default = "default_act_scale_block")]
    act_scale_block: usize,
}

fn default_act_scale_block() -> usize {
    Recipe::Mx32.group()
}

/// Names accepted by [`Config::preset`].
pub const PRESETS: &[&str] = &[
    "tiny",
    "deepseek-v4-flash",
    "deepseek-v4-pro",
    "deepseek-v3",
];

impl Config {
    /// A small layer that runs in milliseconds on the CPU reference; two 128-blocks of H so the
    /// g128 recipe has more than one activation scale per row.
    pub const fn tiny() -> Config {
        Config {
            hidden: 256,
            intermediate: 128,
            num_experts: 8,
            top_k: 2,
            num_ranks: 1,
            clamp: None,
            recipe: Recipe::Mx32,
        }
    }

    pub const fn deepseek_v4_flash() -> Config {
        Config {
            hidden: 4096,
            intermediate: 2048,
            num_experts: 256,
            top_k: 6,
            num_ranks: 1,
            clamp: Some(10.0),
            recipe: Recipe::Mx32,
        }
    }

    pub const fn deepseek_v4_pro() -> Config {
        Config {
            hidden: 7168,
            intermediate: 3072,
            num_experts: 384,
            top_k: 6,
            num_ranks: 1,
            clamp: Some(10.0),
            recipe: Recipe::Mx32,
        }
    }

    pub const fn deepseek_v3() -> Config {
        Config {
            hidden: 7168,
            intermediate: 2048,
            num_experts: 256,
            top_k: 8,
            num_ranks: 1,
            clamp: None,
            recipe: Recipe::Mx32,
        }
    }

    /// The preset called `name` (one of [`PRESETS`]), on one rank with the mx32 recipe.
    pub fn preset(name: &str) -> Result<Config, ConfigError> {
        match name {
            "tiny" => Ok(Config::tiny()),
            "deepseek-v4-flash" => Ok(Config::deepseek_v4_flash()),
            "deepseek-v4-pro" => Ok(Config::deepseek_v4_pro()),
            "deepseek-v3" => Ok(Config::deepseek_v3()),
            _ => Err(ConfigError::UnknownPreset(name.to_owned())),
        }
    }

    pub const fn with_ranks(self, num_ranks: usize) -> Config {
        Config { num_ranks, ..self }
    }

    pub const fn with_recipe(self, recipe: Recipe) -> Config {
        Config { recipe, ..self }
    }

    pub const fn with_clamp(self, clamp: Option<f32>) -> Config {
        Config { clamp, ..self }
    }

    /// Checks every constraint of DESIGN §1 on the shape.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            ("hidden", self.hidden),
            ("intermediate", self.intermediate),
            ("num_experts", self.num_experts),
        ] {
            if value > MAX_DIM {
                return Err(ConfigError::TooLarge { key, value });
            }
        }
        let aligned = |n: usize| n > 0 && n.is_multiple_of(CHANNEL_ALIGN);
        if !aligned(self.hidden) {
            return Err(ConfigError::Hidden(self.hidden));
        }
        if !aligned(self.intermediate) {
            return Err(ConfigError::Intermediate(self.intermediate));
        }
        if self.num_ranks == 0 {
            return Err(ConfigError::NoRanks);
        }
        if self.num_experts == 0 || !self.num_experts.is_multiple_of(self.num_ranks) {
            return Err(ConfigError::ExpertsPerRank {
                experts: self.num_experts,
                ranks: self.num_ranks,
            });
        }
        if self.top_k == 0 || self.top_k > self.num_experts {
            return Err(ConfigError::TopK {
                top_k: self.top_k,
                experts: self.num_experts,
            });
        }
        if let Some(c) = self.clamp
            && !(c.is_finite() && c > 0.0)
        {
            return Err(ConfigError::Clamp(c));
        }
        Ok(())
    }

    /// E_l: experts per rank.
    pub const fn experts_per_rank(&self) -> usize {
        self.num_experts / self.num_ranks
    }

    /// The rank that owns global expert `e`.
    pub const fn owner_rank(&self, expert: usize) -> usize {
        expert / self.experts_per_rank()
    }

    /// G: channels per activation scale.
    pub const fn act_group(&self) -> usize {
        self.recipe.group()
    }

    /// Multiply-adds of one (token, expert) pair: Linear1 (2I×H) plus Linear2 (H×I).
    pub const fn macs_per_pair(&self) -> u64 {
        3 * self.hidden as u64 * self.intermediate as u64
    }

    /// Parses and validates `config.json` text.
    pub fn from_json(text: &str) -> Result<Config, ConfigError> {
        let json: ConfigJson =
            serde_json::from_str(text).map_err(|e| ConfigError::Json(e.to_string()))?;
        let recipe = Recipe::from_group(json.act_scale_block)
            .ok_or(ConfigError::ActScaleBlock(json.act_scale_block))?;
        let config = Config {
            hidden: json.hidden,
            intermediate: json.intermediate,
            num_experts: json.num_experts,
            top_k: json.top_k,
            num_ranks: json.num_ranks,
            clamp: json.clamp,
            recipe,
        };
        config.validate()?;
        Ok(config)
    }

    /// The `config.json` text of this config.
    pub fn to_json(&self) -> String {
        let json = ConfigJson {
            hidden: self.hidden,
            intermediate: self.intermediate,
            num_experts: self.num_experts,
            top_k: self.top_k,
            num_ranks: self.num_ranks,
            clamp: self.clamp,
            act_scale_block: self.recipe.group(),
        };
        serde_json::to_string_pretty(&json).expect("config serializes") + "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[test]
    fn presets_are_valid_and_round_trip() {
        for name in PRESETS {
            let config = Config::preset(name).unwrap();
            config.validate().unwrap();
            for ranks in [1, 2, 8] {
                let c = config.with_ranks(ranks).with_recipe(Recipe::G128);
                assert_eq!(
                    Config::from_json(&c.to_json()).unwrap(),
                    c,
                    "{name} R={ranks}"
                );
            }
        }
        assert_eq!(
            Config::deepseek_v4_pro().with_ranks(8).experts_per_rank(),
            48
        );
        assert_eq!(Config::deepseek_v4_flash().with_ranks(8).owner_rank(255), 7);
    }

    #[test]
    fn json_defaults_to_mx32_and_null_clamp_is_off() {
        let c = Config::from_json(
            r#"{"hidden":256,"intermediate":128,"num_experts":8,"top_k":2,"num_ranks":2,"clamp":null}"#,
        )
        .unwrap();
        assert_eq!((c.recipe, c.clamp), (Recipe::Mx32, None));
    }

    #[rstest]
    #[case::hidden(Config { hidden: 200, ..Config::tiny() }, ConfigError::Hidden(200))]
    #[case::hidden_zero(Config { hidden: 0, ..Config::tiny() }, ConfigError::Hidden(0))]
    #[case::intermediate(Config { intermediate: 96, ..Config::tiny() }, ConfigError::Intermediate(96))]
    #[case::no_ranks(Config::tiny().with_ranks(0), ConfigError::NoRanks)]
    #[case::split(Config::tiny().with_ranks(3), ConfigError::ExpertsPerRank { experts: 8, ranks: 3 })]
    #[case::top_k_zero(Config { top_k: 0, ..Config::tiny() }, ConfigError::TopK { top_k: 0, experts: 8 })]
    #[case::top_k_big(Config { top_k: 9, ..Config::tiny() }, ConfigError::TopK { top_k: 9, experts: 8 })]
    #[case::clamp(Config::tiny().with_clamp(Some(-1.0)), ConfigError::Clamp(-1.0))]
    #[case::huge_intermediate(
        Config { intermediate: usize::MAX - 127, ..Config::tiny() },
        ConfigError::TooLarge { key: "intermediate", value: usize::MAX - 127 }
    )]
    #[case::huge_experts(
        Config { num_experts: MAX_DIM + 8, ..Config::tiny() },
        ConfigError::TooLarge { key: "num_experts", value: MAX_DIM + 8 }
    )]
    fn invalid_configs_name_the_problem(#[case] config: Config, #[case] expected: ConfigError) {
        assert_eq!(config.validate(), Err(expected.clone()));
        // The same problem is reported when it comes from config.json.
        assert_eq!(Config::from_json(&config.to_json()), Err(expected));
    }

    #[test]
    fn json_errors() {
        let bad_block = r#"{"hidden":256,"intermediate":128,"num_experts":8,"top_k":2,"num_ranks":1,"clamp":null,"act_scale_block":64}"#;
        assert_eq!(
            Config::from_json(bad_block),
            Err(ConfigError::ActScaleBlock(64))
        );
        let unknown = r#"{"hidden":256,"intermediate":128,"num_experts":8,"top_k":2,"num_ranks":1,"clamp":null,"bias":1}"#;
        assert!(
            matches!(Config::from_json(unknown), Err(ConfigError::Json(m)) if m.contains("bias"))
        );
        assert!(matches!(
            Config::preset("gpt"),
            Err(ConfigError::UnknownPreset(_))
        ));
    }
}
