//! Fuzzing of the problem directory reader (`megamoe_problems::files`). Each target starts from a valid
//! problem that the crate's own generator and writer put on disk, mutates one file and reads the
//! directory back: safetensors files are truncated, get other length fields, headers (dtypes,
//! shapes, offsets, names, duplicates, metadata, padding, arbitrary bytes) and data bytes (NaN
//! codes and scales, expert ids out of range); `config.json` is rebuilt from odd values and
//! mangled. Every input must end in a problem that validates or in a typed error naming the file;
//! never a panic, never an `Io` error (every file is there and readable, so one would mean a read
//! past the end), and never an allocation larger than the largest file of the directory.

use fuzz_harness::{LargestAllocation, fuzz};
use megamoe::problem::{input_shapes, weight_shapes};
use megamoe::{Config, Recipe};
use megamoe_problems::files::{self, FilesError, Output};
use megamoe_problems::generate::{self, GenOptions};
use megamoe_problems::testing::TempDir;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use serde_json::{Map, Value, json};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[global_allocator]
static ALLOC: LargestAllocation = LargestAllocation;

/// Each target's wall-clock budget; its case count takes a few seconds on one core.
const BUDGET: Duration = Duration::from_secs(25);
const CASES: u32 = 20_000;

/// Two ranks of two experts, top-2 of four, four scales per row: every file is at most a few tens
/// of KiB, so a case (write one file, read the whole directory) takes about a millisecond.
fn config() -> Config {
    Config {
        hidden: 128,
        intermediate: 128,
        num_experts: 4,
        top_k: 2,
        num_ranks: 2,
        clamp: Some(10.0),
        recipe: Recipe::Mx32,
    }
}

/// A valid problem directory (with rank 0's output) for one target, and the size of its largest
/// file.
fn valid_dir(target: &str) -> (TempDir, u64) {
    let dir = TempDir::new(&format!("fuzz-{target}"));
    let opts = GenOptions {
        config: config(),
        tokens: 3,
        seed: 11,
        mask_fraction: 0.25,
    };
    files::write_problem(&dir.0, &generate::problem(&opts)).unwrap();
    let hidden = config().hidden;
    let y = Output {
        tokens: 3,
        hidden,
        y: (0..3 * hidden)
            .map(|i| fp_formats::bf16::from_f32(i as f32))
            .collect(),
    };
    files::write_output(&files::output_path(&dir.0, 0), &y).unwrap();
    let largest = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .max()
        .unwrap();
    (dir, largest)
}

/// How a target's cases ended, by outcome: how deep the mutations reach, printed with the count.
#[derive(Default)]
struct Outcomes(RefCell<BTreeMap<String, u32>>);

impl Outcomes {
    fn note<T>(&self, result: &Result<T, FilesError>) {
        let kind = match result {
            Ok(_) => "valid".to_owned(),
            Err(FilesError::Problem { source, .. }) => format!("Problem/{}", variant(source)),
            Err(FilesError::Config { source, .. }) => format!("Config/{}", variant(source)),
            Err(FilesError::Safetensors { source, .. }) => {
                format!("Safetensors/{}", variant(source))
            }
            Err(e) => variant(e),
        };
        *self.0.borrow_mut().entry(kind).or_default() += 1;
    }

    fn report(&self, target: &str) {
        eprintln!("fuzz {target} outcomes: {:?}", self.0.borrow());
    }
}

/// The name of an error's variant (what its Debug form starts with).
fn variant(e: &impl std::fmt::Debug) -> String {
    let debug = format!("{e:?}");
    debug
        .split([' ', '(', '{'])
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// Checks what reading gave after `path` was overwritten with `bytes`: an allocation no larger
/// than any file, and either a valid result (`ok` checks it) or a typed, non-`Io` error whose
/// message names the file.
fn check_read<T>(
    outcomes: &Outcomes,
    path: &Path,
    bytes: &[u8],
    largest_file: u64,
    read: impl FnOnce() -> Result<T, FilesError>,
    ok: impl FnOnce(T) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    std::fs::write(path, bytes).unwrap();
    let (result, largest) = LargestAllocation::during(read);
    outcomes.note(&result);
    let bound = largest_file.max(bytes.len() as u64);
    prop_assert!(
        largest as u64 <= bound,
        "allocated {largest} bytes reading files of at most {bound}"
    );
    match result {
        Ok(value) => ok(value),
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(!matches!(e, FilesError::Io { .. }), "{msg}");
            // A valid config that disagrees with the rank files is reported by the files it
            // disagrees with; every other error names the mutated file.
            let name = path.file_name().unwrap().to_str().unwrap();
            let disagreement =
                name == files::CONFIG_FILE && !matches!(e, FilesError::Config { .. });
            prop_assert!(
                disagreement || msg.contains(name),
                "`{msg}` does not name {name}"
            );
            Ok(())
        }
    }
}

