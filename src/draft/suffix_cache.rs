//! The global index of [`SuffixDraft`](super::SuffixDraft): earlier requests' prompts and
//! outputs, bounded in tokens, shared by every drafter that holds a clone (the sequences of a
//! batch, successive generations), and saved to a file so that an application restarts warm.
//!
//! Each request is kept whole, oldest evicted first. An index maps every run of
//! [`ANCHOR`] tokens to where it ends in the kept requests, so that a lookup costs the
//! candidates it compares (at most [`CANDIDATES`], each over at most the match length) and an
//! insertion one map update a token; an eviction removes what its request inserted.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::stop::check_tokens;

/// Tokens a lookup anchors on: the index key is the context's last `ANCHOR` tokens.
pub const ANCHOR: usize = 2;
/// The most recent occurrences of an anchor a lookup compares.
pub const CANDIDATES: usize = 64;
/// The default capacity: requests are evicted, oldest first, past this many tokens (about
/// 24 MB held).
pub const DEFAULT_CAPACITY: usize = 1 << 20;

const MAGIC: &[u8; 16] = b"specdec-suffix1\n";

/// A shared, bounded index of earlier requests (see the module documentation). Clones share
/// it; it is safe to use from several threads.
#[derive(Debug, Clone)]
pub struct SuffixCache {
    inner: Arc<Mutex<Index>>,
}

/// A request's place: its sequence number and a position in it.
type Place = (u64, u32);

#[derive(Debug)]
struct Index {
    vocab: usize,
    capacity: usize,
    /// Kept requests, oldest first, with their sequence numbers.
    requests: VecDeque<(u64, Vec<u32>)>,
    next: u64,
    held: usize,
    /// Anchor hash → the places where it ends, oldest first.
    places: HashMap<u64, VecDeque<Place>>,
}

/// A continuation found in the cache: the request's tokens after the match, and the match's
/// length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continuation {
    /// Tokens that followed the match (up to the depth asked for).
    pub tokens: Vec<u32>,
    /// How many of the context's last tokens matched.
    pub matched: usize,
    /// How many of the compared occurrences went on with `tokens[0]`.
    pub count: usize,
}

fn anchor_hash(tokens: &[u32]) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(tokens)
}

impl SuffixCache {
    /// An empty cache for a vocabulary of `vocab` tokens holding up to `capacity` tokens.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for an empty vocabulary or a capacity of 0.
    pub fn new(vocab: usize, capacity: usize) -> Result<Self> {
        if vocab == 0 || capacity == 0 {
            return Err(Error::setting("suffix cache", format!("vocab {vocab}, capacity {capacity}"), "both above 0"));
        }
        let index = Index { vocab, capacity, requests: VecDeque::new(), next: 0, held: 0, places: HashMap::new() };
        Ok(Self { inner: Arc::new(Mutex::new(index)) })
    }

    fn lock(&self) -> MutexGuard<'_, Index> {
        // A panic while holding the lock leaves a consistent index (updates are per request).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The vocabulary size.
    pub fn vocab(&self) -> usize {
        self.lock().vocab
    }

    /// Tokens held.
    pub fn tokens(&self) -> usize {
        self.lock().held
    }

    /// Requests held.
    pub fn requests(&self) -> usize {
        self.lock().requests.len()
    }

