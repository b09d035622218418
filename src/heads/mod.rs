//! Draft heads: small networks that read the target's own hidden states (EAGLE-1/2, EAGLE-3,
//! Medusa-1) instead of running a second model. The target records its states
//! ([`Llama::record_hidden`](crate::Llama::record_hidden)) into
//! [`Features`](crate::models::Features); a head drafter
//! reads them. Every head drafts through the exact acceptance rule, so output follows the
//! target at any temperature however good or bad the head is.

mod config;
mod draft;
mod eagle;
mod eagle_draft;
mod medusa;
mod target;
#[cfg(feature = "train")]
pub mod train;
mod unroll;

pub use config::{HeadConfig, HeadFiles};
pub use draft::HeadDraft;
pub use eagle::{EagleHead, EagleVersion};
pub use eagle_draft::EagleDraft;
pub use medusa::{MedusaDraft, MedusaHead};
pub use target::TargetParts;
