//! Reading and editing command lines as argparse and clap take them: `--flag VALUE` or
//! `--flag=VALUE`, the last occurrence winning.

/// How many values a flag takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    /// A switch (`--is-prefill-worker`).
    None,
    /// One value (`--namespace dynamo`).
    One,
    /// Zero or one (argparse `nargs='?'`): the next word unless it is a flag.
    Optional,
    /// Any number (argparse `nargs='*'`): every word up to the next flag.
    Many,
}

/// The value of the last `--flag VALUE` or `--flag=VALUE`.
pub fn value(args: &[String], flag: &str) -> Option<String> {
    let mut found = None;
    let mut words = args.iter();
    while let Some(word) = words.next() {
        if word == flag {
            found = words.next().cloned();
        } else if let Some(v) = inline_value(word, flag) {
            found = Some(v.to_owned());
        }
    }
    found
}

/// Whether `flag` appears, alone or as `--flag=VALUE`.
pub fn has(args: &[String], flag: &str) -> bool {
    args.iter()
        .any(|w| w == flag || inline_value(w, flag).is_some())
}

/// `args` without every occurrence of `flag` and the values it takes.
pub fn remove(args: &[String], flag: &str, arity: Arity) -> Vec<String> {
    let mut kept = Vec::with_capacity(args.len());
    let mut words = args.iter().peekable();
    while let Some(word) = words.next() {
        if inline_value(word, flag).is_some() {
            continue;
        }
        if word != flag {
            kept.push(word.clone());
            continue;
        }
        match arity {
            Arity::None => {}
            Arity::One => {
                words.next();
            }
            Arity::Optional => {
                words.next_if(|w| !is_flag(w));
            }
            Arity::Many => while words.next_if(|w| !is_flag(w)).is_some() {},
        }
    }
    kept
}

/// `args` with `flag`'s values (if any) replaced by one `--flag value` at the end.
pub fn set(args: &[String], flag: &str, value: &str) -> Vec<String> {
    let mut out = remove(args, flag, Arity::One);
    out.extend([flag.to_owned(), value.to_owned()]);
    out
}

fn inline_value<'a>(word: &'a str, flag: &str) -> Option<&'a str> {
    word.strip_prefix(flag)?.strip_prefix('=')
}

fn is_flag(word: &str) -> bool {
    word.starts_with("--") || (word.starts_with('-') && word.len() == 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn the_last_value_wins_in_either_spelling() {
        let args = words("--model a --port 1 --model=b");
        assert_eq!(value(&args, "--model").as_deref(), Some("b"));
        assert_eq!(value(&args, "--port").as_deref(), Some("1"));
        assert_eq!(value(&args, "--mod"), None);
        assert!(has(&args, "--model") && !has(&args, "--host"));
    }

    #[test]
    fn removal_takes_the_values_each_arity_takes() {
        let args = words("--a --b x --c --d y z --e --f=1 --c w");
        assert_eq!(
            remove(&args, "--a", Arity::None),
            words("--b x --c --d y z --e --f=1 --c w")
        );
        assert_eq!(
            remove(&args, "--b", Arity::One),
            words("--a --c --d y z --e --f=1 --c w")
        );
        assert_eq!(
            remove(&args, "--c", Arity::Optional),
            words("--a --b x --d y z --e --f=1")
        );
        assert_eq!(
            remove(&args, "--d", Arity::Many),
            words("--a --b x --c --e --f=1 --c w")
        );
        assert_eq!(
            remove(&args, "--f", Arity::One),
            words("--a --b x --c --d y z --e --c w")
        );
        assert_eq!(
            set(&args, "--b", "q"),
            words("--a --c --d y z --e --f=1 --c w --b q")
        );
    }
}