/// Reads the whole directory; a problem that comes back must validate.
fn check_problem(
    outcomes: &Outcomes,
    dir: &Path,
    path: &Path,
    bytes: &[u8],
    largest_file: u64,
) -> Result<(), TestCaseError> {
    check_read(
        outcomes,
        path,
        bytes,
        largest_file,
        || files::read_problem(dir),
        |p| {
            prop_assert_eq!(p.validate(), Ok(()));
            Ok(())
        },
    )
}

/// A safetensors file taken apart: header entries in order (repeats allowed) and the data section.
#[derive(Clone, Debug)]
struct Parts {
    entries: Vec<(String, Value)>,
    data: Vec<u8>,
}

impl Parts {
    fn of(bytes: &[u8]) -> Parts {
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        Parts {
            entries: header.into_iter().collect(),
            data: bytes[8 + n..].to_vec(),
        }
    }

    /// The `data_offsets` of each entry that has them.
    fn ranges(&self) -> Vec<(u64, u64)> {
        self.entries
            .iter()
            .filter_map(|(_, v)| {
                let o = v.get("data_offsets")?;
                Some((o.get(0)?.as_u64()?, o.get(1)?.as_u64()?))
            })
            .collect()
    }

    fn entry(&mut self, i: &Index) -> Option<&mut (String, Value)> {
        let n = self.entries.len();
        (n > 0).then(|| &mut self.entries[i.index(n)])
    }

    fn header_text(&self, pad: usize) -> Vec<u8> {
        let fields: Vec<String> = self
            .entries
            .iter()
            .map(|(k, v)| format!("{}:{v}", Value::from(k.as_str())))
            .collect();
        format!("{{{}}}{}", fields.join(","), " ".repeat(pad)).into_bytes()
    }
}

/// One change to a safetensors header.
#[derive(Clone, Debug)]
enum HeaderEdit {
    Dtype(Index, Value),
    Shape(Index, Value),
    /// Reverses a tensor's dimensions: the same size under another shape.
    Transpose(Index),
    Offsets(Index, Value),
    /// Exchanges two tensors' offsets: out of order, or overlapping when their sizes differ.
    SwapOffsets(Index, Index),
    Rename(Index, String),
    Remove(Index),
    /// Repeats an entry, under the same name.
    Duplicate(Index),
    Add(String, Value),
    /// Appends `count` U8 tensors that tile the offsets from the data's end up to u64::MAX − k:
    /// each one valid, their sum beyond any file.
    Tile {
        count: u64,
        k: u64,
    },
    Metadata(Value),
    /// Trailing spaces, which the format allows.
    Pad(usize),
    /// The whole header replaced by these bytes.
    Replace(Vec<u8>),
}

/// One change to the bytes of the file, after the header is rebuilt.
#[derive(Clone, Debug)]
enum ByteEdit {
    /// Cuts the file at one of its boundaries (start, length field, header, each tensor's end)
    /// moved by a few bytes.
    TruncateNear(Index, i8),
    Truncate(Index),
    LengthField(u64),
    Set(Index, u8),
    Insert(Index, Vec<u8>),
    Delete(Index, u8),
    /// Sets a byte inside the data of a tensor (chosen in the unmutated file).
    Data {
        tensor: Index,
        at: Index,
        byte: u8,
    },
}

/// Numbers where size arithmetic breaks: zero, small, near the file's sizes, near 2^32, 2^61
/// (an element count whose bytes overflow), 2^63, u64::MAX.
fn number() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => 0..=4u64,
        2 => 0..70_000u64,
        1 => select(vec![
            127,
            128,
            255,
            256,
            u32::MAX as u64,
            1 << 32,
            1 << 61,
            (1 << 61) + 1,
            1 << 63,
            u64::MAX - 1,
            u64::MAX,
        ]),
        1 => any::<u64>(),
    ]
}

