//! Problem files: round trips, and one test per kind of bad input, each checking the typed
//! error and that its message names the tensor (or file) and the problem.

use megamoe::{ConfigError, Problem, ProblemError, Recipe};
use megamoe_problems::files::{self, FilesError, Output};
use megamoe_problems::testing::{TempDir, tiny_problem};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::path::Path;

const TOKENS: usize = 16;

fn problem() -> Problem {
    tiny_problem(2, TOKENS, Recipe::Mx32, Some(10.0), 0.2)
}

/// A problem dir written from `p` after `mutate` changed it.
fn written(name: &str, mutate: impl FnOnce(&mut Problem)) -> TempDir {
    let dir = TempDir::new(name);
    let mut p = problem();
    mutate(&mut p);
    files::write_problem(&dir.0, &p).unwrap();
    dir
}

type Tensor = (String, Dtype, Vec<usize>, Vec<u8>);

/// Rewrites a safetensors file through `edit` on its list of tensors.
fn rewrite(path: &Path, edit: impl FnOnce(&mut Vec<Tensor>)) {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<Tensor> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    edit(&mut tensors);
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn tensor<'a>(tensors: &'a mut [Tensor], name: &str) -> &'a mut Tensor {
    tensors.iter_mut().find(|t| t.0 == name).unwrap()
}

/// Reads the problem back, expecting an error whose message mentions every word of `names`.
fn read_error(dir: &TempDir, names: &[&str]) -> FilesError {
    let err = files::read_problem(&dir.0).expect_err("bad input must be refused");
    let msg = err.to_string();
    for n in names {
        assert!(msg.contains(n), "`{msg}` should mention `{n}`");
    }
    err
}

fn problem_error(err: FilesError) -> ProblemError {
    match err {
        FilesError::Problem { source, .. } => source,
        other => panic!("expected a problem in the data, got {other}"),
    }
}

#[test]
fn problem_and_output_round_trip() {
    let dir = TempDir::new("round-trip");
    for (tokens, recipe) in [(TOKENS, Recipe::G128), (0, Recipe::Mx32)] {
        let p = tiny_problem(2, tokens, recipe, None, 0.5);
        files::write_problem(&dir.0, &p).unwrap();
        assert_eq!(files::read_problem(&dir.0).unwrap(), p);
        let y = Output {
            tokens,
            hidden: 256,
            y: (0..tokens * 256)
                .map(|i| fp_formats::bf16::from_f32(i as f32 - 7.5))
                .collect(),
        };
        let path = files::output_path(&dir.0, 1);
        files::write_output(&path, &y).unwrap();
        assert_eq!(files::read_output(&path).unwrap(), y);
        assert_eq!(files::output_ranks(&dir.0).unwrap(), vec![1]);
    }
}

#[test]
fn wrong_shape() {
    let dir = written("shape", |_| {});
    rewrite(&files::weights_path(&dir.0, 1), |t| {
        let w1 = tensor(t, "w1");
        w1.2[2] -= 16;
        w1.3.truncate(w1.2.iter().product());
    });
    let err = problem_error(read_error(&dir, &["weights.rank1", "`w1`", "shape"]));
    assert_eq!(
        err,
        ProblemError::Shape {
            tensor: "w1",
            expected: vec![4, 256, 128],
            got: vec![4, 256, 112]
        }
    );
}

#[test]
fn wrong_dtype() {
    let dir = written("dtype", |_| {});
    rewrite(&files::inputs_path(&dir.0, 0), |t| {
        tensor(t, "x").1 = Dtype::U8
    });
    let err = read_error(&dir, &["inputs.rank0", "`x`", "dtype U8", "F8_E4M3"]);
    assert!(matches!(
        err,
        FilesError::Dtype {
            tensor: "x",
            expected: Dtype::F8_E4M3,
            got: Dtype::U8,
            ..
        }
    ));
}

