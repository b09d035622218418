//! Tokenizers rebuilt from GGUF metadata: `GgufFile::from_bytes`, `tokenizer`, then encode and
//! decode a few strings (special tokens, digits, non-ASCII) and decode ids outside the vocabulary.
#![no_main]

use libfuzzer_sys::fuzz_target;
use specdec::loading::GgufFile;
use specdec::tokenizer::TextStream;

const TEXTS: [&str; 4] =
    ["Once upon a time, Lily saw 3 big dogs!", "<|im_start|>user\nhi 2024<|im_end|>\n", "naïve café – 🙂\t\r\n", ""];

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data) else { return };
    let Ok(tok) = file.tokenizer() else { return };
    for text in TEXTS {
        if let Ok(ids) = tok.encode(text) {
            let _ = tok.decode(&ids);
            let _ = TextStream::new().push(&tok, &ids);
        }
    }
    let n = tok.vocab_size() as u32;
    let _ = tok.decode(&[0, n.saturating_sub(1), n, u32::MAX]);
    let _ = (tok.fingerprint(), tok.chat_prompt("hi"), tok.end_of_turn_ids(), tok.to_json());
});
