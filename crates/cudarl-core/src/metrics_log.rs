//! Live per-step metrics of a training stage, written as each step ends, under
//! `<store>/runs/<run-id>/<node>/`:
//! - `metrics.jsonl`: one JSON object per step (what the stage's `metrics` table will hold),
//!   flushed per line, to `tail -f` or read with pandas/polars;
//! - `events.out.tfevents.<seconds>.cudarl`: the same numbers as TensorBoard scalars, one tag per
//!   numeric field (`tensorboard --logdir <store>/runs`).
//!
//! The Parquet tables stay the record; these files are for watching a run.
//!
//! The event file is TensorBoard's TFRecord framing of `tensorflow.Event` protobufs
//! (tensorflow/core/util/event.proto and framework/summary.proto; framing in
//! tensorflow/core/lib/io/record_writer.cc): each record is its length (u64, little-endian),
//! the length's masked CRC-32C, the bytes and their masked CRC-32C, the mask being
//! `((crc >> 15) | (crc << 17)) + 0xa282ead8` (tensorflow/core/lib/hash/crc32c.h). The first
//! event carries `file_version = "brain.Event:2"`. Messages are encoded with `prost`, the
//! checksum with `crc` (`CRC_32_ISCSI`). No maintained Rust TensorBoard writer exists to use
//! instead: tensorboard-rs is marked inactive by its author and syntaxdot-summary's last release
//! is from 2022.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// `tensorflow.Summary.Value` with the `simple_value` case only.
#[derive(Clone, PartialEq, prost::Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, tag = "2")]
    simple_value: f32,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

/// `tensorflow.Event` with the `file_version` and `summary` cases of its `what` oneof (at most
/// one set per event, which is what the oneof's wire format is).
#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(string, optional, tag = "3")]
    file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    summary: Option<Summary>,
}

const CRC32C: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

fn masked_crc(bytes: &[u8]) -> u32 {
    let c = CRC32C.checksum(bytes);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The live metrics files of one node in one run.
#[derive(Debug)]
pub struct MetricsLog {
    dir: PathBuf,
    jsonl: BufWriter<File>,
    events: BufWriter<File>,
}

impl MetricsLog {
    /// Creates `dir` and its two files (`metrics.jsonl`, `events.out.tfevents.*`), the event
    /// file starting with its version record.
    ///
    /// # Errors
    /// The folder or a file cannot be created or written.
    pub fn create(dir: &Path) -> io::Result<MetricsLog> {
        std::fs::create_dir_all(dir)?;
        let t = now();
        let events = File::create(dir.join(format!("events.out.tfevents.{}.cudarl", t as u64)))?;
        let mut log = MetricsLog {
            dir: dir.to_path_buf(),
            jsonl: BufWriter::new(File::create(dir.join("metrics.jsonl"))?),
            events: BufWriter::new(events),
        };
        log.record(&Event {
            wall_time: t,
            step: 0,
            file_version: Some("brain.Event:2".into()),
            summary: None,
        })?;
        Ok(log)
    }

    /// The folder the files are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn record(&mut self, e: &Event) -> io::Result<()> {
        let data = prost::Message::encode_to_vec(e);
        let len = (data.len() as u64).to_le_bytes();
        self.events.write_all(&len)?;
        self.events.write_all(&masked_crc(&len).to_le_bytes())?;
        self.events.write_all(&data)?;
        self.events.write_all(&masked_crc(&data).to_le_bytes())?;
        self.events.flush()
    }

    /// Appends step `step`: `row` (a JSON object) as one line of `metrics.jsonl`, and each of its
    /// finite numeric fields but `step` as a scalar of that name (f32, TensorBoard's
    /// `simple_value`); both files are flushed.
    ///
    /// # Errors
    /// A write fails.
    pub fn log(&mut self, step: i64, row: &serde_json::Value) -> io::Result<()> {
        let line = serde_json::to_string(row).map_err(io::Error::other)?;
        writeln!(self.jsonl, "{line}")?;
        self.jsonl.flush()?;
        let value = row
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| k.as_str() != "step")
            .filter_map(|(k, v)| Some((k, v.as_f64().filter(|x| x.is_finite())?)))
            .map(|(k, x)| SummaryValue {
                tag: k.clone(),
                simple_value: x as f32,
            })
            .collect();
        self.record(&Event {
            wall_time: now(),
            step,
            file_version: None,
            summary: Some(Summary { value }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The framing read back: lengths and checksums as TensorFlow's reader checks them, and the
    /// known masked CRC-32C of a published test vector (crc32c("123456789") = 0xe3069283).
    #[test]
    fn records_are_framed_and_checksummed_as_tfrecord() {
        assert_eq!(CRC32C.checksum(b"123456789"), 0xe306_9283);
        let d = tempfile::tempdir().unwrap();
        let mut log = MetricsLog::create(&d.path().join("n")).unwrap();
        log.log(1, &serde_json::json!({"step": 1, "loss": 2.5, "note": "x"}))
            .unwrap();
        log.log(2, &serde_json::json!({"step": 2, "loss": 2.0}))
            .unwrap();
        drop(log);
        let lines = std::fs::read_to_string(d.path().join("n/metrics.jsonl")).unwrap();
        assert_eq!(lines.lines().count(), 2);
        let f = std::fs::read_dir(d.path().join("n"))
            .unwrap()
            .flatten()
            .find(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("events.out.tfevents.")
            })
            .unwrap();
        let bytes = std::fs::read(f.path()).unwrap();
        let mut at = 0;
        let mut events = Vec::new();
        while at < bytes.len() {
            let len = &bytes[at..at + 8];
            let n = u64::from_le_bytes(len.try_into().unwrap()) as usize;
            let crc_len = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            assert_eq!(crc_len, masked_crc(len));
            let data = &bytes[at + 12..at + 12 + n];
            let crc_data = u32::from_le_bytes(bytes[at + 12 + n..at + 16 + n].try_into().unwrap());
            assert_eq!(crc_data, masked_crc(data));
            events.push(<Event as prost::Message>::decode(data).unwrap());
            at += 16 + n;
        }
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
        let s = events[1].summary.as_ref().unwrap();
        assert_eq!((events[1].step, s.value.len()), (1, 1));
        assert_eq!(
            (s.value[0].tag.as_str(), s.value[0].simple_value),
            ("loss", 2.5)
        );
    }
}
