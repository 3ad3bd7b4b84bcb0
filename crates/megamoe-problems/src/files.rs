//! Problem directories on disk (layout in the README, "Problem directory format"): `config.json`, per rank
//! `weights.rank{r}.safetensors` and `inputs.rank{r}.safetensors`, and the outputs
//! `y.rank{r}.safetensors`. Reading checks dtypes, shapes, rank counts and contents, and every
//! error names the file and tensor.

use fp_formats::bf16;
use megamoe::config::{Config, ConfigError};
use megamoe::problem::{self, Problem, ProblemError, RankInputs, RankWeights};
use safetensors::tensor::{Dtype, Metadata, SafeTensorError, TensorInfo, TensorView};
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use std::collections::HashSet;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not a readable safetensors file: {source}", path.display())]
    Safetensors {
        path: PathBuf,
        source: SafeTensorError,
    },
    #[error("{}: {source}", path.display())]
    Config { path: PathBuf, source: ConfigError },
    #[error("{}: tensor `{tensor}` is missing", path.display())]
    Missing { path: PathBuf, tensor: &'static str },
    #[error("{}: tensor `{tensor}` appears more than once in the header", path.display())]
    Duplicate { path: PathBuf, tensor: String },
    #[error("{}: unexpected tensor `{tensor}` (this file holds {expected})", path.display())]
    Unexpected {
        path: PathBuf,
        tensor: String,
        expected: String,
    },
    #[error("{}: tensor `{tensor}` has dtype {got}, expected {expected}", path.display())]
    Dtype {
        path: PathBuf,
        tensor: &'static str,
        expected: Dtype,
        got: Dtype,
    },
    #[error("{}: {source}", path.display())]
    Problem { path: PathBuf, source: ProblemError },
    #[error("{}: found {} {kind}.rank*.safetensors file(s) for ranks {found:?}, but num_ranks = {expected}", dir.display(), found.len())]
    RankFiles {
        dir: PathBuf,
        kind: &'static str,
        found: Vec<usize>,
        expected: usize,
    },
}

type Result<T> = std::result::Result<T, FilesError>;

pub const CONFIG_FILE: &str = "config.json";
const WEIGHTS: &str = "weights";
const INPUTS: &str = "inputs";
const OUTPUT: &str = "y";

fn rank_path(dir: &Path, kind: &str, rank: usize) -> PathBuf {
    dir.join(format!("{kind}.rank{rank}.safetensors"))
}

pub fn weights_path(dir: &Path, rank: usize) -> PathBuf {
    rank_path(dir, WEIGHTS, rank)
}

pub fn inputs_path(dir: &Path, rank: usize) -> PathBuf {
    rank_path(dir, INPUTS, rank)
}

pub fn output_path(dir: &Path, rank: usize) -> PathBuf {
    rank_path(dir, OUTPUT, rank)
}

/// The ranks r, sorted, for which `dir` holds a `{kind}.rank{r}.safetensors`.
fn ranks_present(dir: &Path, kind: &str) -> Result<Vec<usize>> {
    let io = |source| FilesError::Io {
        path: dir.to_owned(),
        source,
    };
    let prefix = format!("{kind}.rank");
    let mut ranks = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let name = entry.map_err(io)?.file_name();
        let rank: Option<usize> = name.to_str().and_then(|n| {
            let digits = n.strip_prefix(&prefix)?.strip_suffix(".safetensors")?;
            // Only the name the writer gives rank r counts: `rank01` or `rank+1` would parse as
            // rank 1, yet rank 1 is read from `rank1`.
            digits
                .parse()
                .ok()
                .filter(|r: &usize| r.to_string() == digits)
        });
        ranks.extend(rank);
    }
    ranks.sort_unstable();
    Ok(ranks)
}

/// The ranks with an output file in `dir`.
pub fn output_ranks(dir: &Path) -> Result<Vec<usize>> {
    ranks_present(dir, OUTPUT)
}

/// Checks that `dir` holds exactly one weights and one inputs file per rank 0..num_ranks.
pub fn check_rank_files(dir: &Path, config: &Config) -> Result<()> {
    for kind in [WEIGHTS, INPUTS] {
        let found = ranks_present(dir, kind)?;
        if !found.iter().copied().eq(0..config.num_ranks) {
            return Err(FilesError::RankFiles {
                dir: dir.to_owned(),
                kind,
                found,
                expected: config.num_ranks,
            });
        }
    }
    Ok(())
}

