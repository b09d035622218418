//! GGUF files (v1 to v3): metadata → [`LlamaConfig`] and [`Tokenizer`], tensors as candle
//! `QTensor`s. candle parses the header (with its own bounds checks); this module adds the
//! checks a truncated or forged file needs and turns every failure into a typed error.
//!
//! What is guarded before candle sees a file (candle 0.11 bounds string and array lengths and
//! entry counts by the bytes left in the file, and nesting at 64 levels, itself):
//! - `general.alignment` = 0, which candle's parser divides by (`check_header`);
//! - more than [`MAX_ARRAY_ELEMENTS`] metadata array elements in all: each takes one byte on
//!   disk but 32 in memory, so a forged multi-GB file could ask for 32 times its size;
//! - tensors whose element count overflows, is zero (candle would view an empty buffer through
//!   a misaligned pointer), or does not fit in the file.

use std::fs::File;
use std::io::{BufReader, Cursor, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, TensorInfo, Value};
use candle_core::quantized::QTensor;
use candle_core::Device;

use crate::error::{Error, Result};
use crate::models::config::{Family, LlamaConfig};
use crate::tokenizer::Tokenizer;

/// Metadata array elements a file may hold in all (Llama 3's vocabulary and merges are ~0.4 M).
pub const MAX_ARRAY_ELEMENTS: u64 = 1 << 24;

/// Where the bytes come from: a file, or memory for tests and fuzzing.
trait Source: Read + Seek + Send + Sync {}
impl<T: Read + Seek + Send + Sync> Source for T {}

/// An open GGUF file.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    reader: Box<dyn Source>,
}

