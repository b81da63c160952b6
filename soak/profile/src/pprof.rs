//! The heap growth as a pprof profile (profile.proto, gzipped), which `pprof` and `go tool pprof`
//! open: two sample types, objects and bytes gained between the two dumps, per stack, with every
//! location's function, file and line.

use std::collections::BTreeMap;
use std::io::Write;

use prost::Message;

use super::symbolize::Frame;

#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    /// Innermost first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
}

/// The binary the addresses are in. Its functions, files, lines and inlined frames are all in
/// the profile already, so `pprof` does not look for the binary to symbolize it again.
#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// Innermost inlined frame first.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
}

/// One stack of a profile: addresses innermost first, the frames at each address, objects gained,
/// bytes gained.
pub type Stack = (Vec<u64>, Vec<Vec<Frame>>, i64, i64);

/// Builds the profile of `stacks`, in `binary`.
pub fn profile(stacks: &[Stack], binary: &str, comment: &str) -> Profile {
    let mut strings: Vec<String> = vec![String::new()];
    let mut string_ids: BTreeMap<String, i64> = BTreeMap::new();
    let mut s = |text: &str| -> i64 {
        if let Some(&i) = string_ids.get(text) {
            return i;
        }
        strings.push(text.to_string());
        let i = strings.len() as i64 - 1;
        string_ids.insert(text.to_string(), i);
        i
    };
    let sample_type = vec![
        ValueType { r#type: s("inuse_objects"), unit: s("count") },
        ValueType { r#type: s("inuse_space"), unit: s("bytes") },
    ];
    let period_type = Some(ValueType { r#type: s("space"), unit: s("bytes") });
    let comment = vec![s(comment)];
    let mapping = vec![Mapping {
        id: 1,
        filename: s(binary),
        has_functions: true,
        has_filenames: true,
        has_line_numbers: true,
        has_inline_frames: true,
    }];
    let mut functions: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut function_list = Vec::new();
    let mut locations: BTreeMap<u64, u64> = BTreeMap::new();
    let mut location_list = Vec::new();
    let mut samples = Vec::new();
    for (addrs, frames, objects, bytes) in stacks {
        let mut ids = Vec::with_capacity(addrs.len());
        for (addr, fs) in addrs.iter().zip(frames) {
            let next_id = location_list.len() as u64 + 1;
            let id = *locations.entry(*addr).or_insert(next_id);
            if id == next_id {
                let line = fs
                    .iter()
                    .map(|f| {
                        let key = (f.function.clone(), f.file.clone().unwrap_or_default());
                        let next = function_list.len() as u64 + 1;
                        let fid = *functions.entry(key.clone()).or_insert(next);
                        if fid == next {
                            let name = s(&key.0);
                            function_list.push(Function { id: fid, name, system_name: name, filename: s(&key.1) });
                        }
                        Line { function_id: fid, line: f.line.unwrap_or(0) as i64 }
                    })
                    .collect();
                location_list.push(Location { id, mapping_id: 1, address: *addr, line });
            }
            ids.push(id);
        }
        samples.push(Sample { location_id: ids, value: vec![*objects, *bytes] });
    }
    Profile {
        sample_type,
        sample: samples,
        mapping,
        location: location_list,
        function: function_list,
        string_table: strings,
        period_type,
        period: 1,
        comment,
    }
}

/// Writes the profile gzipped, as `pprof` reads it.
pub fn write(path: &std::path::Path, p: &Profile) -> std::io::Result<()> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&p.encode_to_vec())?;
    plateau_reports::fsutil::write_atomic(path, &gz.finish()?)
}

/// Reads a gzipped profile back (tests, `plateau explain`).
pub fn read(path: &std::path::Path) -> Result<Profile, String> {
    use std::io::Read;
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&bytes[..])
        .read_to_end(&mut raw)
        .map_err(|e| format!("{}: gzip: {e}", path.display()))?;
    Profile::decode(&raw[..]).map_err(|e| format!("{}: profile.proto: {e}", path.display()))
}