pub fn read_config(dir: &Path) -> Result<Config> {
    let path = dir.join(CONFIG_FILE);
    let bytes = std::fs::read(&path).map_err(|source| FilesError::Io {
        path: path.clone(),
        source,
    })?;
    // Text that is not UTF-8 is a malformed config, not a failure to read the file.
    String::from_utf8(bytes)
        .map_err(|e| ConfigError::Json(e.to_string()))
        .and_then(|text| Config::from_json(&text))
        .map_err(|source| FilesError::Config { path, source })
}

/// Creates `dir` if needed and writes `config.json`.
pub fn write_config(dir: &Path, config: &Config) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| FilesError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let path = dir.join(CONFIG_FILE);
    std::fs::write(&path, config.to_json()).map_err(|source| FilesError::Io { path, source })
}

/// The largest header a reader accepts: the safetensors format's own limit. The header is read
/// into memory, and a file of many gigabytes must not make a corrupt length field an allocation
/// of many gigabytes.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// An open safetensors file: its parsed header, tensor data read on demand straight into the
/// caller's buffers (never the whole file in memory: weights files are gigabytes, and every
/// extra copy costs fresh pages). `SafeTensors::read_metadata` wants the whole file as one slice
/// (a mapping turns a file truncated under the reader into SIGBUS instead of an error) and adds
/// the declared data length to the header's unchecked, so this reads the length prefix and the
/// header itself and leaves the JSON and the checks on each tensor to safetensors' `Metadata`
/// deserializer.
struct TensorFile {
    path: PathBuf,
    file: std::fs::File,
    /// Byte offset of the data section (8-byte length + JSON header).
    data_start: u64,
    metadata: Metadata,
}