#[test]
fn missing_rank_file() {
    let dir = written("missing-rank", |_| {});
    std::fs::remove_file(files::inputs_path(&dir.0, 1)).unwrap();
    let err = read_error(&dir, &["1 inputs.rank*", "num_ranks = 2"]);
    assert!(
        matches!(err, FilesError::RankFiles { kind: "inputs", ref found, expected: 2, .. } if found == &[0])
    );
}

#[test]
fn rank_file_under_another_spelling() {
    let dir = written("rank-spelling", |_| {});
    for spelling in ["01", "+1"] {
        std::fs::rename(
            files::weights_path(&dir.0, 1),
            dir.0.join(format!("weights.rank{spelling}.safetensors")),
        )
        .unwrap();
        let err = read_error(&dir, &["1 weights.rank*", "ranks [0]", "num_ranks = 2"]);
        assert!(matches!(
            err,
            FilesError::RankFiles {
                kind: "weights",
                ..
            }
        ));
        std::fs::rename(
            dir.0.join(format!("weights.rank{spelling}.safetensors")),
            files::weights_path(&dir.0, 1),
        )
        .unwrap();
    }
}

#[test]
fn extra_rank_file() {
    let dir = written("extra-rank", |_| {});
    std::fs::copy(
        files::weights_path(&dir.0, 1),
        files::weights_path(&dir.0, 2),
    )
    .unwrap();
    let err = read_error(&dir, &["3 weights.rank*", "num_ranks = 2"]);
    assert!(
        matches!(err, FilesError::RankFiles { kind: "weights", ref found, expected: 2, .. } if found == &[0, 1, 2])
    );
}

#[test]
fn num_ranks_disagrees_with_the_files() {
    let dir = written("num-ranks", |_| {});
    let config = problem().config.with_ranks(1);
    std::fs::write(dir.0.join(files::CONFIG_FILE), config.to_json()).unwrap();
    let err = read_error(&dir, &["ranks [0, 1]", "num_ranks = 1"]);
    assert!(matches!(err, FilesError::RankFiles { expected: 1, .. }));
}

#[test]
fn channels_not_multiples_of_128() {
    let dir = written("channels", |_| {});
    let path = dir.0.join(files::CONFIG_FILE);
    let json = problem().config.to_json();
    std::fs::write(&path, json.replace("\"hidden\": 256", "\"hidden\": 200")).unwrap();
    let err = read_error(&dir, &["config.json", "hidden H = 200", "multiple of 128"]);
    assert!(matches!(
        err,
        FilesError::Config {
            source: ConfigError::Hidden(200),
            ..
        }
    ));
    std::fs::write(
        &path,
        json.replace("\"intermediate\": 128", "\"intermediate\": 192"),
    )
    .unwrap();
    let err = read_error(&dir, &["intermediate I = 192"]);
    assert!(matches!(
        err,
        FilesError::Config {
            source: ConfigError::Intermediate(192),
            ..
        }
    ));
}

#[test]
fn expert_index_out_of_range() {
    for (value, name) in [(8, "too-big"), (-2, "below-minus-one")] {
        let dir = written(name, |p| p.inputs[1].topk_idx[5] = value);
        let err = problem_error(read_error(
            &dir,
            &["inputs.rank1", "`topk_idx`[2, 1]", &value.to_string()],
        ));
        assert_eq!(
            err,
            ProblemError::ExpertIndex {
                token: 2,
                slot: 1,
                value,
                experts: 8
            }
        );
    }
}

#[test]
fn nan_scale_in_weights() {
    let dir = written("nan-scale", |p| p.weights[0].w1_sf[8 * 3 + 1] = 255);
    let err = problem_error(read_error(&dir, &["weights.rank0", "`w1_sf`", "NaN"]));
    assert_eq!(
        err,
        ProblemError::NanScale {
            tensor: "w1_sf",
            index: vec![0, 3, 1]
        }
    );
}