/// A JSON value where a number belongs: mostly numbers, sometimes what a number is not.
fn json_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => number().prop_map(Value::from),
        1 => select(vec![
            json!(-1),
            json!(1.5),
            json!(1e30),
            json!("7"),
            json!(null),
            json!([]),
            json!({"n": 1}),
            json!(true),
        ]),
    ]
}

fn dtype() -> impl Strategy<Value = Value> {
    let names = [
        "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16",
        "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64", "u8", "", "C64",
    ];
    prop_oneof![
        5 => select(names.to_vec()).prop_map(Value::from),
        1 => json_number(),
    ]
}

fn shape() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => proptest::collection::vec(json_number(), 0..5).prop_map(Value::from),
        1 => json_number(),
    ]
}

fn offsets() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => (json_number(), json_number()).prop_map(|(a, b)| json!([a, b])),
        1 => proptest::collection::vec(json_number(), 0..4).prop_map(Value::from),
        1 => json_number(),
    ]
}

fn name() -> impl Strategy<Value = String> {
    select(vec![
        "w1",
        "w1_sf",
        "w2",
        "w2_sf",
        "x",
        "x_sf",
        "topk_idx",
        "topk_weights",
        "y",
        "bias",
        "__metadata__",
        "",
        "w1 ",
        "\u{0}",
    ])
    .prop_map(str::to_owned)
}

fn tensor_info() -> impl Strategy<Value = Value> {
    (dtype(), shape(), offsets())
        .prop_map(|(d, s, o)| json!({"dtype": d, "shape": s, "data_offsets": o}))
}

/// Header bytes that are not a header: arbitrary bytes, other JSON, deep nesting, non-UTF-8.
fn junk_header() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => proptest::collection::vec(any::<u8>(), 0..64),
        1 => (1..20_000usize).prop_map(|n| "[".repeat(n).into_bytes()),
        1 => select(vec![
            &b"{}"[..],
            b"[]",
            b"null",
            b"{\"x\":",
            b"{\"\xff\xfe\":{}}",
            b"{\"x\":{\"dtype\":\"U8\",\"shape\":[1e999],\"data_offsets\":[0,0]}}",
            b"{\"__metadata__\":{\"a\":1}}",
        ])
        .prop_map(<[u8]>::to_vec),
    ]
}

fn header_edit() -> impl Strategy<Value = HeaderEdit> {
    prop_oneof![
        (any::<Index>(), dtype()).prop_map(|(i, v)| HeaderEdit::Dtype(i, v)),
        (any::<Index>(), shape()).prop_map(|(i, v)| HeaderEdit::Shape(i, v)),
        any::<Index>().prop_map(HeaderEdit::Transpose),
        (any::<Index>(), offsets()).prop_map(|(i, v)| HeaderEdit::Offsets(i, v)),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| HeaderEdit::SwapOffsets(a, b)),
        (any::<Index>(), name()).prop_map(|(i, n)| HeaderEdit::Rename(i, n)),
        any::<Index>().prop_map(HeaderEdit::Remove),
        any::<Index>().prop_map(HeaderEdit::Duplicate),
        (name(), tensor_info()).prop_map(|(n, v)| HeaderEdit::Add(n, v)),
        (1..=12u64, 0..=64u64).prop_map(|(count, k)| HeaderEdit::Tile { count, k }),
        prop_oneof![
            Just(json!({"format": "pt"})),
            Just(json!({"a": 1})),
            Just(json!(["a"])),
            json_number(),
        ]
        .prop_map(HeaderEdit::Metadata),
        prop_oneof![0..16usize, 0..200_000usize].prop_map(HeaderEdit::Pad),
        junk_header().prop_map(HeaderEdit::Replace),
    ]
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    let interesting = prop_oneof![
        Just(0u8),
        Just(0x7f),
        Just(0x80),
        Just(0xfe),
        Just(0xff),
        any::<u8>(),
    ];
    prop_oneof![
        (any::<Index>(), -2i8..=2).prop_map(|(i, d)| ByteEdit::TruncateNear(i, d)),
        any::<Index>().prop_map(ByteEdit::Truncate),
        number().prop_map(ByteEdit::LengthField),
        (any::<Index>(), interesting.clone()).prop_map(|(i, b)| ByteEdit::Set(i, b)),
        (
            any::<Index>(),
            proptest::collection::vec(any::<u8>(), 1..16)
        )
            .prop_map(|(i, b)| ByteEdit::Insert(i, b)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, n)| ByteEdit::Delete(i, n)),
        (any::<Index>(), any::<Index>(), interesting)
            .prop_map(|(tensor, at, byte)| ByteEdit::Data { tensor, at, byte }),
    ]
}