impl TensorFile {
    /// Opens `path`, parses its header and checks that it holds exactly the tensors `names`.
    /// Every size the header declares is checked against the file's length before anything is
    /// allocated by it.
    fn open(path: PathBuf, names: &[&'static str]) -> Result<TensorFile> {
        let io = |source| FilesError::Io {
            path: path.clone(),
            source,
        };
        let invalid = |source| FilesError::Safetensors {
            path: path.clone(),
            source,
        };
        let mut file = std::fs::File::open(&path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        let mut len_bytes = [0u8; 8];
        file.read_exact(&mut len_bytes)
            .map_err(|_| invalid(SafeTensorError::HeaderTooSmall))?;
        let header_len = u64::from_le_bytes(len_bytes);
        if header_len > MAX_HEADER_BYTES {
            return Err(invalid(SafeTensorError::HeaderTooLarge));
        }
        let data_start = 8 + header_len;
        if data_start > file_len {
            return Err(invalid(SafeTensorError::InvalidHeaderLength));
        }
        let mut header = vec![0u8; header_len as usize];
        file.read_exact(&mut header).map_err(io)?;
        let deserialization = |e| invalid(SafeTensorError::InvalidHeaderDeserialization(e));
        // Metadata's deserializer checks that the tensors tile the data section.
        let metadata: Metadata = serde_json::from_slice(&header).map_err(deserialization)?;
        if let FirstRepeat(Some(tensor)) =
            serde_json::from_slice(&header).map_err(deserialization)?
        {
            return Err(FilesError::Duplicate { path, tensor });
        }
        // The tiling bounds each tensor but not their sum, which may reach usize::MAX.
        if data_start.checked_add(metadata.data_len() as u64) != Some(file_len) {
            return Err(invalid(SafeTensorError::MetadataIncompleteBuffer));
        }
        let tensors = metadata.tensors();
        if let Some(extra) = tensors.keys().find(|n| !names.contains(&n.as_str())) {
            return Err(FilesError::Unexpected {
                path: path.clone(),
                tensor: extra.clone(),
                expected: names.join(", "),
            });
        }
        Ok(TensorFile {
            path,
            file,
            data_start,
            metadata,
        })
    }

    /// The bytes of tensor `name`, which must have dtype `dtype` and shape `shape`; `tokens` is
    /// the `x` token count for token-major tensors, so a wrong first dimension is reported as
    /// a token mismatch.
    fn read(
        &self,
        name: &'static str,
        dtype: Dtype,
        shape: &[usize],
        tokens: Option<usize>,
    ) -> Result<Vec<u8>> {
        let info = self.info(name)?;
        if info.dtype != dtype {
            return Err(FilesError::Dtype {
                path: self.path.clone(),
                tensor: name,
                expected: dtype,
                got: info.dtype,
            });
        }
        let got = &info.shape;
        match tokens {
            Some(t) if got.len() == shape.len() && got[0] != t && got[1..] == shape[1..] => {
                return Err(self.problem(ProblemError::Tokens {
                    tensor: name,
                    expected: t,
                    got: got[0],
                }));
            }
            _ if got != shape => {
                let (expected, got) = (shape.to_vec(), got.clone());
                return Err(self.problem(ProblemError::Shape {
                    tensor: name,
                    expected,
                    got,
                }));
            }
            _ => {}
        }
        let (begin, end) = info.data_offsets;
        let mut data = vec![0u8; end - begin];
        let mut file = &self.file;
        file.seek(SeekFrom::Start(self.data_start + begin as u64))
            .and_then(|_| file.read_exact(&mut data))
            .map_err(|source| FilesError::Io {
                path: self.path.clone(),
                source,
            })?;
        Ok(data)
    }

    fn info(&self, name: &'static str) -> Result<&TensorInfo> {
        self.metadata.info(name).ok_or_else(|| FilesError::Missing {
            path: self.path.clone(),
            tensor: name,
        })
    }

    fn problem(&self, source: ProblemError) -> FilesError {
        FilesError::Problem {
            path: self.path.clone(),
            source,
        }
    }
}

/// The first key that a header's JSON object repeats. JSON maps keep the last of a repeated key
/// without a word, and safetensors' deserializer does too; a file that names one tensor twice is
/// refused instead, since nothing says which of the two it means.
struct FirstRepeat(Option<String>);

impl<'de> Deserialize<'de> for FirstRepeat {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct Keys;
        impl<'de> Visitor<'de> for Keys {
            type Value = FirstRepeat;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object of tensors")
            }

            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<FirstRepeat, A::Error> {
                let mut seen = HashSet::new();
                let mut repeat = None;
                // Read to the end: the deserializer refuses an object left half read.
                while let Some(key) = map.next_key::<String>()? {
                    map.next_value::<IgnoredAny>()?;
                    if repeat.is_none() && !seen.insert(key.clone()) {
                        repeat = Some(key);
                    }
                }
                Ok(FirstRepeat(repeat))
            }
        }
        deserializer.deserialize_map(Keys)
    }
}

