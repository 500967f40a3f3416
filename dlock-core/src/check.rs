//! The checks of settings and names that every builder and every call makes before anything is
//! sent, so that every backend words a refusal the same way.

use std::fmt;
use std::ops::RangeInclusive;

use crate::error::{Error, Result};

/// Checks that the setting `field` lies within `range`, naming the field and the range if not.
///
/// The one check of timeouts and TTLs in builders, so that every backend words it the same way.
pub fn check_within<T>(field: &'static str, value: T, range: RangeInclusive<T>) -> Result<()>
where
    T: PartialOrd + fmt::Debug,
{
    if range.contains(&value) {
        return Ok(());
    }
    Err(Error::invalid(
        field,
        format!(
            "{value:?} is outside {:?}..={:?}",
            range.start(),
            range.end()
        ),
    ))
}

/// Checks that the text setting `field` is at most `max` bytes long, saying how long it is if
/// not: the one length check of keys, prefixes and names, worded the same everywhere.
pub fn check_len(field: &'static str, text: &str, max: usize) -> Result<()> {
    if text.len() <= max {
        return Ok(());
    }
    Err(Error::invalid(
        field,
        format!("is {} bytes long; the maximum is {max} bytes", text.len()),
    ))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn ranges_name_the_field_and_the_bounds() {
        let range = Duration::from_millis(1)..=Duration::from_secs(1);
        assert!(check_within("t", Duration::from_secs(1), range.clone()).is_ok());
        match check_within("t", Duration::ZERO, range) {
            Err(Error::InvalidInput { field, message }) => {
                assert_eq!(field, "t");
                assert_eq!(message, "0ns is outside 1ms..=1s");
            }
            other => panic!("{other:?}"),
        }
    }
}
