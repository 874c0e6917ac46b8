//! Pacing calls to someone else's rate-limited API: what one of its
//! responses says about its limits ([`Feedback`]), read from the status,
//! `Retry-After`, the IETF `RateLimit-Policy` and `RateLimit` headers (and
//! their older forms) and the common `X-RateLimit-*` headers.

mod feedback;

pub use feedback::{Feedback, Quota};