impl GgufFile {
    /// Opens and checks the file: header, metadata, and that every tensor lies inside it.
    ///
    /// # Errors
    /// [`Error::Load`] for a missing, truncated or corrupt file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| Error::load_from(&path, "cannot open", e))?;
        Self::from_reader(Box::new(BufReader::new(file)), path)
    }

    /// Reads a GGUF file held in memory, with the same checks as [`open`](Self::open); errors
    /// name the path `<memory>`.
    ///
    /// # Errors
    /// [`Error::Load`] for a truncated or corrupt file.
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Result<Self> {
        Self::from_reader(Box::new(Cursor::new(bytes.into())), PathBuf::from("<memory>"))
    }

    fn from_reader(reader: Box<dyn Source>, path: PathBuf) -> Result<Self> {
        Self::read(reader, path.clone()).map_err(|e| e.with_path(path))
    }

    fn read(mut reader: Box<dyn Source>, path: PathBuf) -> Result<Self> {
        let fail = |reason: String| Error::load(path.clone(), reason);
        let len = reader.seek(SeekFrom::End(0))?;
        reader.seek(SeekFrom::Start(0))?;
        check_header(&mut reader, len).map_err(|e| Error::load_from(&path, "not a readable GGUF file", e))?;
        reader.seek(SeekFrom::Start(0))?;
        let content = Content::read(&mut reader).map_err(|e| Error::load_from(&path, "not a readable GGUF file", e))?;
        for (name, info) in &content.tensor_infos {
            let end = tensor_bytes(info)
                .and_then(|size| size.checked_add(content.tensor_data_offset))
                .and_then(|end| end.checked_add(info.offset));
            if end.is_none_or(|end| end > len) {
                let dims = info.shape.dims();
                return Err(fail(format!(
                    "truncated or corrupt: tensor `{name}` ({dims:?}, {:?}) does not fit in the file's {len} bytes",
                    info.ggml_dtype
                )));
            }
        }
        Ok(Self { path, content, reader })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A metadata value.
    pub fn metadata(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    /// True when the file holds a tensor of that name.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Reads a tensor onto `device`.
    ///
    /// # Errors
    /// [`Error::MissingTensor`], or [`Error::Load`] when it cannot be read.
    pub fn tensor(&mut self, name: &str, device: &Device) -> Result<QTensor> {
        if !self.has_tensor(name) {
            return Err(Error::MissingTensor(name.to_string()));
        }
        self.content
            .tensor(&mut self.reader, name, device)
            .map_err(|e| Error::load_from(&self.path, format!("tensor `{name}`"), e))
    }

    fn get_u32(&self, key: &str) -> Result<u32> {
        let value = self.metadata(key).ok_or_else(|| self.bad(format!("metadata `{key}` is missing")))?;
        match value.to_u32() {
            Ok(v) => Ok(v),
            Err(_) => value.to_u64().map_err(|e| self.bad(format!("metadata `{key}`: {e}"))).and_then(|v| {
                u32::try_from(v).map_err(|_| self.bad(format!("metadata `{key}` = {v} is out of range")))
            }),
        }
    }

    fn get_f32(&self, key: &str) -> Option<f32> {
        self.metadata(key).and_then(|v| v.to_f32().ok())
    }

    fn bad(&self, reason: String) -> Error {
        Error::load(self.path.clone(), reason)
    }

    /// The model's family, from `general.architecture`.
    ///
    /// # Errors
    /// [`Error::UnsupportedArchitecture`] for an architecture outside [`Family`].
    pub fn family(&self) -> Result<Family> {
        let arch = self.metadata("general.architecture").and_then(|v| v.to_string().ok()).cloned().unwrap_or_default();
        Family::from_name(&arch).ok_or(Error::UnsupportedArchitecture(arch))
    }

    /// The query heads and key/value heads (as many as the query heads when not given).
    ///
    /// # Errors
    /// [`Error::Load`] when the head count is missing.
    pub(crate) fn head_counts(&self, family: Family) -> Result<(usize, usize)> {
        let key = |k: &str| format!("{}.attention.{k}", family.gguf_name());
        let heads = self.get_u32(&key("head_count"))? as usize;
        Ok((heads, self.get_u32(&key("head_count_kv")).map_or(heads, |v| v as usize)))
    }

    /// The model's shape from the `{architecture}.*` metadata.
    ///
    /// # Errors
    /// [`Error::UnsupportedArchitecture`] for an architecture outside [`Family`];
    /// [`Error::Load`] for missing or malformed metadata.
    pub fn config(&self) -> Result<LlamaConfig> {
        let family = self.family()?;
        let key = |k: &str| format!("{}.{k}", family.gguf_name());
        let hidden_size = self.get_u32(&key("embedding_length"))? as usize;
        let (num_heads, num_kv_heads) = self.head_counts(family)?;
        let embd_rows =
            self.content.tensor_infos.get("token_embd.weight").and_then(|t| t.shape.dims().first().copied());
        let vocab_size = match self.metadata("tokenizer.ggml.tokens").and_then(|v| v.to_vec().ok()) {
            Some(tokens) => tokens.len(),
            None => embd_rows.ok_or_else(|| Error::MissingTensor("token_embd.weight".into()))?,
        };
        let eos_token_ids = self.get_u32("tokenizer.ggml.eos_token_id").map(|id| vec![id]).unwrap_or_default();
        let head_dim = self
            .get_u32(&key("attention.key_length"))
            .or_else(|_| self.get_u32(&key("rope.dimension_count")))
            .map_or(hidden_size / num_heads.max(1), |v| v as usize);
        let rope_theta = self.get_f32(&key("rope.freq_base")).unwrap_or(10_000.0);
        // The engines rotate whole heads with one RoPE base per layer kind.
        let partial = self.get_u32(&key("rope.dimension_count")).is_ok_and(|d| d as usize != head_dim);
        if partial || self.has_tensor("rope_factors_long.weight") {
            return Err(Error::UnsupportedArchitecture(format!(
                "{} with partial or long-context RoPE",
                family.gguf_name()
            )));
        }
        let config = LlamaConfig {
            family,
            vocab_size,
            hidden_size,
            intermediate_size: self.get_u32(&key("feed_forward_length"))? as usize,
            num_layers: self.get_u32(&key("block_count"))? as usize,
            num_heads,
            num_kv_heads,
            head_dim,
            rope_theta,
            rms_norm_eps: self.get_f32(&key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5) as f64,
            max_context: self.get_u32(&key("context_length"))? as usize,
            eos_token_ids,
            // Phi-3's window, where a file sets one, covers every layer.
            sliding_window: match family {
                Family::Gemma3 => Some(self.get_u32(&key("attention.sliding_window"))? as usize),
                Family::Phi3 => self.get_u32(&key("attention.sliding_window")).ok().map(|w| w as usize),
                _ => None,
            },
            // llama.cpp reads no pattern or local base from Gemma 3 files: every 6th layer is
            // global and local layers rotate with base 10,000.
            sliding_pattern: match family.gemma() {
                true => self.get_u32(&key("attention.sliding_window_pattern")).map_or(6, |v| v as usize),
                false => 0,
            },
            rope_local_theta: match family.gemma() {
                true => self.get_f32(&key("rope.local_freq_base")).unwrap_or(10_000.0),
                false => rope_theta,
            },
        };
        config.validate()?;
        Ok(config)
    }

    /// The tokenizer stored in the metadata (`tokenizer.ggml.*`).
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when it is absent or of a kind this crate does not rebuild.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        Tokenizer::from_gguf_metadata(&self.content.metadata)
    }
}