/// `valid` (a safetensors file) after `header` edits, then `bytes` edits.
fn mutate(valid: &[u8], header: &[HeaderEdit], bytes: &[ByteEdit]) -> Vec<u8> {
    let original = Parts::of(valid);
    let mut parts = original.clone();
    let (mut pad, mut replaced) = (0, None);
    for edit in header {
        match edit {
            HeaderEdit::Dtype(i, v) => set_field(&mut parts, i, "dtype", v),
            HeaderEdit::Shape(i, v) => set_field(&mut parts, i, "shape", v),
            HeaderEdit::Transpose(i) => {
                let shape = parts.entry(i).and_then(|e| e.1.get_mut("shape"));
                if let Some(dims) = shape.and_then(Value::as_array_mut) {
                    dims.reverse();
                }
            }
            HeaderEdit::Offsets(i, v) => set_field(&mut parts, i, "data_offsets", v),
            HeaderEdit::SwapOffsets(a, b) => {
                let n = parts.entries.len();
                if n > 0 {
                    let (a, b) = (a.index(n), b.index(n));
                    let take =
                        |e: &mut (String, Value)| e.1.get_mut("data_offsets").map(Value::take);
                    let (oa, ob) = (take(&mut parts.entries[a]), take(&mut parts.entries[b]));
                    for (i, o) in [(a, ob), (b, oa)] {
                        if let (Some(o), Some(obj)) = (o, parts.entries[i].1.as_object_mut()) {
                            obj.insert("data_offsets".into(), o);
                        }
                    }
                }
            }
            HeaderEdit::Rename(i, name) => {
                if let Some(e) = parts.entry(i) {
                    e.0.clone_from(name);
                }
            }
            HeaderEdit::Remove(i) => {
                if !parts.entries.is_empty() {
                    parts.entries.remove(i.index(parts.entries.len()));
                }
            }
            HeaderEdit::Duplicate(i) => {
                if let Some(e) = parts.entry(i).cloned() {
                    parts.entries.push(e);
                }
            }
            HeaderEdit::Add(name, info) => parts.entries.push((name.clone(), info.clone())),
            HeaderEdit::Tile { count, k } => {
                let mut start = parts.data.len() as u64;
                let size = (u64::MAX - k - start) / count;
                for i in 0..*count {
                    let end = if i + 1 == *count {
                        u64::MAX - k
                    } else {
                        start + size
                    };
                    let info = json!({"dtype": "U8", "shape": [end - start], "data_offsets": [start, end]});
                    parts.entries.push((format!("t{i}"), info));
                    start = end;
                }
            }
            HeaderEdit::Metadata(v) => parts.entries.push(("__metadata__".into(), v.clone())),
            HeaderEdit::Pad(n) => pad = *n,
            HeaderEdit::Replace(b) => replaced = Some(b.clone()),
        }
    }
    let text = replaced.unwrap_or_else(|| parts.header_text(pad));
    let mut file = (text.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&text);
    let data_start = file.len();
    file.extend_from_slice(&parts.data);
    let ranges = original.ranges();
    let mut boundaries = vec![0, 8, data_start];
    boundaries.extend(ranges.iter().map(|r| data_start + r.1 as usize));
    for edit in bytes {
        let len = file.len();
        match edit {
            ByteEdit::TruncateNear(i, d) => {
                let b = boundaries[i.index(boundaries.len())];
                file.truncate(b.saturating_add_signed((*d).into()));
            }
            ByteEdit::Truncate(i) => file.truncate(i.index(len + 1)),
            ByteEdit::LengthField(n) => {
                if len >= 8 {
                    file[..8].copy_from_slice(&n.to_le_bytes());
                }
            }
            ByteEdit::Set(i, b) => {
                if len > 0 {
                    file[i.index(len)] = *b;
                }
            }
            ByteEdit::Insert(i, b) => {
                let at = i.index(len + 1);
                file.splice(at..at, b.iter().copied());
            }
            ByteEdit::Delete(i, n) => {
                let at = i.index(len + 1);
                file.drain(at..(at + *n as usize).min(len));
            }
            ByteEdit::Data { tensor, at, byte } => {
                let (begin, end) = ranges[tensor.index(ranges.len())];
                let at = data_start + begin as usize + at.index((end - begin).max(1) as usize);
                if at < len {
                    file[at] = *byte;
                }
            }
        }
    }
    file
}