    /// Adds a request's tokens (prompt and output), evicting the oldest requests past the
    /// capacity (a request longer than the capacity keeps its last `capacity` tokens).
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`] for a token outside the vocabulary.
    pub fn insert(&self, tokens: &[u32]) -> Result<()> {
        let mut index = self.lock();
        check_tokens(tokens, index.vocab)?;
        let tokens = &tokens[tokens.len().saturating_sub(index.capacity)..];
        if tokens.len() <= ANCHOR {
            return Ok(());
        }
        while index.held + tokens.len() > index.capacity {
            index.evict();
        }
        let id = index.next;
        index.next += 1;
        for end in ANCHOR..tokens.len() {
            let key = anchor_hash(&tokens[end - ANCHOR..end]);
            index.places.entry(key).or_default().push_back((id, end as u32));
        }
        index.held += tokens.len();
        index.requests.push_back((id, tokens.to_vec()));
        Ok(())
    }

    /// Empties the cache.
    pub fn clear(&self) {
        let mut index = self.lock();
        index.requests.clear();
        index.places.clear();
        index.held = 0;
    }

    /// Up to `width` continuations of `ctx` followed by different tokens, each up to `depth`
    /// tokens: the occurrences of the context's last [`ANCHOR`] tokens are compared backwards
    /// (up to `max_match` tokens); the longest match wins, the most recent among equals, and
    /// `count` says how many compared occurrences with a match as long went on the same way.
    pub fn lookup(&self, ctx: &[u32], max_match: usize, depth: usize, width: usize) -> Vec<Continuation> {
        let index = self.lock();
        let Some(anchor) = ctx.len().checked_sub(ANCHOR).map(|a| &ctx[a..]) else { return Vec::new() };
        let Some(places) = index.places.get(&anchor_hash(anchor)) else { return Vec::new() };
        let mut found: Vec<(usize, &[u32])> = Vec::new();
        for &(id, end) in places.iter().rev().take(CANDIDATES) {
            let Some(tokens) = index.request(id) else { continue };
            let end = end as usize;
            let matched = (0..max_match.min(end).min(ctx.len()))
                .take_while(|&j| tokens[end - 1 - j] == ctx[ctx.len() - 1 - j])
                .count();
            if matched >= ANCHOR {
                found.push((matched, &tokens[end..(end + depth).min(tokens.len())]));
            }
        }
        // Longest first; stable, so the most recent first among equals.
        found.sort_by_key(|&(m, _)| std::cmp::Reverse(m));
        let mut out: Vec<Continuation> = Vec::new();
        for (matched, next) in found {
            let Some(&first) = next.first() else { continue };
            match out.iter().position(|c| c.tokens[0] == first) {
                Some(i) if out[i].matched == matched => out[i].count += 1,
                Some(_) => {}
                None if out.len() < width => out.push(Continuation { tokens: next.to_vec(), matched, count: 1 }),
                None => {}
            }
        }
        out
    }

    /// Writes the cache to `path` (its requests, oldest first, and a checksum).
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be written.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let index = self.lock();
        let mut body = Vec::with_capacity(32 + 4 * index.held);
        body.extend_from_slice(MAGIC);
        body.extend_from_slice(&(index.vocab as u64).to_le_bytes());
        body.extend_from_slice(&(index.requests.len() as u64).to_le_bytes());
        for (_, tokens) in &index.requests {
            body.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
            tokens.iter().for_each(|t| body.extend_from_slice(&t.to_le_bytes()));
        }
        let sum = checksum(&body);
        body.extend_from_slice(&sum.to_le_bytes());
        let tmp = path.as_ref().with_extension("tmp");
        std::fs::File::create(&tmp)?.write_all(&body)?;
        std::fs::rename(tmp, path)?;
        Ok(())
    }

    /// Reads a cache written by [`save`](Self::save) for a vocabulary of `vocab` tokens, to
    /// hold up to `capacity` tokens (the oldest requests are evicted past it).
    ///
    /// # Errors
    /// [`Error::Load`] for a file that is not a cache, is cut short or corrupt (its checksum),
    /// or was written for another vocabulary; [`Error::Io`] when it cannot be read.
    pub fn load(path: impl AsRef<Path>, vocab: usize, capacity: usize) -> Result<Self> {
        let path = path.as_ref();
        let mut bytes = Vec::new();
        std::fs::File::open(path)?.read_to_end(&mut bytes)?;
        let bad = |reason: &str| Error::load(path, format!("not a suffix cache: {reason}"));
        if bytes.len() < MAGIC.len() + 24 || &bytes[..MAGIC.len()] != MAGIC {
            return Err(bad("no specdec-suffix1 header"));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 8);
        if checksum(body).to_le_bytes() != sum {
            return Err(bad("checksum mismatch (a corrupt or cut file)"));
        }
        let mut r = Reader { bytes: &body[MAGIC.len()..] };
        let written_for = r.u64().ok_or_else(|| bad("cut short"))? as usize;
        if written_for != vocab {
            return Err(Error::load(path, format!("a suffix cache for {written_for} tokens, not {vocab}")));
        }
        let cache = Self::new(vocab, capacity)?;
        for _ in 0..r.u64().ok_or_else(|| bad("cut short"))? {
            let n = r.u32().ok_or_else(|| bad("cut short"))? as usize;
            let tokens: Option<Vec<u32>> = (0..n).map(|_| r.u32()).collect();
            cache.insert(&tokens.ok_or_else(|| bad("cut short"))?).map_err(|e| bad(&e.to_string()))?;
        }
        Ok(cache)
    }
}

impl Index {
    fn request(&self, id: u64) -> Option<&[u32]> {
        let first = self.requests.front()?.0;
        self.requests.get(id.checked_sub(first)? as usize).map(|(_, t)| t.as_slice())
    }

    /// Drops the oldest request and its places (always the oldest of each anchor's list).
    fn evict(&mut self) {
        let Some((id, tokens)) = self.requests.pop_front() else { return };
        for end in ANCHOR..tokens.len() {
            let key = anchor_hash(&tokens[end - ANCHOR..end]);
            if let Some(list) = self.places.get_mut(&key) {
                while list.front().is_some_and(|&(i, _)| i == id) {
                    list.pop_front();
                }
                if list.is_empty() {
                    self.places.remove(&key);
                }
            }
        }
        self.held -= tokens.len();
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.bytes.split_first_chunk::<N>()?;
        self.bytes = rest;
        Some(*head)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take::<8>().map(u64::from_le_bytes)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take::<4>().map(u32::from_le_bytes)
    }
}

/// FNV-1a over the bytes.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}
