//! The value checks shared by the top-level keys and the provider tables: byte sizes,
//! durations, lower bounds and names.

use std::{ops::Range, time::Duration};

use toml::Spanned;

use super::{ConfigError, durations};

/// Builds an [`ConfigError::Invalid`] from a span, key and message.
pub(super) type At<'a> = dyn Fn(Range<usize>, &str, &str) -> ConfigError + 'a;

/// A byte size: an integer, or a string like `"8MiB"`; at least 1.
pub(super) fn byte_size(value: &Spanned<toml::Value>) -> Result<usize, String> {
    let size = match value.get_ref() {
        toml::Value::Integer(n) => {
            usize::try_from(*n).map_err(|_| format!("must not be negative, got {n}"))
        }
        toml::Value::String(s) => parse_size(s),
        other => Err(format!(
            "expected a byte size like \"8MiB\", got a {}",
            other.type_str()
        )),
    };
    size.and_then(|n| {
        if n == 0 {
            Err("must be at least 1 byte".to_owned())
        } else {
            Ok(n)
        }
    })
}

pub(super) fn parse_duration(
    value: &Spanned<String>,
    key: &str,
    at: &At<'_>,
) -> Result<Duration, ConfigError> {
    humantime::parse_duration(value.get_ref())
        .map_err(|e| {
            format!(
                "invalid duration {:?} (like \"90s\" or \"10m\"): {e}",
                value.get_ref()
            )
        })
        .and_then(|d| durations::check(d, value.get_ref()))
        .map_err(|msg| at(value.span(), key, &msg))
}

/// Zero would make the limit unusable (nothing could ever start), so it is rejected.
pub(super) fn at_least_one(
    value: Spanned<usize>,
    key: &str,
    at: &At<'_>,
) -> Result<usize, ConfigError> {
    match *value.get_ref() {
        0 => Err(at(value.span(), key, "must be at least 1")),
        n => Ok(n),
    }
}

/// Byte size: a plain integer, or an integer followed by a unit
/// (B, KB, KiB, MB, MiB, GB, GiB; case-insensitive, optional space between).
/// Fractions are not accepted, so the result is always exact.
pub(super) fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: usize = match number.parse() {
        Ok(n) => n,
        Err(_) if number.is_empty() => return Err(format!("{text:?} is not a byte size")),
        Err(_) => return Err(format!("{text:?} is too large")),
    };
    let multiplier: usize = match unit.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1000,
        "kib" => 1 << 10,
        "mb" => 1000 * 1000,
        "mib" => 1 << 20,
        "gb" => 1000 * 1000 * 1000,
        "gib" => 1 << 30,
        _ => {
            return Err(format!(
                "unknown unit {unit:?}; use B, KB, KiB, MB, MiB, GB or GiB"
            ));
        }
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// True when `s` is non-empty and made of ASCII alphanumerics and `extra`.
pub(super) fn only(s: &str, extra: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
}

pub(super) fn is_provider_name(name: &str) -> bool {
    only(name, "_.-")
}

/// Names that `setenv`/`Command::env` would reject or mangle.
pub(super) fn check_env_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains(['=', '\0']) {
        Err(format!(
            "invalid environment variable name {name:?}: must be non-empty without '=' or NUL"
        ))
    } else {
        Ok(())
    }
}