/// Bytes of a tensor's data, or `None` when its element count overflows, is zero or is not a
/// whole number of blocks.
fn tensor_bytes(info: &TensorInfo) -> Option<u64> {
    let elems = info.shape.dims().iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64))?;
    usize::try_from(elems).ok()?;
    let block = info.ggml_dtype.block_size() as u64;
    (elems > 0 && elems % block == 0).then_some(elems / block)?.checked_mul(info.ggml_dtype.type_size() as u64)
}

/// Walks the header's metadata with candle's grammar, keeping nothing, and rejects what
/// candle's parser would panic on or blow up from (see the module docs). Fails where the walk
/// cannot go on: candle would fail there too.
fn check_header(reader: &mut impl Read, len: u64) -> std::result::Result<(), String> {
    let mut walk = Walk { reader, left: len, v1: false, elements: 0 };
    let magic = walk.u32()?;
    if magic != 0x4655_4747 && magic != 0x4747_5546 {
        return Err(format!("unknown magic 0x{magic:08x}"));
    }
    walk.v1 = match walk.u32()? {
        1 => true,
        2 | 3 => false,
        v => return Err(format!("unsupported version {v}")),
    };
    let (_tensors, entries) = (walk.length()?, walk.length()?);
    for _ in 0..entries {
        let key_len = walk.length()?;
        let is_alignment = if key_len <= 64 {
            let key = walk.bytes(key_len as usize)?;
            trim_nuls(&key) == b"general.alignment"
        } else {
            walk.skip(key_len)?;
            false
        };
        let kind = walk.u32()?;
        if is_alignment && matches!(kind, 0..=5) {
            let width = [1, 1, 2, 2, 4, 4][kind as usize];
            if walk.bytes(width)?.iter().all(|&b| b == 0) {
                return Err("`general.alignment` is 0".into());
            }
        } else {
            walk.value(kind, 0)?;
        }
    }
    Ok(())
}

fn trim_nuls(mut s: &[u8]) -> &[u8] {
    while let [rest @ .., 0] = s {
        s = rest;
    }
    s
}

/// A bounded cursor over a GGUF header.
struct Walk<'a, R: Read> {
    reader: &'a mut R,
    /// Bytes left in the file.
    left: u64,
    /// Version 1 writes lengths as u32, later versions as u64.
    v1: bool,
    /// Metadata array elements seen so far.
    elements: u64,
}

impl<R: Read> Walk<'_, R> {
    fn take(&mut self, n: u64) -> std::result::Result<(), String> {
        self.left =
            self.left.checked_sub(n).ok_or_else(|| format!("{n} bytes needed, {} left in the file", self.left))?;
        Ok(())
    }

    fn bytes(&mut self, n: usize) -> std::result::Result<Vec<u8>, String> {
        self.take(n as u64)?;
        let mut buf = vec![0; n];
        self.reader.read_exact(&mut buf).map_err(|e| e.to_string())?;
        Ok(buf)
    }

    fn skip(&mut self, n: u64) -> std::result::Result<(), String> {
        self.take(n)?;
        let copied =
            std::io::copy(&mut self.reader.by_ref().take(n), &mut std::io::sink()).map_err(|e| e.to_string())?;
        if copied == n {
            Ok(())
        } else {
            Err("unexpected end of file".into())
        }
    }

    fn u32(&mut self) -> std::result::Result<u32, String> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn length(&mut self) -> std::result::Result<u64, String> {
        if self.v1 {
            return self.u32().map(u64::from);
        }
        let b = self.bytes(8)?;
        Ok(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }

    /// Skips one value of type `kind` (GGUF's numbering) at nesting `depth`.
    fn value(&mut self, kind: u32, depth: usize) -> std::result::Result<(), String> {
        if depth > 64 {
            return Err("metadata arrays nested more than 64 deep".into());
        }
        if let Some(size) = fixed_size(kind) {
            return self.skip(size);
        }
        match kind {
            8 => {
                let n = self.length()?;
                self.skip(n)
            }
            9 => {
                let (kind, n) = (self.u32()?, self.length()?);
                self.elements = self.elements.saturating_add(n);
                if self.elements > MAX_ARRAY_ELEMENTS {
                    return Err(format!("more than {MAX_ARRAY_ELEMENTS} metadata array elements"));
                }
                match fixed_size(kind) {
                    Some(size) if depth < 64 => self.skip(n.saturating_mul(size)),
                    _ => (0..n).try_for_each(|_| self.value(kind, depth + 1)),
                }
            }
            other => Err(format!("unknown value type {other}")),
        }
    }
}

/// Bytes of one value of a fixed-size GGUF type.
fn fixed_size(kind: u32) -> Option<u64> {
    match kind {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}
