//! Which model a repository's files make up. One rule for a local directory
//! and for a hub listing, so `fathom pull` fetches what a later lookup
//! picks.

use crate::id::ends_with_ignore_case;

pub(crate) const CONFIG: &str = "config.json";

/// What a set of file names holds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pick<'a> {
    /// `config.json` with safetensors: the directory is the checkpoint.
    Checkpoint,
    Gguf(&'a str),
    /// Several GGUF files qualify; the user must narrow with `:QUANT`.
    Several(Vec<&'a str>),
    /// Nothing usable, and why.
    Nothing(String),
}

/// A QUANT asks for a GGUF even where safetensors sit beside them; without
/// one a checkpoint directory wins. Multimodal projector files (`mmproj*`)
/// are never the model.
pub(crate) fn pick<'a>(names: &[&'a str], quant: Option<&str>) -> Pick<'a> {
    if quant.is_none() && is_checkpoint(names) {
        return Pick::Checkpoint;
    }
    let mut ggufs: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| ends_with_ignore_case(n, ".gguf") && !is_mmproj(n))
        .collect();
    ggufs.sort_unstable();
    let Some(quant) = quant else {
        return match ggufs.as_slice() {
            [] => Pick::Nothing("no config.json with .safetensors files and no .gguf file".into()),
            [one] => Pick::Gguf(one),
            _ => Pick::Several(ggufs),
        };
    };
    if ggufs.is_empty() {
        return Pick::Nothing(format!("no .gguf file to match :{quant}"));
    }
    let wanted = quant.to_ascii_lowercase();
    let matching: Vec<&str> = ggufs
        .iter()
        .copied()
        .filter(|n| n.to_ascii_lowercase().contains(&wanted))
        .collect();
    match matching.as_slice() {
        [] => Pick::Nothing(format!(
            "no .gguf file matches :{quant} (GGUF files: {})",
            ggufs.join(", ")
        )),
        [one] => Pick::Gguf(one),
        _ => Pick::Several(matching),
    }
}

pub(crate) fn is_checkpoint(names: &[&str]) -> bool {
    names.contains(&CONFIG) && names.iter().any(|n| n.ends_with(".safetensors"))
}

fn is_mmproj(name: &str) -> bool {
    name.as_bytes()
        .get(..6)
        .is_some_and(|p| p.eq_ignore_ascii_case(b"mmproj"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_needs_config_and_safetensors() {
        assert_eq!(
            pick(&["config.json", "model.safetensors"], None),
            Pick::Checkpoint
        );
        assert!(matches!(
            pick(&["config.json", "README.md"], None),
            Pick::Nothing(_)
        ));
        assert!(matches!(
            pick(&["model.safetensors"], None),
            Pick::Nothing(_)
        ));
    }

    #[test]
    fn a_single_gguf_is_picked_and_projectors_are_not_models() {
        let names = ["README.md", "mmproj-model-f16.gguf", "m-Q4_K_M.gguf"];
        assert_eq!(pick(&names, None), Pick::Gguf("m-Q4_K_M.gguf"));
        assert!(matches!(pick(&["MMPROJ.gguf"], None), Pick::Nothing(_)));
    }

    #[test]
    fn quant_matches_case_insensitively_and_beats_safetensors() {
        let names = [
            "config.json",
            "model.safetensors",
            "m-Q4_K_M.gguf",
            "m-Q8_0.GGUF",
        ];
        assert_eq!(pick(&names, Some("q8_0")), Pick::Gguf("m-Q8_0.GGUF"));
        assert_eq!(
            pick(&names[2..], None),
            Pick::Several(vec!["m-Q4_K_M.gguf", "m-Q8_0.GGUF"])
        );
        assert_eq!(
            pick(&names[2..], Some("q")),
            Pick::Several(vec!["m-Q4_K_M.gguf", "m-Q8_0.GGUF"])
        );
        let Pick::Nothing(why) = pick(&names, Some("Q2_K")) else {
            panic!("Q2_K matched");
        };
        assert!(why.contains("m-Q4_K_M.gguf, m-Q8_0.GGUF"), "{why}");
        let Pick::Nothing(why) = pick(&names[..2], Some("Q2_K")) else {
            panic!("Q2_K matched");
        };
        assert!(why.contains("no .gguf file"), "{why}");
    }
}
