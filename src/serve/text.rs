//! The text of one served sequence as it streams: decoded as tokens come, held back where it
//! may be the start of a stop string, cut before the first stop string.

use crate::error::Result;
use crate::tokenizer::{TextStream, Tokenizer};

/// One sequence's text; see the [module docs](self).
#[derive(Debug, Default)]
pub(crate) struct TextOut {
    stream: TextStream,
    stops: Vec<String>,
    /// Decoded text not yet handed out: it ends with the start of a stop string.
    held: String,
}

impl TextOut {
    /// A sequence that ends at the first of `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        Self { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), ..Self::default() }
    }

    /// Adds tokens; returns the text they complete that can be handed out, and whether a stop
    /// string was found (then the text ends before it and the sequence is over).
    ///
    /// # Errors
    /// [`crate::Error::Tokenizer`] when decoding fails.
    pub fn push(&mut self, tokenizer: &Tokenizer, tokens: &[u32]) -> Result<(String, bool)> {
        let new = self.stream.push(tokenizer, tokens)?;
        Ok(self.push_text(&new))
    }

    /// [`push`](Self::push) for text already decoded.
    pub fn push_text(&mut self, new: &str) -> (String, bool) {
        self.held.push_str(new);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            self.held.truncate(at);
            return (std::mem::take(&mut self.held), true);
        }
        let keep = self.partial_stop();
        let out = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        (out, false)
    }

    /// The text held back, at the end of the sequence.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// The length of the longest end of the held text that begins some stop string.
    fn partial_stop(&self) -> usize {
        let h = &self.held;
        (1..=h.len())
            .rev()
            .filter(|&n| h.is_char_boundary(h.len() - n))
            .find(|&n| self.stops.iter().any(|s| s.len() > n && s.starts_with(&h[h.len() - n..])))
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::TextOut;

    /// Feeds `pieces` one by one; returns the text handed out and whether a stop was found.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut t = TextOut::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (text, stopped) = t.push_text(p);
            out.push_str(&text);
            if stopped {
                return (out, true);
            }
        }
        out.push_str(&t.finish());
        (out, false)
    }

    #[test]
    fn stop_strings_cut_across_pieces_and_hold_back_only_their_starts() {
        assert_eq!(run(&["END"], &["abc E", "N", "D tail"]), ("abc ".into(), true));
        assert_eq!(run(&["END"], &["abc EN", "x"]), ("abc ENx".into(), false));
        assert_eq!(run(&["\n\n", "STOP"], &["a\n", "b", "\n", "\nc"]), ("a\nb".into(), true));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&["é!"], &["caf", "é", "!"]), ("caf".into(), true));
        // The earliest stop string wins, whichever is listed first.
        assert_eq!(run(&["yz", "b"], &["abcxyz"]), ("a".into(), true));
        // Held text comes out at the end when no stop string follows.
        assert_eq!(run(&["xyz"], &["ab", "xy"]), ("abxy".into(), false));
    }

    #[test]
    fn held_text_is_handed_out_as_soon_as_it_cannot_start_a_stop() {
        let mut t = TextOut::new(vec!["</end>".into()]);
        assert_eq!(t.push_text("hello </e").0, "hello ");
        assert_eq!(t.push_text("nx").0, "</enx");
    }
}