fn set_field(parts: &mut Parts, i: &Index, field: &str, value: &Value) {
    if let Some(obj) = parts.entry(i).and_then(|e| e.1.as_object_mut()) {
        obj.insert(field.into(), value.clone());
    }
}

fn file_edits() -> impl Strategy<Value = (Vec<HeaderEdit>, Vec<ByteEdit>)> {
    (
        proptest::collection::vec(header_edit(), 0..3),
        proptest::collection::vec(byte_edit(), 0..3),
    )
}

/// Fuzzes the safetensors file `path_of(dir)` of a valid directory through [`check_problem`].
fn fuzz_rank_file(target: &str, path_of: fn(&Path) -> PathBuf) {
    let (dir, largest_file) = valid_dir(target);
    let path = path_of(&dir.0);
    let valid = std::fs::read(&path).unwrap();
    let outcomes = Outcomes::default();
    fuzz(target, CASES, BUDGET, file_edits(), |(header, bytes)| {
        let file = mutate(&valid, &header, &bytes);
        check_problem(&outcomes, &dir.0, &path, &file, largest_file)
    });
    outcomes.report(target);
}

#[test]
fn weights_files() {
    fuzz_rank_file("files/weights", |dir| files::weights_path(dir, 0));
}

#[test]
fn inputs_files() {
    fuzz_rank_file("files/inputs", |dir| files::inputs_path(dir, 1));
}

#[test]
fn output_files() {
    let (dir, largest_file) = valid_dir("output");
    let path = files::output_path(&dir.0, 0);
    let valid = std::fs::read(&path).unwrap();
    let outcomes = Outcomes::default();
    fuzz(
        "files/output",
        CASES,
        BUDGET,
        file_edits(),
        |(header, bytes)| {
            let file = mutate(&valid, &header, &bytes);
            check_read(
                &outcomes,
                &path,
                &file,
                largest_file,
                || files::read_output(&path),
                |y| {
                    prop_assert_eq!(y.y.len(), y.tokens * y.hidden);
                    Ok(())
                },
            )
        },
    );
    outcomes.report("files/output");
}

/// A value for a `config.json` key: a sensible one for that key, or anything.
fn config_value(sensible: Value) -> impl Strategy<Value = Value> {
    prop_oneof![
        12 => Just(sensible),
        2 => select(vec![
            0u64,
            1,
            2,
            4,
            8,
            32,
            64,
            128,
            256,
            1 << 20,
            (1 << 20) + 128,
            1 << 40,
            1 << 62,
            u64::MAX - 127,
            u64::MAX,
        ])
        .prop_map(Value::from),
        1 => (0..64u64).prop_map(|n| Value::from(n * 128)),
        1 => select(vec![
            json!(-1),
            json!(-128),
            json!(128.0),
            json!(1.5),
            json!(-0.0),
            json!(1e39),
            json!(1e300),
            json!("256"),
            json!(null),
            json!(true),
            json!([128]),
            json!({}),
        ]),
        1 => any::<u64>().prop_map(Value::from),
    ]
}

/// A change to `config.json`'s text.
#[derive(Clone, Debug)]
enum TextEdit {
    Truncate(Index),
    Set(Index, u8),
    Insert(Index, Vec<u8>),
    /// Repeats a key before the closing brace.
    RepeatKey(String),
    Replace(Vec<u8>),
}

/// `config.json`'s bytes, shown as text when a case fails.
#[derive(Clone)]
struct Text(Vec<u8>);

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

