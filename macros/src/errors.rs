//! Collects several user mistakes so one build reports them all.

/// The mistakes found so far, combined into one `syn::Error`.
#[derive(Default)]
pub(crate) struct Errors {
    combined: Option<syn::Error>,
}

impl Errors {
    /// Adds a mistake.
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.combined {
            Some(combined) => combined.combine(error),
            None => self.combined = Some(error),
        }
    }

    /// Adds a mistake at `span`.
    pub(crate) fn at(&mut self, span: proc_macro2::Span, message: impl std::fmt::Display) {
        self.push(syn::Error::new(span, message));
    }

    /// `value`, or every mistake found.
    pub(crate) fn finish<T>(self, value: T) -> syn::Result<T> {
        match self.combined {
            Some(error) => Err(error),
            None => Ok(value),
        }
    }
}

/// The known name closest to `unknown`, when it is close enough to be a
/// likely typo.
pub(crate) fn closest<'a>(unknown: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (edit_distance(unknown, k), *k))
        .filter(|(distance, k)| *distance <= (k.len() / 3).max(1))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, k)| k)
}

/// Levenshtein distance between two short strings.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

/// "unknown key `x` in `#[attr(...)]`" with a suggestion or the known keys.
pub(crate) fn unknown_key(key: &str, attribute: &str, known: &[&str]) -> String {
    let hint = match closest(key, known) {
        Some(close) => format!("did you mean `{close}`?"),
        None => {
            let list: Vec<String> = known.iter().map(|k| format!("`{k}`")).collect();
            format!("known keys: {}", list.join(", "))
        }
    };
    format!("unknown key `{key}` in `{attribute}`; {hint}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_keys_only() {
        assert_eq!(closest("knd", &["kind", "type"]), Some("kind"));
        assert_eq!(closest("typ", &["kind", "type"]), Some("type"));
        assert_eq!(
            closest("exmaple", &["kind", "type", "example"]),
            Some("example")
        );
        assert_eq!(closest("colour", &["kind", "type"]), None);
    }
}
