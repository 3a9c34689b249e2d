//! Two-letter short flags other tools use (llama-server's `-np`, vLLM's
//! `-tp`): clap takes only one letter after a single dash, so they are
//! rewritten to their long names before parsing.

use std::ffi::OsString;

/// `args` with `short` and `short=VALUE` spelled `long` wherever the
/// subcommand is `command`; other commands' arguments are left alone.
pub fn rewrite_short(args: Vec<OsString>, command: &str, short: &str, long: &str) -> Vec<OsString> {
    if args.get(1).is_none_or(|a| a != command) {
        return args;
    }
    let with_value = format!("{short}=");
    args.into_iter()
        .map(|a| {
            if a == short {
                return OsString::from(long);
            }
            match a.to_str().and_then(|s| s.strip_prefix(&with_value)) {
                Some(v) => OsString::from(format!("{long}={v}")),
                None => a,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn only_the_named_command_is_rewritten() {
        assert_eq!(
            rewrite_short(
                v(&["fathom", "inspect", "m", "-tp", "2", "-tp=4"]),
                "inspect",
                "-tp",
                "--tensor-parallel"
            ),
            v(&[
                "fathom",
                "inspect",
                "m",
                "--tensor-parallel",
                "2",
                "--tensor-parallel=4"
            ])
        );
        assert_eq!(
            rewrite_short(
                v(&["fathom", "serve", "-tp", "2"]),
                "inspect",
                "-tp",
                "--tensor-parallel"
            ),
            v(&["fathom", "serve", "-tp", "2"])
        );
        // -t with a value stays threads.
        assert_eq!(
            rewrite_short(
                v(&["fathom", "inspect", "-t", "2"]),
                "inspect",
                "-tp",
                "--tensor-parallel"
            ),
            v(&["fathom", "inspect", "-t", "2"])
        );
    }
}
