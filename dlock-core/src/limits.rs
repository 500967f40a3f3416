//! The bounds dlock checks its input against, in one place: a request outside them is refused
//! with [`Error::InvalidInput`](crate::Error::InvalidInput) before anything is sent.

pub use crate::election::OBSERVE_INTERVAL;
pub use crate::key::MAX_KEY_LEN;
pub use crate::multi::MAX_KEYS;
pub use crate::options::{MAX_TTL, MAX_WAIT, MIN_TTL};
pub use crate::owner::MAX_LABEL_LEN;
pub use crate::primitive::{MAX_PERMITS, MAX_VALUE_LEN};
pub use crate::retry::MAX_BACKOFF;