#[test]
fn weights_not_finite_after_decoding() {
    // Scale 2^127 times E2M1 code 6 (byte 0x77 = two sixes) overflows f32.
    let dir = written("inf-weight", |p| {
        p.weights[1].w2_sf[5] = 254;
        p.weights[1].w2[5 * 16] = 0x77;
    });
    let err = problem_error(read_error(&dir, &["weights.rank1", "`w2`", "not a finite"]));
    assert_eq!(
        err,
        ProblemError::NonFinite {
            tensor: "w2",
            index: vec![0, 1, 32],
            exponent: 127
        }
    );
}

#[test]
fn nan_code_in_activations() {
    for code in [0x7f, 0xff] {
        let dir = written(&format!("nan-x-{code}"), |p| p.inputs[0].x[256 + 3] = code);
        let err = problem_error(read_error(&dir, &["inputs.rank0", "`x`[1, 3]", "NaN"]));
        assert_eq!(
            err,
            ProblemError::NanCode {
                tensor: "x",
                index: vec![1, 3],
                code
            }
        );
    }
}

#[test]
fn token_count_differs_within_a_rank() {
    let dir = written("tokens", |_| {});
    rewrite(&files::inputs_path(&dir.0, 1), |t| {
        let w = tensor(t, "topk_weights");
        w.2[0] += 1;
        w.3.extend([0; 8]);
    });
    let err = problem_error(read_error(
        &dir,
        &["inputs.rank1", "`topk_weights`", "17 tokens", "`x` has 16"],
    ));
    assert_eq!(
        err,
        ProblemError::Tokens {
            tensor: "topk_weights",
            expected: TOKENS,
            got: TOKENS + 1
        }
    );
}

#[test]
fn topk_weight_not_finite() {
    let dir = written("topk-weight", |p| p.inputs[0].topk_weights[3] = f32::NAN);
    let err = problem_error(read_error(
        &dir,
        &["inputs.rank0", "`topk_weights`[1, 1]", "not finite"],
    ));
    assert!(matches!(
        err,
        ProblemError::TopkWeight {
            token: 1,
            slot: 1,
            ..
        }
    ));
}

#[test]
fn missing_and_unexpected_tensors() {
    let dir = written("missing-tensor", |_| {});
    rewrite(&files::weights_path(&dir.0, 0), |t| {
        t.retain(|x| x.0 != "w2_sf")
    });
    let err = read_error(&dir, &["weights.rank0", "`w2_sf` is missing"]);
    assert!(matches!(
        err,
        FilesError::Missing {
            tensor: "w2_sf",
            ..
        }
    ));

    let dir = written("extra-tensor", |_| {});
    rewrite(&files::inputs_path(&dir.0, 0), |t| {
        t.push(("bias".into(), Dtype::F32, vec![1], vec![0; 4]))
    });
    let err = read_error(&dir, &["inputs.rank0", "unexpected tensor `bias`"]);
    assert!(matches!(err, FilesError::Unexpected { ref tensor, .. } if tensor == "bias"));
}

#[test]
fn not_a_safetensors_file() {
    let dir = written("garbage", |_| {});
    std::fs::write(files::inputs_path(&dir.0, 1), b"not safetensors").unwrap();
    let err = read_error(&dir, &["inputs.rank1", "safetensors"]);
    assert!(matches!(err, FilesError::Safetensors { .. }));
}

#[test]
fn a_tensor_named_twice() {
    let dir = written("duplicate", |_| {});
    let path = files::inputs_path(&dir.0, 0);
    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let text = std::str::from_utf8(&bytes[8..8 + n]).unwrap().trim_end();
    let header: serde_json::Value = serde_json::from_str(text).unwrap();
    // The same entry again before the closing brace: the data still tiles.
    let repeated = format!("{},\"x\":{}}}", &text[..text.len() - 1], header["x"]);
    let mut file = (repeated.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(repeated.as_bytes());
    file.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(&path, file).unwrap();
    let err = read_error(&dir, &["inputs.rank0", "`x` appears more than once"]);
    assert!(matches!(err, FilesError::Duplicate { ref tensor, .. } if tensor == "x"));
}
