//! Query parameters of a `dlock::connect` URL: the per-acquire defaults every scheme takes, and
//! the backend settings each scheme adds.
//!
//! Every parameter is checked before anything is sent: an unknown name, a repeated one, or a
//! value that does not parse is an [`Error::InvalidInput`] for the field `url` that names the
//! parameter and the URL (without its password). Durations are written as `500ms`, `30s`, `2m`,
//! `1h 30m` (see [`parse_duration`]).

use std::time::Duration;

use dlock_core::url::percent_decode;
use dlock_core::{Drift, Error, LockOptions, Result};

use crate::address::Address;

/// The parameters every scheme takes: defaults for each acquire (see [`crate::Locks::options`]).
pub const COMMON: &[&str] = &["ttl", "wait", "drift", "drift_factor"];

/// Parses a duration such as `500ms`, `30s`, `2m` or `1h 30m` (units are required, except for a
/// plain `0`).
///
/// ```
/// use std::time::Duration;
/// assert_eq!(dlock::parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
/// assert!(dlock::parse_duration("10").is_err());
/// ```
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration such as 500ms, 30s or 2m ({e})"))
}

/// The decoded parameters of one URL, checked against the names its scheme knows.
#[derive(Debug)]
pub(crate) struct Params<'u> {
    pairs: Vec<(String, String)>,
    address: &'u Address<'u>,
}

impl<'u> Params<'u> {
    /// Decodes the query of `address`, accepting the [`COMMON`] names and `own` (the scheme's).
    pub(crate) fn parse(address: &'u Address<'u>, own: &[&str]) -> Result<Self> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for pair in address.query.unwrap_or("").split('&') {
            if pair.is_empty() {
                continue;
            }
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let name = percent_decode(name)
                .ok_or_else(|| address.invalid("a parameter name is not valid percent-encoding"))?;
            let value = percent_decode(value).ok_or_else(|| {
                address.invalid(format!(
                    "parameter `{name}`: the value is not valid percent-encoding"
                ))
            })?;
            if !COMMON.contains(&name.as_str()) && !own.contains(&name.as_str()) {
                let known: Vec<&str> = COMMON.iter().chain(own).copied().collect();
                return Err(address.invalid(format!(
                    "unknown parameter `{name}` for {}:// (known: {})",
                    address.scheme,
                    known.join(", ")
                )));
            }
            if pairs.iter().any(|(seen, _)| *seen == name) {
                return Err(address.invalid(format!("parameter `{name}` is given twice")));
            }
            pairs.push((name, value));
        }
        Ok(Params { pairs, address })
    }

    /// The raw value of `name`, if given.
    pub(crate) fn text(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `name` as a duration, if given.
    pub(crate) fn duration(&self, name: &str) -> Result<Option<Duration>> {
        self.text(name)
            .map(|v| {
                parse_duration(v)
                    .map_err(|e| self.address.invalid(format!("parameter `{name}`: {e}")))
            })
            .transpose()
    }

    /// The per-acquire defaults: the core's defaults with `ttl`, `wait`, `drift` (the fixed part
    /// of the allowance) and `drift_factor` applied, validated together.
    pub(crate) fn lock_options(&self) -> Result<LockOptions> {
        let mut options = LockOptions::default();
        if let Some(ttl) = self.duration("ttl")? {
            options.ttl = ttl;
        }
        options.wait = self.duration("wait")?;
        let mut drift = Drift::default();
        if let Some(fixed) = self.duration("drift")? {
            drift.fixed = fixed;
        }
        if let Some(factor) = self.text("drift_factor") {
            drift.factor = factor.trim().parse().map_err(|_| {
                self.address.invalid(format!(
                    "parameter `drift_factor`: {factor:?} is not a number such as 0.01"
                ))
            })?;
        }
        options.drift = drift;
        options.validate().map_err(|e| match e {
            Error::InvalidInput { field, message } => self
                .address
                .invalid(format!("parameter `{}`: {message}", parameter_of(field))),
            other => other,
        })?;
        Ok(options)
    }
}

/// The URL parameter behind a [`LockOptions`] field named in a validation error.
fn parameter_of(field: &str) -> &str {
    match field {
        "drift.factor" => "drift_factor",
        "drift" => "drift",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(url: &str, own: &[&str]) -> String {
        let address = Address::split(url).unwrap();
        let result = Params::parse(&address, own).and_then(|p| p.lock_options());
        match result {
            Err(Error::InvalidInput {
                field: "url",
                message,
            }) => message,
            other => panic!("{url}: expected InvalidInput(url), got {other:?}"),
        }
    }

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "10", "ten", "-1s", "1x", "s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn common_parameters_become_lock_options() {
        let address =
            Address::split("redis://h?ttl=5s&wait=250ms&drift=3ms&drift_factor=0.02").unwrap();
        let options = Params::parse(&address, &[])
            .unwrap()
            .lock_options()
            .unwrap();
        assert_eq!(options.ttl, Duration::from_secs(5));
        assert_eq!(options.wait, Some(Duration::from_millis(250)));
        assert_eq!(options.drift.fixed, Duration::from_millis(3));
        assert_eq!(options.drift.factor, 0.02);
        let address = Address::split("memory://").unwrap();
        let options = Params::parse(&address, &[])
            .unwrap()
            .lock_options()
            .unwrap();
        assert_eq!(options, LockOptions::default());
    }

    #[test]
    fn scheme_parameters_are_decoded() {
        let address = Address::split("redis://h?prefix=billing%3A&ttl=1s&").unwrap();
        let params = Params::parse(&address, &["prefix"]).unwrap();
        assert_eq!(params.text("prefix"), Some("billing:"));
        assert_eq!(params.text("wait"), None);
    }

    #[test]
    fn bad_parameters_are_named() {
        let cases = [
            (
                "redis://u:hunter2@h?colour=red",
                "unknown parameter `colour`",
            ),
            (
                "redis://u:hunter2@h?prefix=x",
                "known: ttl, wait, drift, drift_factor",
            ),
            ("redis://u:hunter2@h?ttl=1s&ttl=2s", "`ttl` is given twice"),
            (
                "redis://u:hunter2@h?ttl=10",
                "parameter `ttl`: \"10\" is not a duration",
            ),
            ("redis://u:hunter2@h?wait=soon", "parameter `wait`"),
            (
                "redis://u:hunter2@h?ttl=1ms",
                "parameter `ttl`: 1ms is below the minimum",
            ),
            (
                "redis://u:hunter2@h?ttl=100ms&drift=200ms",
                "parameter `drift`",
            ),
            (
                "redis://u:hunter2@h?drift_factor=2",
                "parameter `drift_factor`",
            ),
            (
                "redis://u:hunter2@h?drift_factor=x",
                "parameter `drift_factor`",
            ),
            (
                "redis://u:hunter2@h?ttl=%zz",
                "parameter `ttl`: the value is not valid",
            ),
        ];
        for (url, says) in cases {
            let message = message(url, &[]);
            assert!(message.contains(says), "{url}: {message}");
            assert!(!message.contains("hunter2"), "{message}");
            assert!(message.starts_with("redis://u:***@h?"), "{message}");
        }
    }
}