fn config_text() -> impl Strategy<Value = Text> {
    let valid = serde_json::from_str::<Map<String, Value>>(&config().to_json()).unwrap();
    let keys: Vec<(String, Value)> = valid.into_iter().collect();
    let fields = keys
        .into_iter()
        .map(|(k, v)| (Just(k), proptest::option::weighted(0.97, config_value(v))))
        .collect::<Vec<_>>();
    let extra = proptest::collection::vec(
        (
            select(vec![
                "bias",
                "Hidden",
                "hidden ",
                "experts",
                "",
                "act_scale_block",
            ]),
            config_value(json!(1)),
        ),
        0..2,
    );
    let extra = prop_oneof![3 => Just(Vec::new()), 1 => extra];
    let edit = prop_oneof![
        any::<Index>().prop_map(TextEdit::Truncate),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| TextEdit::Set(i, b)),
        (any::<Index>(), proptest::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(i, b)| TextEdit::Insert(i, b)),
        select(vec!["hidden", "top_k", "clamp"]).prop_map(|k| TextEdit::RepeatKey(k.into())),
        junk_header().prop_map(TextEdit::Replace),
    ];
    let edits = prop_oneof![
        3 => Just(Vec::new()),
        1 => proptest::collection::vec(edit, 1..3),
    ];
    (fields, extra, edits).prop_map(|(fields, extra, edits)| {
        let mut json = Map::new();
        for (k, v) in fields {
            json.extend(v.map(|v| (k, v)));
        }
        json.extend(extra.into_iter().map(|(k, v)| (k.to_owned(), v)));
        let mut text = serde_json::to_vec_pretty(&json).unwrap();
        for edit in edits {
            let len = text.len();
            match edit {
                TextEdit::Truncate(i) => text.truncate(i.index(len + 1)),
                TextEdit::Set(i, b) => {
                    if len > 0 {
                        text[i.index(len)] = b;
                    }
                }
                TextEdit::Insert(i, b) => {
                    let at = i.index(len + 1);
                    text.splice(at..at, b);
                }
                TextEdit::RepeatKey(k) => {
                    if let Some(end) = text.iter().rposition(|&b| b == b'}') {
                        text.splice(end..end, format!(",\"{k}\": 128").into_bytes());
                    }
                }
                TextEdit::Replace(b) => text = b,
            }
        }
        Text(text)
    })
}

/// A config that parses validates, survives its own `config.json`, and has tensor shapes whose
/// element counts fit in a usize.
fn check_config(text: &[u8]) -> Result<(), TestCaseError> {
    let Ok(text) = std::str::from_utf8(text) else {
        return Ok(());
    };
    if let Ok(c) = Config::from_json(text) {
        prop_assert_eq!(c.validate(), Ok(()));
        prop_assert_eq!(Config::from_json(&c.to_json()), Ok(c));
        let shapes = weight_shapes(&c)
            .into_iter()
            .chain(input_shapes(&c, 1 << 20));
        for (name, shape) in shapes {
            let elements = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
            prop_assert!(elements.is_some(), "{name} {shape:?} overflows");
        }
    }
    Ok(())
}

#[test]
fn config_json() {
    let (dir, largest_file) = valid_dir("config");
    let path = dir.0.join(files::CONFIG_FILE);
    let outcomes = Outcomes::default();
    fuzz(
        "files/config",
        CASES,
        BUDGET,
        config_text(),
        |Text(text)| {
            check_config(&text)?;
            check_problem(&outcomes, &dir.0, &path, &text, largest_file)
        },
    );
    outcomes.report("files/config");
}

/// A length field just under the format's header limit in a sparse file of a GiB must be refused
/// before the header is read into memory (a real weights file is that large).
#[test]
fn a_huge_length_field_in_a_huge_file_allocates_nothing() {
    let dir = TempDir::new("fuzz-sparse");
    let path = files::output_path(&dir.0, 0);
    for n in [100_000_001u64, 900_000_000, (1 << 30) - 8, 1 << 30] {
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(&n.to_le_bytes()).unwrap();
        file.set_len(1 << 30).unwrap();
        let (result, largest) = LargestAllocation::during(|| files::read_output(&path));
        let err = result.expect_err("a header beyond the limit is refused");
        assert!(err.to_string().contains("header too large"), "{err}");
        assert!(largest < 1 << 20, "allocated {largest} bytes");
    }
}
