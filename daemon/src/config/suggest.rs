//! Did-you-mean: the known name closest to a mistyped one (a config key, a preset, a
//! provider), by edit distance with transpositions (`cluade` → `claude`).

use super::{Config, presets};

/// The known name closest to `typed`, if one is close enough to be a typo: at most one edit
/// for short names, two from five characters on, and never a name as far off as it is long.
pub(crate) fn closest<'a>(
    typed: &str,
    known: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let typed_lower = typed.to_lowercase();
    let most = if typed.chars().count() < 5 { 1 } else { 2 };
    known
        .into_iter()
        .map(|k| {
            (
                strsim::damerau_levenshtein(&typed_lower, &k.to_lowercase()),
                k,
            )
        })
        .filter(|(d, k)| *d <= most && *d < k.chars().count())
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// `did you mean "NAME"?` for the closest known name, else `None`.
pub(crate) fn did_you_mean<'a>(
    typed: &str,
    known: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    closest(typed, known).map(|k| format!("did you mean {k:?}?"))
}

/// What to say after "no provider named NAME": the configured provider it is closest to, or
/// the preset of that name that would add it, or where the providers are listed.
pub(crate) fn unknown_provider(config: &Config, name: &str) -> String {
    if let Some(hint) = did_you_mean(name, config.providers.keys().map(String::as_str)) {
        return hint;
    }
    let preset = presets::find(name)
        .map(|p| p.name)
        .or_else(|| closest(name, presets::names()));
    match preset {
        Some(p) => format!(
            "the {p:?} preset would add one: run `acpd init {p}`, or add \
             `[providers.{p}]` with `preset = \"{p}\"` to the config"
        ),
        None => {
            let known: Vec<&str> = config.providers.keys().map(String::as_str).collect();
            format!("configured: {} (see `acpd providers`)", known.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_find_their_name_and_strangers_find_none() {
        let presets = ["claude", "codex", "gemini", "goose", "opencode"];
        assert_eq!(closest("cluade", presets), Some("claude"));
        assert_eq!(closest("Claude", presets), Some("claude"));
        assert_eq!(closest("codx", presets), Some("codex"));
        assert_eq!(
            closest("preest", ["command", "preset", "registry"]),
            Some("preset")
        );
        assert_eq!(
            closest("max_chidlren", ["max_children", "max_depth"]),
            Some("max_children")
        );
        assert_eq!(closest("x", ["y", "echo"]), None);
        assert_eq!(closest("frobnicate", presets), None);
    }

    #[test]
    fn an_unknown_provider_points_at_the_preset_of_its_name() {
        let config = Config::builtin(vec!["acpd".into()]);
        let said = unknown_provider(&config, "claude");
        assert!(said.contains("acpd init claude"), "{said}");
        assert!(said.contains("preset = \"claude\""), "{said}");
        assert_eq!(unknown_provider(&config, "ehco"), "did you mean \"echo\"?");
        assert!(unknown_provider(&config, "zzz").contains("configured: echo"));
    }
}