fn write_tensors(path: &Path, tensors: Vec<(&str, Dtype, Vec<usize>, &[u8])>) -> Result<()> {
    let views: Vec<(&str, TensorView)> = tensors
        .into_iter()
        .map(|(name, dtype, shape, data)| {
            (
                name,
                TensorView::new(dtype, shape, data).expect("shape matches data"),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).map_err(|source| FilesError::Safetensors {
        path: path.to_owned(),
        source,
    })
}

/// Reads and validates the weights of `rank`.
pub fn read_weights(dir: &Path, config: &Config, rank: usize) -> Result<RankWeights> {
    let shapes = problem::weight_shapes(config);
    let file = TensorFile::open(weights_path(dir, rank), &shapes.each_ref().map(|(n, _)| *n))?;
    let [w1, w1_sf, w2, w2_sf] =
        shapes.map(|(name, shape)| file.read(name, Dtype::U8, &shape, None));
    let weights = RankWeights {
        w1: w1?,
        w1_sf: w1_sf?,
        w2: w2?,
        w2_sf: w2_sf?,
    };
    weights.validate(config).map_err(|e| file.problem(e))?;
    Ok(weights)
}

pub fn write_weights(
    dir: &Path,
    config: &Config,
    rank: usize,
    weights: &RankWeights,
) -> Result<()> {
    let [(n1, s1), (n2, s2), (n3, s3), (n4, s4)] = problem::weight_shapes(config);
    write_tensors(
        &weights_path(dir, rank),
        vec![
            (n1, Dtype::U8, s1, &weights.w1),
            (n2, Dtype::U8, s2, &weights.w1_sf),
            (n3, Dtype::U8, s3, &weights.w2),
            (n4, Dtype::U8, s4, &weights.w2_sf),
        ],
    )
}

/// Dtypes of the input tensors, in `problem::input_shapes` order.
const INPUT_DTYPES: [Dtype; 4] = [Dtype::F8_E4M3, Dtype::U8, Dtype::I64, Dtype::F32];

/// Reads and validates the inputs of `rank`; T comes from `x`.
pub fn read_inputs(dir: &Path, config: &Config, rank: usize) -> Result<RankInputs> {
    let names = problem::input_shapes(config, 0).map(|(n, _)| n);
    let file = TensorFile::open(inputs_path(dir, rank), &names)?;
    let tokens = file.info("x")?.shape.first().copied().unwrap_or(0);
    let shapes = problem::input_shapes(config, tokens);
    let read = |i: usize| {
        let (name, shape) = &shapes[i];
        file.read(name, INPUT_DTYPES[i], shape, (i > 0).then_some(tokens))
    };
    let inputs = RankInputs {
        tokens,
        x: read(0)?,
        x_sf: read(1)?,
        topk_idx: bytemuck::pod_collect_to_vec(&read(2)?),
        topk_weights: bytemuck::pod_collect_to_vec(&read(3)?),
    };
    inputs.validate(config).map_err(|e| file.problem(e))?;
    Ok(inputs)
}

pub fn write_inputs(dir: &Path, config: &Config, rank: usize, inputs: &RankInputs) -> Result<()> {
    let [(n1, s1), (n2, s2), (n3, s3), (n4, s4)] = problem::input_shapes(config, inputs.tokens);
    write_tensors(
        &inputs_path(dir, rank),
        vec![
            (n1, INPUT_DTYPES[0], s1, &inputs.x),
            (n2, INPUT_DTYPES[1], s2, &inputs.x_sf),
            (
                n3,
                INPUT_DTYPES[2],
                s3,
                bytemuck::cast_slice(&inputs.topk_idx),
            ),
            (
                n4,
                INPUT_DTYPES[3],
                s4,
                bytemuck::cast_slice(&inputs.topk_weights),
            ),
        ],
    )
}

/// Reads `config.json`, checks the rank files and reads every rank.
pub fn read_problem(dir: &Path) -> Result<Problem> {
    let config = read_config(dir)?;
    check_rank_files(dir, &config)?;
    let ranks = 0..config.num_ranks;
    Ok(Problem {
        weights: ranks
            .clone()
            .map(|r| read_weights(dir, &config, r))
            .collect::<Result<_>>()?,
        inputs: ranks
            .map(|r| read_inputs(dir, &config, r))
            .collect::<Result<_>>()?,
        config,
    })
}

/// Writes `config.json` and every rank's weights and inputs.
pub fn write_problem(dir: &Path, problem: &Problem) -> Result<()> {
    write_config(dir, &problem.config)?;
    for (rank, (w, x)) in problem.weights.iter().zip(&problem.inputs).enumerate() {
        write_weights(dir, &problem.config, rank, w)?;
        write_inputs(dir, &problem.config, rank, x)?;
    }
    Ok(())
}

/// An output `y`: BF16 `[tokens, hidden]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    pub tokens: usize,
    pub hidden: usize,
    pub y: Vec<bf16>,
}

pub fn write_output(path: &Path, output: &Output) -> Result<()> {
    let shape = vec![output.tokens, output.hidden];
    write_tensors(
        path,
        vec![(OUTPUT, Dtype::BF16, shape, bytemuck::cast_slice(&output.y))],
    )
}

/// Reads a `y` file: one BF16 tensor `y` of two dimensions.
pub fn read_output(path: &Path) -> Result<Output> {
    let file = TensorFile::open(path.to_owned(), &[OUTPUT])?;
    let shape = file.info(OUTPUT)?.shape.clone();
    let [tokens, hidden] = shape[..] else {
        return Err(file.problem(ProblemError::Shape {
            tensor: OUTPUT,
            expected: vec![0, 0],
            got: shape,
        }));
    };
    let data = file.read(OUTPUT, Dtype::BF16, &shape, None)?;
    Ok(Output {
        tokens,
        hidden,
        y: bytemuck::pod_collect_to_vec(&data),
    })
}
